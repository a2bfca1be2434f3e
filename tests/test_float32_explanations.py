"""A float32 failure is explained from the kernel's float64 run (checks.explain): the wrong
tensor it read is named as in float64.  Before, three things kept those names from float32
checks: the hand's cached fields were the float32 run's, 1e-8 away from the float64 gradient
being fitted at float64's tolerance; one candidate column of absurd norm (a derivative dividing
by a cotangent that rounding left at 1e-17 instead of 0) silenced every other; and a field
equal to a program value up to float64 rounding was a second candidate beside it."""
import numpy as np
import pytest

import kernels
from checks.registry import BY_NAME, run_row
from checks.substitution import cached_arrays


def _softmax_reads_y_for_dy(dy, cache):
    y = cache.y
    return y * (y - np.sum(dy * y, axis=-1, keepdims=True)), {}  # dy - <dy, y> with y for dy


def _layernorm_returns_xhat(dy, cache):
    _, grads = kernels.layernorm_backward(dy, cache)
    return cache[0].copy(), grads  # dx is the cached xhat


# seeds 2 and 7 in float32 were among those left unexplained (the absurd column); slow tier
# (two seconds each, beside make test's 60 s budget)
SLOW = pytest.mark.slow


@pytest.mark.parametrize("dtype,seed", [pytest.param("float64", 2, marks=SLOW),
                                        pytest.param("float32", 2, marks=SLOW),
                                        pytest.param("float32", 7, marks=SLOW)])
def test_a_softmax_reading_its_output_for_the_upstream_gradient_is_named_in_both_formats(
        dtype, seed):
    report = run_row(BY_NAME["softmax"], np.dtype(dtype), seed=seed,
                     backward=_softmax_reads_y_for_dy)
    (bad,) = [t for t in report.tensors if not t.ok]
    assert "reads the forward value `jax.nn.softmax(x, axis=-1)`" in bad.diagnosis, bad.diagnosis
    assert "in place of the upstream gradient" in bad.diagnosis


@pytest.mark.parametrize("dtype", [pytest.param("float64", marks=SLOW), "float32"])
def test_a_layer_norm_returning_its_cached_xhat_is_named_in_both_formats(dtype):
    report = run_row(BY_NAME["layernorm"], np.dtype(dtype), seed=1,
                     backward=_layernorm_returns_xhat)
    (bad,) = [t for t in report.tensors if not t.ok]
    assert "is the hand's cached `xhat`" in bad.diagnosis, bad.diagnosis


def test_the_cached_fields_are_read_as_float64():
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    params = {"g": np.ones(4, np.float32), "b": np.zeros(4, np.float32)}
    _, cache = kernels.layernorm_forward(x, params)
    assert all(a.dtype == np.float64 for _, a in cached_arrays(cache))
