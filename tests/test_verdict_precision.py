"""Verdicts at the edges of precision: a small uniform error in a large float32 tensor fails, a
float32-rounded float64 forward does not excuse a float64 backward error, a kernel that promotes
float32 to float64 is named and still judged, and a kernel computing in float32 inside a float64
check is recognised from its error level, not failed."""
import numpy as np
import pytest

import kernels
import reference
from checks import check_layer
from checks.verdict import Finding, Kind


def _linear_case(dtype, shape=(2, 3, 4), n_out=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    params = {"W": (rng.standard_normal((shape[-1], n_out)) / np.sqrt(shape[-1])).astype(dtype),
              "b": rng.standard_normal(n_out).astype(dtype)}
    return x, params


def _check(forward, backward, x, params):
    return check_layer(forward, backward, reference.linear, [x], params, name="linear",
                       input_names=("x",))


def _scaled(key, factor):
    """kernels.linear_backward with one parameter gradient multiplied by factor."""
    def backward(dy, cache):
        dx, grads = kernels.linear_backward(dy, cache)
        return dx, {**grads, key: grads[key] * grads[key].dtype.type(factor)}
    return backward


@pytest.mark.slow  # a check at the bench's large size
def test_a_uniform_0p3_percent_error_in_a_large_float32_weight_gradient_fails():
    """x (16, 64, 256), W (256, 512): dW 0.3 % too large everywhere.  float32 rounding of a sum
    of 1024 terms is ~sqrt(log2 1024) u |terms| ~ 2e-7 relative: a 3e-3 error is 10^4 times
    that, so the tolerance must not grow with the tensor's size to swallow it."""
    x, params = _linear_case(np.float32, (16, 64, 256), 512)
    # (the correct kernel at this size and larger: `python -m checks calibrate`, "large (bench)")
    bad = _check(kernels.linear_forward, _scaled("W", 1.003), x, params)
    assert bad.failing == ["W"], str(bad)
    assert next(t for t in bad.tensors if t.name == "W").verdict.kind is Kind.HAND_WRONG


def _forward_in_float32(x, p):
    """float64 in and out, float32 inside: its outputs are float32 numbers."""
    y, cache = kernels.linear_forward(x.astype(np.float32),
                                      {k: v.astype(np.float32) for k, v in p.items()})
    return y.astype(np.float64), cache._replace(x=x, W=p["W"])


def test_a_float32_rounded_float64_forward_does_not_excuse_a_float64_backward_error():
    """The forward's float32 rounding is a finding for the forward; the float64 backward is
    still judged at float64's roundoff, where db off by 1e-6 relative is 1e9 u."""
    x, params = _linear_case(np.float64)
    good = _check(_forward_in_float32, kernels.linear_backward, x, params)
    assert good.ok, str(good)
    assert Finding.LOW_PRECISION_FORWARD in {n.finding for n in good.notes}
    bad = _check(_forward_in_float32, _scaled("b", 1 + 1e-6), x, params)
    assert bad.failing == ["b"], str(bad)


def _promoting(forward, backward):
    """A float32 kernel that multiplies by a NumPy float64 scalar: float64 comes out."""
    c = np.float64(1.0)
    return (lambda x, p: (lambda y, cache: (c * y, cache))(*forward(x, p)),
            lambda dy, cache: (lambda dx, g: (c * dx, {k: c * v for k, v in g.items()}))(
                *backward(dy, cache)))


def test_a_promoting_float32_kernel_gets_the_finding_and_its_gradients_are_judged():
    x, params = _linear_case(np.float32)
    forward, backward = _promoting(kernels.linear_forward, kernels.linear_backward)
    good = _check(forward, backward, x, params)
    assert good.ok, str(good)
    assert Finding.PROMOTES in {n.finding for n in good.notes}
    assert "promotes float32 to float64" in str(good)
    forward, backward = _promoting(kernels.linear_forward, _scaled("W", 2.0))
    bad = _check(forward, backward, x, params)
    assert bad.failing == ["W"], str(bad)
    assert "scaled by a constant" in next(t for t in bad.tensors if t.name == "W").diagnosis


def test_float32_inside_with_a_float64_term_at_the_end_is_recognised_not_failed():
    """Outputs that are not float32 numbers (a float64 bias added last) but whose error is
    float32's: recognised from the error level, judged at float32 for the forward."""
    def forward(x, p):
        y, cache = kernels.linear_forward(x.astype(np.float32),
                                          {"W": p["W"].astype(np.float32),
                                           "b": np.zeros_like(p["b"], np.float32)})
        return y.astype(np.float64) + p["b"], cache._replace(x=x, W=p["W"])
    x, params = _linear_case(np.float64, (4, 8, 16), 8)
    report = _check(forward, kernels.linear_backward, x, params)
    assert report.ok, str(report)
    assert Finding.LOW_PRECISION_FORWARD in {n.finding for n in report.notes}


# --- half precision ------------------------------------------------------------------------

def _accumulating_in(fmt):
    """kernels.linear_backward for half-precision inputs, but with dW summed over the M rows in
    the half format itself (recursive summation: every partial sum rounded to fmt), the way a
    kernel without a float32 accumulator computes it; dx and db as the lab's kernel."""
    def backward(dy, cache):
        dx, grads = kernels.linear_backward(dy, cache)
        x2 = cache.x.astype(np.float32).reshape(-1, cache.W.shape[0])      # (M, N_in)
        dy2 = dy.astype(np.float32).reshape(-1, cache.W.shape[1])          # (M, N_out)
        terms = (x2[:, :, None] * dy2[:, None, :]).astype(fmt)             # (M, N_in, N_out)
        return dx, {**grads, "W": np.cumsum(terms, axis=0, dtype=fmt)[-1]}
    return backward


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_a_half_precision_kernel_is_judged_by_its_accumulation_policy(fmt):
    """x (4, 256, 16), W (16, 8) in fmt: dW sums M = 1024 products.  The lab's kernel (float32
    accumulation, one rounding) passes at about 0.2 of its tolerance; the same maths summed in
    fmt itself carries an error of order sqrt(M) u to M u of the terms (a sum in float16 also
    stalls once a partial sum's spacing exceeds the terms) and fails as "hand is wrong"."""
    x, params = _linear_case(np.dtype(fmt), (4, 256, 16), 8)
    good = _check(kernels.linear_forward, kernels.linear_backward, x, params)
    assert good.ok, str(good)
    assert max(t.score for t in good.tensors) < 0.5
    bad = _check(kernels.linear_forward, _accumulating_in(np.dtype(fmt)), x, params)
    assert bad.failing == ["W"], str(bad)
    assert next(t for t in bad.tensors if t.name == "W").verdict.kind is Kind.HAND_WRONG


@pytest.mark.parametrize("fmt,factor", [("float16", 1.02), ("bfloat16", 1.1)])
def test_a_small_error_in_a_half_precision_gradient_fails(fmt, factor):
    """db 2 % too large in float16 (40 u) and 10 % in bfloat16 (26 u): above the one rounding
    the tolerance allows (4 u), so both fail, and the diagnosis names the scale."""
    x, params = _linear_case(np.dtype(fmt), (2, 8, 16), 8)
    bad = _check(kernels.linear_forward, _scaled("b", factor), x, params)
    assert bad.failing == ["b"], str(bad)


@pytest.mark.slow  # the whole model in bfloat16, about a minute a check
@pytest.mark.parametrize("seed,sizes", [(2, None), (10, {"B": 1}), (5, {"T": 1})])
def test_the_model_in_bfloat16_passes_with_no_input_placed_away_from_kinks(seed, sizes):
    """bfloat16 cases that once raised false alarms (a rounding moved a pre-activation across
    leaky ReLU's kink), with the lab's initialisation and no bias placement: the checker finds
    the elements at a kink itself and judges either branch right there."""
    from checks.registry import BY_NAME, run_row
    report = run_row(BY_NAME["model"], np.dtype("bfloat16"), seed=seed, sizes=sizes)
    assert report.ok, str(report)
