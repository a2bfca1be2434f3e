"""The example output in README.md and the guides is what the checker prints today, on any
machine: each example (``checks.examples``) is recomputed and compared with its page by what is
meaningful in it (``checks.doc_bands``: verdicts and structure exactly, rounding noise within
its band), never digit for digit.  ``make docs`` rewrites the examples."""
import stat

import pytest

from checks import docs
from checks.doc_bands import differences, parse_table, same_magnitude
from checks.examples import EXAMPLES


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e.path.name}:{e.name}")
def test_documented_example_holds_today(example):
    problems = differences(example.kind, docs.section(example.path, example.name),
                           example.make())
    assert not problems, (f"{example.path.name} '{example.name}' no longer holds "
                          f"(rewrite it with `make docs`):\n" + "\n".join(problems))


TABLE = """```
layer       dtype    tensor   shape  hand-autodiff  hand-FD  autodiff-FD  err/tol  verdict
----------  -------  -------  -----  -------------  -------  -----------  -------  -------
mha-causal  float32  forward         6.7e-08                              0.04     ok
mha-causal  float32  x        2x5x8  1.1e-07        1.1e-07  1.1e-10      0.03     ok
```"""


def test_rounding_noise_moves_within_its_band_and_a_verdict_does_not():
    moved = TABLE.replace("1.1e-07        1.1e-07", "1.4e-07        1.4e-07").replace(
        "0.03 ", "0.05 ")
    assert differences("table", TABLE, moved) == []
    assert differences("table", TABLE, TABLE.replace("1.1e-07        1.1e-07",
                                                     "3.0e-06        3.0e-06"))
    failed = TABLE.replace("0.03     ok", "3.10     FAIL: hand is wrong")
    assert any("verdict" in p for p in differences("table", TABLE, failed))
    assert differences("table", TABLE, TABLE.replace("2x5x8", "2x5x9"))
    names, rows = parse_table(TABLE.strip("`\n").splitlines())
    assert rows[0]["shape"] == "" and rows[1]["shape"] == "2x5x8" and names[-1] == "verdict"


FAILURE = ("mha.WK [float64]  FAIL  hand vs autodiff 1.6e+00, 2.11e+14x its tolerance (FD agrees "
           "with autodiff) — looks like dWK and dWQ are swapped; worst at head 0, row 4, col 4")


def test_a_failure_line_keeps_its_bug_size_and_words_but_not_its_worst_index():
    assert differences("failure", FAILURE, FAILURE.replace("2.11e+14", "9.3e+13")
                       .replace("row 4, col 4", "row 1, col 7")) == []
    assert differences("failure", FAILURE, FAILURE.replace("1.6e+00", "1.7e+00")) == []
    assert differences("failure", FAILURE, FAILURE.replace("1.6e+00", "1.9e+00"))
    assert differences("failure", FAILURE, FAILURE.replace("swapped", "transposed"))
    assert differences("failure", FAILURE, FAILURE.replace("head 0, row", "batch 0, row"))
    assert differences("failure", FAILURE, FAILURE.replace("2.11e+14x", "0.5x"))


BIASED = ("linear.W [float32]  FAIL  hand vs autodiff 1.9e-06, within its element tolerance "
          "(0.944x) but biased along autodiff's gradient 7.99x the aggregate test's band (FD "
          "agrees with autodiff); worst at row 7, col 13")


def test_an_aggregate_failure_line_keeps_its_ratios_on_their_sides_of_1():
    assert differences("failure", BIASED, BIASED.replace("0.944x", "0.61x")
                       .replace("7.99x", "5.2x")) == []
    assert differences("failure", BIASED, BIASED.replace("0.944x", "1.2x"))
    assert differences("failure", BIASED, BIASED.replace("7.99x", "0.9x"))
    assert differences("failure", BIASED, BIASED.replace("7.99x", "120x"))


def test_noise_is_floored_at_unit_roundoff():
    assert same_magnitude(0.0, 1.5e-16, floor=2 ** -53)
    assert not same_magnitude(0.0, 1e-14, floor=2 ** -53)


def test_a_rewritten_section_keeps_the_files_mode(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- begin: t -->\nold\n<!-- end: t -->\n")
    page.chmod(0o664)
    docs.write_section(page, "t", "new")
    assert docs.section(page, "t") == "new"
    assert stat.S_IMODE(page.stat().st_mode) == 0o664                       # not mkstemp's 0600
