"""half_precision at a tiny size: the exact thresholds of the formats (the running sum's stall,
exp's overflow, Adam's eps), the float16 zeros predicted by the float32 gradients, the lab's
kernel rounded once, and headlines that can fail."""
import dataclasses
import math

import numpy as np
import pytest

from experiments import common, half_precision as study
from kernels.precision import BFLOAT16, FLOAT16

TINY = study.Config(lengths=(16, 256, 4096), trials=4, ones=4096, batch=4, tokens=4,
                    exponents=(-14, -6, -4, 0), weight=-6, small_weight=-14, loss_scale=10, seed=3)

pytestmark = pytest.mark.usefixtures("study_sandbox")


@pytest.mark.parametrize("dtype, stall", [(FLOAT16, 2048), (BFLOAT16, 256)])
def test_a_running_sum_of_ones_stalls_at_one_over_u(dtype, stall):
    partial, measured = study.running_ones(3 * stall, dtype)
    assert measured == stall == 1 / study.unit_roundoff(dtype)
    assert partial[stall - 2] == stall - 1 and np.all(partial[stall - 1:] == stall)   # exact up to it
    # what NumPy does: float16 np.sum adds pairwise in float32 (no stall); ml_dtypes' bfloat16 sum
    # rounds every partial sum, as cumsum does in both formats
    assert np.ones(3 * stall, dtype).sum() == (3 * stall if dtype == FLOAT16 else stall)


@pytest.mark.parametrize("dtype, threshold", [(FLOAT16, 11.09375), (BFLOAT16, 89.0)])
def test_naive_softmax_overflows_exactly_at_the_predicted_logit(dtype, threshold):
    assert study.exp_overflow_threshold(dtype) == threshold
    below = float(study.format_grid(dtype, 0.0, threshold)[-2])            # the value before it
    assert below < math.log(float(np.finfo(dtype).max)) + 1e-3 and below < threshold
    rows = np.array([[below, 0.0], [threshold, 0.0]], dtype)
    naive = study.naive_softmax(rows).astype(np.float64)
    assert np.isfinite(naive[0]).all() and not np.isfinite(naive[1]).all()
    s = study.softmax_overflow(dtype, width=4)
    first, step = study.exact_threshold(s["x"], s["naive"])
    assert (first, step) == (threshold, True) and not s["lab"].any() and s["lab_error"] < 4 * study.U[str(np.dtype(dtype))]


def test_adams_eps_vanishes_in_float16_and_the_update_is_not_finite():
    assert np.float16(study.EPS) == 0 and float(np.asarray(study.EPS, BFLOAT16)) == pytest.approx(1e-8, rel=2 ** -8)
    g = np.array([0.0, 1e-4, 5e-3, 6e-3, 0.1])
    f16 = study.adam_first_step(g, FLOAT16)
    assert math.isnan(f16[0]) and np.isinf(f16[1:3]).all() and np.isfinite(f16[3:]).all()
    for dtype in (BFLOAT16, np.float32):                                    # eps > 0, v > 0: finite
        step = study.adam_first_step(g, dtype)
        assert np.isfinite(step).all() and step[0] == 0
    g_star, rel = study.adam_threshold()
    assert g_star == pytest.approx(5.46e-3, rel=1e-3) and rel < 2e-3


def test_float16_zeros_follow_the_float32_gradients_until_per_position_gradients_underflow():
    m = {"grads": study.gradients(dataclasses.replace(TINY, batch=64, tokens=16))}  # 1088 positions
    (z16, se16), (z32, se32) = study.underflow_fractions(m, TINY.weight)
    diff, diff_se, b, c = study.paired_zeros(m, TINY.weight)     # the same elements: McNemar
    assert diff == pytest.approx(z16 - z32) and abs(diff) <= 3 * diff_se, (diff, diff_se, b, c)
    assert diff_se < math.hypot(se16, se32)        # pairing removes the shared binomial noise
    (s16, _), (s32, _) = study.underflow_fractions(m, TINY.small_weight)
    assert s16 > s32 + 0.1                                                 # chains go to zero first
    (l16, l16_se), (l32, l32_se) = study.underflow_fractions(m, TINY.small_weight, TINY.loss_scale)
    diff, diff_se, _, _ = study.paired_zeros(m, TINY.small_weight, TINY.loss_scale)
    assert l16 < s16 / 10 and abs(diff) <= 3 * diff_se                      # loss scale recovers
    assert np.all(np.abs(m["grads"]["g32"]) > 0)                           # float32 has no zeros here


def test_the_lab_kernel_rounds_once_and_the_half_sum_does_not():
    rng = np.random.default_rng(0)
    r = study.reduction_errors(TINY, rng, FLOAT16)                          # (lengths, trials) each
    u = study.U["float16"]
    assert r["lab"].max() <= u * (1 + 1e-3)                                 # one rounding, any n
    assert r["half"][-1].mean() > 50 * u                                    # n = 4096 > 1/u: stagnation
    x = np.full((1, 4096), 1.0, FLOAT16)
    assert study.half_dot(x, x)[0] == 2048 and study.lab_dot(x, x)[0] == 4096


def test_run_headlines_are_stated_tests_and_a_wrong_prediction_fails():
    result = study.run(TINY)
    assert (common.RESULTS / study.NAME / "data.csv").exists()
    for h in result.headlines:
        assert h.rule and h.source and h.kind in common.KINDS
        assert h.agrees is not False, h.sentence()
    exact = [h for h in result.headlines if h.rule.startswith("exact")]
    assert len(exact) >= 6
    assert not common.exact("stall", 2048, 2047, "wrong on purpose").agrees
    (z16, se16), _ = study.underflow_fractions({"grads": study.gradients(TINY)}, TINY.weight)
    assert not common.test("zeros", z16, se16, z16 + 10 * se16 + 0.05, "wrong on purpose").agrees


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match=r"^trials: expected an integer in \[2, inf\], got 1"):
        study.Config(trials=1)
    with pytest.raises(ValueError, match=r"^weight: expected one of exponents"):
        study.Config(weight=-7)
    with pytest.raises(ValueError, match=r"^loss_scale: expected small_weight \+ loss_scale in exponents"):
        study.Config(loss_scale=3)
