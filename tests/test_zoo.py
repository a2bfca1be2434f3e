"""The bug zoo: every classic bug is caught, and the diagnosis names its pattern."""
import numpy as np
import pytest

from checks.registry import run_row
from checks.verdict import Kind
from checks.zoo import BLOCK, BUGS, format_zoo, run_bug


# bugs whose diagnosis searches the oracle's paths or flips its static arguments take seconds
# each: the slow tier (make test-all, CI)
SEARCHED = {"self-attention dx misses the key/value path", "attention weights not transposed in dV",
            "causal mask ignored in backward", "layer-norm missing the term through the mean",
            "missing 1/sqrt(P) in backward",
            # and the composite block's bug: its oracle compiles for seconds
            "residual gradient dropped"}
BUG_PARAMS = [pytest.param(b, id=b.name.replace(" ", "-"),
                           marks=[pytest.mark.slow] if b.name in SEARCHED else [])
              for b in BUGS]


@pytest.mark.parametrize("bug", BUG_PARAMS)
def test_bug_is_caught_and_diagnosed(bug):
    result = run_bug(bug)
    assert result.caught, "\n" + str(result.report)
    assert bug.tensor in result.failing, result.failing
    assert result.named, f"expected '{bug.pattern}', got '{result.diagnosis}'"
    verdict = next(t.verdict for t in result.report.tensors if t.name == bug.tensor)
    # a broken hand backward is blamed on the hand, never on the oracle or the FD
    assert verdict.kind in (Kind.HAND_WRONG, Kind.MISSHAPEN), verdict


def test_zoo_covers_the_common_bug_shapes():
    assert len(BUGS) >= 15
    patterns = " ".join(b.pattern for b in BUGS)
    for shape in ("identically zero", "wrong sign", "scaled by a constant", "transposed",
                  "swapped", "wrong only where the mask", "repeated ids", "missing a sum"):
        assert shape in patterns, shape


def test_zoo_float32_names_the_patterns_too():
    for bug in [b for b in BUGS if b.row.name in ("cross_entropy", "dropout", "embedding")]:
        result = run_bug(bug, np.float32)
        assert result.caught and result.named, (bug.name, result.diagnosis)


@pytest.mark.slow  # the composite block's oracle (attention, norm, feed-forward) in two dtypes
def test_zoo_composite_block_is_correct_with_its_own_backward():
    assert run_row(BLOCK, np.float64, seed=3).ok and run_row(BLOCK, np.float32, seed=3).ok


def test_zoo_table_lists_each_bug():
    results = [run_bug(b) for b in BUGS[-3:]]
    text = format_zoo(results)
    assert all(b.name in text for b in BUGS[-3:]) and "3 of 3 bugs caught" in text
