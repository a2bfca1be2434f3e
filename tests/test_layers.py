"""Every registry row x dtype x backend: forward against the oracle, every gradient tensor
against autodiff and finite differences, all with a random upstream gradient."""
import numpy as np
import pytest

from checks.registry import ROWS, run_row

DTYPES = [np.float64, np.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_layer_gradients(row, dtype, xp):
    report = run_row(row, dtype, seed=1, xp=xp)
    assert report.ok, "\n" + str(report)
    # every differentiable tensor was compared, in the requested dtype
    assert report.dtype == np.dtype(dtype).name
    _, params, _ = row.case(np.random.default_rng(0), dtype)
    assert {t.name for t in report.tensors} >= set(params)
    assert all(t.hand_vs_autodiff <= t.tol for t in report.tensors)


def test_float64_hand_matches_autodiff_to_1e10():
    """The issue's bar: in float64 every layer's hand gradient is within ~1e-10 of autodiff."""
    for row in ROWS:
        report = run_row(row, np.float64, seed=2)
        worst = max(t.hand_vs_autodiff for t in report.tensors)
        assert worst < 1e-10, f"{row.name}: {worst:.1e}"
