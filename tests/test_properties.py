"""Property-based: every registered kernel agrees with its oracle (forward and every gradient,
through the full three-legged check) at random valid shapes, for every row x dtype: a row added
to the registry is reached without touching this file."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checks.calibrate import _beyond_60
from checks.registry import BY_NAME, ROWS, run_row
from kernels.activations import SAFE_LOGIT


def _width(s, min_d):
    """D = H P with P even (positional encoding), P raised until D reaches the row's minimum."""
    P = max(s["P"], 2 * -(-min_d // (2 * s["H"])))
    return {**s, "P": P, "D": s["H"] * P}


def sizes_for(row):
    """Valid sizes inside the row's declared domain (``Row.min_sizes``; e.g. LayerNorm needs
    D >= 4, docs/tolerances.md)."""
    low = lambda k, v: max(v, row.min_sizes.get(k, v))
    return st.fixed_dictionaries({
        "B": st.integers(low("B", 1), 3), "T": st.integers(low("T", 1), 6),
        "S": st.integers(low("S", 1), 5), "H": st.integers(low("H", 1), 3),
        "P": st.sampled_from([2, 4]), "F": st.integers(low("F", 1), 10),
        "V": st.integers(low("V", 2), 7),
    }).map(lambda s: _width(s, row.min_sizes.get("D", 0)))


# The whole model has its own tests (tests/test_model.py); each new shape recompiles its oracle.
# The attention rows' oracles and rounding models take 1-4 s to compile at a new shape (QK-norm
# the most; the other dtypes then reuse the program): their random shapes run in the slow tier
# (make test-slow, CI), their registry cases stay in the fast tier (tests/test_layers.py, every
# dtype), and every other row's random shapes run in both.
SLOW_AT_NEW_SHAPES = {"qknorm-mhca", "mha", "mha-causal", "mhca"}
LAYERS = [pytest.param(row, id=row.name,
                       marks=[pytest.mark.slow] if row.name in SLOW_AT_NEW_SHAPES else [])
          for row in ROWS if row.name != "model"]


FORMATS = [np.float64, np.float32, np.float16, np.dtype("bfloat16")]


@pytest.mark.parametrize("dtype", FORMATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("row", LAYERS)
def test_random_shapes_agree_with_oracle(row, dtype):
    # derandomize: the same drawn examples every run, so CI fails on a regression, not by chance
    # one example per row x dtype: every dtype draws the same sizes (one compiled oracle)
    @settings(max_examples=1, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(s=sizes_for(row), seed=st.integers(0, 2**31 - 1))
    def check(s, seed):
        assert all(s[k] >= v for k, v in row.min_sizes.items())
        report = run_row(row, dtype, seed=seed, sizes=s)
        assert report.ok, f"{row.name} at {s}:\n{report}"
    check()


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: np.dtype(d).name)
def test_softmax_large_logit_branch(dtype):
    """Logits beyond SAFE_LOGIT take the per-row max shift: checked like the other branch, and a
    backward that ignores the probabilities' shift-invariance would still be caught there."""
    report = run_row(BY_NAME["softmax"], dtype, seed=3, transform=_beyond_60)
    assert report.ok, str(report)
    x, _, _ = BY_NAME["softmax"].case(np.random.default_rng(3), dtype)
    shifted = _beyond_60(np.random.default_rng(3), x, {})[0][0]
    assert np.all(np.abs(shifted.astype(np.float64)).max(axis=-1) >= SAFE_LOGIT)  # every row
    # a broken backward on the same branch: the outer-product term dropped
    bad = run_row(BY_NAME["softmax"], dtype, seed=3, transform=_beyond_60,
                  backward=lambda dy, cache: (cache.y * dy, {}))
    assert bad.failing == ["x"], str(bad)


def test_same_seed_same_report():
    """The checker is deterministic: the same seed gives bit-identical numbers."""
    rows = [BY_NAME["mha-causal"], BY_NAME["embedding"]]
    first = [run_row(row, np.float32, seed=7).to_dict() for row in rows]
    state = np.random.get_state()[1].copy()
    second = [run_row(row, np.float32, seed=7).to_dict() for row in rows]
    assert first == second
    assert np.array_equal(np.random.get_state()[1], state)  # the global RNG was not touched
