"""Every registry row x dtype x backend: forward against the oracle, every gradient tensor
against autodiff and finite differences, all with a random upstream gradient; then the same
check's sensitivity: relative errors injected into the correct gradients must be caught at the
goals of ``checks.sensitivity`` (float64 1e-8 for a whole tensor, a slice or an element;
float32 3e-6 for a whole tensor and 2e-5 for a slice; float16 1e-2 and bfloat16 5e-2 per
layer)."""
import numpy as np
import pytest

from checks.registry import ROWS, layer_check
from checks.sensitivity import KNOWN_GAPS as GAPS, measure

DTYPES = [np.float64, np.float32, np.float16, np.dtype("bfloat16")]


# Known gap, measured, not hidden: since the inputs are the lab's initialisation (nothing placed away
# from leaky ReLU's kink), the whole model at the registry's tiny widths (D 6, F 8) in half
# precision has pre-activations within rounding of the kink; the checker widens those elements'
# tolerances by the move a branch flip makes (checks/rounding.py), and a whole-tensor error is then
# not caught even at a factor of 2 in either format (goals 0.1 in float16, 1 in bfloat16).  The
# verdicts stay right; the sensitivity goal is missed.  The test still runs
# every other assertion and is reported as xfailed while the gap lasts (docs/half-precision.md).
# The gaps, with the float32 ones of the aggregate test's goals, are named in one place:
# checks.sensitivity.KNOWN_GAPS.
KNOWN_GAPS = {(layer, dtype, pattern) for layer, dtype, sizes, pattern in GAPS
              if sizes == "registry"}

# the whole model compiles its oracle and rounding model in seconds: the slow tier (make test-all)
ROW_PARAMS = [pytest.param(row, id=row.name,
                           marks=[pytest.mark.slow] if row.name == "model" else [])
              for row in ROWS]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("row", ROW_PARAMS)
def test_layer_gradients(row, dtype, xp):
    if xp is not np and np.dtype(dtype).name == "bfloat16":
        pytest.skip("CuPy has no bfloat16")
    check = layer_check(row, dtype, seed=1, xp=xp)
    report = check.run()
    assert report.ok, "\n" + str(report)
    # every differentiable tensor was compared, in the requested dtype
    assert report.dtype == np.dtype(dtype).name
    _, params, _ = row.case(np.random.default_rng(0), dtype)
    assert {t.name for t in report.tensors} >= set(params)
    assert all(t.hand_vs_autodiff <= t.tol for t in report.tensors)
    if np.dtype(dtype) == np.float64:  # the foundation's bar: float64 hand within ~1e-10 of autodiff
        assert max(t.hand_vs_autodiff for t in report.tensors) < 1e-10
    gaps = []
    for s in measure(check):
        assert s.eps > 0  # something was injected and measured
        if (row.name, s.dtype, s.pattern) in KNOWN_GAPS and s.met is False:
            gaps.append(f"{s.pattern}: {s.eps:.1e} caught at {s.where}, goal {s.goal}")
            continue
        assert s.met is not False, f"{s.pattern}: {s.eps:.1e} caught at {s.where}, goal {s.goal}"
    if gaps:
        pytest.xfail("known sensitivity gap (checks.sensitivity.KNOWN_GAPS, or the unplaced "
                     "half-precision model): "
                     + "; ".join(gaps))
