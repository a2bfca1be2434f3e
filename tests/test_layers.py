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


# Known gaps, measured, not hidden: the goals the checker misses are named in one place,
# checks.sensitivity.KNOWN_GAPS (the whole model's float32 whole-tensor goal at the
# registry's size); a row with a named gap still runs every other assertion and is reported as
# xfailed while the gap lasts.
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
        pytest.xfail("known sensitivity gap (checks.sensitivity.KNOWN_GAPS): " + "; ".join(gaps))


@pytest.mark.slow  # the whole model's oracle and rounding model compiled
def test_the_models_float32_gap_is_its_own_spread_not_a_floor():
    """The known float32 gap of the whole model (``KNOWN_GAPS``, the docs' table at seed 0) is
    the composition's own rounding spread: at seed 0 the band of enc1.attn.WQ's whole-tensor
    bias is BIAS_LAMBDA model spreads of that bias (the model's projections, every part at
    float32's roundoff) plus floors of a few u, and the spreads' term alone is over the 3e-6
    goal; the floors are not what keeps the goal out of reach.  (At the suite's seed 1 the same
    goal is met: the gap is one draw's, not every draw's.)"""
    from checks.registry import BY_NAME
    from checks.sensitivity import GOALS
    check = layer_check(BY_NAME["model"], np.float32, seed=0)
    assert check.run().ok
    name, u = "enc1.attn.WQ", float(np.finfo(np.float32).eps) / 2
    g = np.asarray(check.judges[name].g_auto, np.float64)
    bias = check.spread_params[name].bias
    # every part at float32's roundoff, as the check takes them (what a layer returns: nothing)
    sigma = float(bias.at(u, u, u, format=u)[0]) / float(np.sum(g * g))
    band = float(check.judges[name].bands.band[0])
    spread_term = check.policy.BIAS_LAMBDA * sigma
    goal = GOALS[("float32", "tensor")]
    assert spread_term > goal, (spread_term, goal)
    # the rest of the band is the floors: the constants' 2 u and the final rounding's u
    assert band - spread_term < 4 * u + 1e-12, (band, spread_term)
