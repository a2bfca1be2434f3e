"""docs/errors.md is executable: each documented rejection raises exactly the message shown."""
import doctest
import pathlib


def test_errors_doc_examples_hold():
    path = pathlib.Path(__file__).parents[1] / "docs" / "errors.md"
    result = doctest.testfile(str(path), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 25
    assert result.failed == 0
