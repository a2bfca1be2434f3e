"""Findings never excuse a bug: a precision finding needs a precision change's signature across
the tensor, a bug-shaped gradient error fails under any finding, and assert_layer fails on a
finding the test does not allow by name."""
import numpy as np
import pytest

import kernels
import reference
from checks import assert_layer, check_layer
from checks.signature import in_format, moved, precision_change, smooth
from checks.wild import article_cross_entropy, article_cross_entropy_backward
from checks.verdict import Finding, Kind


def _case(shape=(2, 3, 8), n_out=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    return x, {"W": rng.standard_normal((shape[-1], n_out)) / np.sqrt(shape[-1]),
               "b": rng.standard_normal(n_out)}


def _findings(report):
    return {n.finding for n in report.notes}


def _one_element_off(forward, rel=1e-8):
    def nudged(*args):
        y, cache = forward(*args)
        y = np.array(y)
        y.flat[0] *= 1 + rel
        return y, cache
    return nudged


def _scaled(backward, key, factor):
    def scaled(dy, cache):
        dx, grads = backward(dy, cache)
        return dx, {**grads, key: grads[key] * factor}
    return scaled


@pytest.mark.parametrize("layer,key", [("linear", "W"), ("layernorm", "g")])
def test_a_one_element_forward_discrepancy_raises_no_finding_and_excuses_no_gradient(layer, key):
    """float64: one output element off by 1e-8 relative is no float32 forward; the gradient
    scaled by 1 + 1e-7 (or 1e-6) beside it fails as the hand's (before: ok = True)."""
    x, params = _case()
    if layer == "layernorm":
        params = {"g": params["b"], "b": 0.1 * params["b"][::-1].copy()}
        x = x[..., :6].copy()
    forward, backward = getattr(kernels, f"{layer}_forward"), getattr(kernels, f"{layer}_backward")
    factor = 1 + (1e-7 if layer == "linear" else 1e-6)
    report = check_layer(_one_element_off(forward), _scaled(backward, key, factor),
                         getattr(reference, layer), [x], params, input_names=["x"])
    assert Finding.LOW_PRECISION_FORWARD not in _findings(report), str(report)
    assert not report.forward_ok and key in report.failing, str(report)
    bad = next(t for t in report.tensors if t.name == key)
    assert bad.verdict.kind is Kind.HAND_WRONG, str(report)


def test_iid_relative_noise_on_every_float64_gradient_is_no_lower_precision_backward():
    """1e-7 relative noise on every gradient element: errors everywhere, no pattern, within
    float32's tolerance, but the values are no float32 numbers: a bug, not a finding."""
    x, params = _case()
    rng = np.random.default_rng(1)
    noisy = lambda g: g * (1 + 1e-7 * rng.standard_normal(g.shape))

    def backward(dy, cache):
        dx, grads = kernels.linear_backward(dy, cache)
        return noisy(dx), {k: noisy(v) for k, v in grads.items()}
    report = check_layer(kernels.linear_forward, backward, reference.linear, [x], params,
                         input_names=["x"])
    assert Finding.LOW_PRECISION_BACKWARD not in _findings(report)
    assert set(report.failing) == {"x", "W", "b"}, str(report)


def test_a_float32_backward_returning_float64_is_still_recognised():
    x, params = _case()

    def backward32(dy, cache):
        c32 = cache._replace(x=cache.x.astype(np.float32), W=cache.W.astype(np.float32))
        dx, grads = kernels.linear_backward(dy.astype(np.float32), c32)
        return dx.astype(np.float64), {k: g.astype(np.float64) for k, g in grads.items()}
    report = check_layer(kernels.linear_forward, backward32, reference.linear, [x], params,
                         input_names=["x"])
    assert report.ok and Finding.LOW_PRECISION_BACKWARD in _findings(report), str(report)
    # ... and a scaled gradient beside it still fails: no finding excuses a bug's pattern
    bad = check_layer(kernels.linear_forward, _scaled(backward32, "W", 1 + 1e-6),
                      reference.linear, [x], params, input_names=["x"])
    assert "W" in bad.failing, str(bad)


def test_the_articles_float32_summing_cross_entropy_gets_a_finding_not_a_fail():
    rng = np.random.default_rng(2)
    logits, targets = 2 * rng.standard_normal((4, 16, 12)), rng.integers(0, 12, (4, 16))
    report = check_layer(article_cross_entropy, article_cross_entropy_backward,
                         reference.cross_entropy, [logits, targets], {},
                         input_names=["logits", "targets"])
    assert report.ok, str(report)
    assert Finding.LOW_PRECISION_FORWARD in _findings(report), str(report)


def test_assert_layer_fails_on_a_finding_unless_the_test_allows_it_by_name():
    rng = np.random.default_rng(2)
    logits, targets = 2 * rng.standard_normal((2, 8, 6)), rng.integers(0, 6, (2, 8))
    args = (article_cross_entropy, article_cross_entropy_backward, reference.cross_entropy,
            [logits, targets], {})
    with pytest.raises(AssertionError, match="LOW_PRECISION_FORWARD"):
        assert_layer(*args)
    report = assert_layer(*args, allow=["LOW_PRECISION_FORWARD"])
    assert report.ok


def test_a_smooth_float64_forward_error_is_no_lower_precision():
    """A softmax forward with a stray temperature x / (1 + 1e-7), all in float64: its error is
    float32-sized, spread over every element and no scaled copy, but a smooth function of the
    inputs, so it is no precision change (before: ok, excused as a float32 forward)."""
    x = 3 * np.random.default_rng(1).standard_normal((2, 5, 7))
    report = check_layer(lambda x, p: kernels.softmax_forward(x / (1 + 1e-7), p),
                         kernels.softmax_backward, reference.softmax, [x], {})
    assert Finding.LOW_PRECISION_FORWARD not in _findings(report), str(report)
    assert not report.ok and not report.forward_ok, str(report)
    # the same layer computing in float32 inside is still recognised
    def forward32(x, p):
        y, cache = kernels.softmax_forward(x.astype(np.float32), p)
        return y.astype(np.float64), cache
    report = check_layer(forward32, kernels.softmax_backward, reference.softmax, [x], {})
    assert Finding.LOW_PRECISION_FORWARD in _findings(report), str(report)
    assert report.forward_ok, str(report)


def test_rounding_noise_is_new_at_moved_inputs_and_a_bugs_error_is_not():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 8))
    y = moved([x], rng)[0]
    assert np.all(np.abs(y / x - 1) <= 2.0 ** -10) and not np.array_equal(x, y)
    exact = lambda v: np.tanh(v) * 2.0
    bug = lambda v: np.tanh(v * (1 + 1e-7)) * 2.0                     # a stray factor
    f32 = lambda v: (np.tanh(v.astype(np.float32)) * np.float32(2)).astype(np.float64)
    assert smooth(bug(x) - exact(x), bug(y) - exact(y))
    assert not smooth(f32(x) - exact(x), f32(y) - exact(y))
    few, few_moved = x[:1, :4], y[:1, :4]                             # too few elements to tell
    assert not smooth(bug(few) - exact(few), bug(few_moved) - exact(few_moved))


def test_the_signature_needs_most_elements_and_no_pattern():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((16, 8))
    tol = np.full(ref.shape, 1e-12)
    noise = 1e-9 * rng.standard_normal(ref.shape)
    assert precision_change(noise, ref, tol)
    one = np.zeros(ref.shape)
    one[3, 4] = 1e-9
    assert not precision_change(one, ref, tol)           # a single element
    assert not precision_change(1e-9 * ref, ref, tol)    # a scaled copy
    assert not precision_change(np.broadcast_to(1e-9 * rng.standard_normal(8), ref.shape),
                                ref, tol)                # an offset along the last axis
    assert in_format(ref.astype(np.float32), np.float32)
    assert not in_format(ref, np.float32)
