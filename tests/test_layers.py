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
    if np.dtype(dtype) == np.float64:  # the foundation's bar: float64 hand within ~1e-10 of autodiff
        assert max(t.hand_vs_autodiff for t in report.tensors) < 1e-10
