"""The README's example output is what the checker prints today: each block between
``<!-- begin: NAME -->`` and ``<!-- end: NAME -->`` is recomputed here and must match.
``UPDATE_README=1 pytest tests/test_readme_numbers.py`` writes the current output instead."""
import os
import pathlib
import stat

import numpy as np
import pytest

from checks import docs
from checks.registry import BY_NAME, run_row
from checks.report import failure_line, format_table
from checks.zoo import BUGS, run_bug

README = pathlib.Path(__file__).parents[1] / "README.md"


def table_example():
    """The head of `python -m checks --layer mha-causal --dtype float32` (seed 0)."""
    lines = format_table([run_row(BY_NAME["mha-causal"], np.float32, seed=0)]).splitlines()
    return "```\n" + "\n".join(lines[:5]) + "\n```"


def failure_example():
    """The failure line of the zoo's swapped dWQ / dWK (float64)."""
    bug = next(b for b in BUGS if b.name == "dQ and dK swapped")
    result = run_bug(bug)
    wk = next(t for t in result.report.tensors if t.name == "WK")
    return "```\n" + failure_line(result.report.layer, result.report.dtype, wk) + "\n```"


@pytest.mark.parametrize("name, make", [("table-example", table_example),
                                        ("failure-example", failure_example)])
def test_readme_block_is_the_current_output(name, make):
    text = make()
    if os.environ.get("UPDATE_README"):
        docs.write_section(README, name, text)
    assert docs.section(README, name) == text, f"README block '{name}' is stale; it is now:\n{text}"


def test_a_rewritten_section_keeps_the_files_mode(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- begin: t -->\nold\n<!-- end: t -->\n")
    page.chmod(0o664)
    docs.write_section(page, "t", "new")
    assert docs.section(page, "t") == "new"
    assert stat.S_IMODE(page.stat().st_mode) == 0o664                       # not mkstemp's 0600
