"""The README's example runs as written."""
import pathlib
import re

import pytest


def test_readme_check_layer_example_runs(capsys):
    text = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"## Check a pair of your own\s+```python\n(.*?)```", text, re.S).group(1)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["report"].ok
    assert "scale" in capsys.readouterr().out


@pytest.mark.slow  # compiles the stages of the example
def test_readme_bisection_example_runs(capsys):
    text = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"## Find the wrong stage of a composition.*?```python\n(.*?)```", text,
                      re.S).group(1)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    result = namespace["result"]
    assert result.culprit == "norm" and not result.ok
    # fed the oracle's upstream gradient, the right stage below the wrong one stays right
    assert [(name, r.ok) for name, r in result.screened] == [("norm", False), ("linear", True)]
    assert "missing the path through" in {t.name: t for t in result.report.tensors}["input0"].diagnosis
