"""A user's mistake in calling the checker gets one sentence naming what was expected and what
came, and is named as the mistake it is (not as an error deeper in the check)."""
import jax.numpy as jnp
import pytest

import kernels
import reference
from checks import check_layer
from test_check_layer import linear_case as _linear_case


def test_a_bare_array_for_inputs_says_a_list_is_expected():
    x, params = _linear_case()
    with pytest.raises(TypeError, match=r"inputs: expected a list .*\[x\].* got an array of "
                                        r"shape \(3, 4, 6\)"):
        check_layer(kernels.linear_forward, kernels.linear_backward, reference.linear, x, params)


def test_an_oracle_with_another_output_shape_is_named_as_the_oracle():
    x, params = _linear_case()
    report = check_layer(kernels.linear_forward, kernels.linear_backward,
                         lambda x, p: reference.linear(x, p).sum(axis=-1), [x], params)
    assert not report.ok and report.error_in == "oracle"
    assert "the oracle returned shape (3, 4), the forward (3, 4, 5)" in report.error
    assert "broadcast" not in report.error


def test_an_oracle_that_casts_to_float32_is_named_as_the_oracle():
    x, params = _linear_case()
    report = check_layer(kernels.linear_forward, kernels.linear_backward,
                         lambda x, p: reference.linear(x, p).astype(jnp.float32), [x], params)
    assert not report.ok and report.error_in == "oracle"
    assert "the oracle returned float32 for float64 inputs" in report.error


def test_a_backward_returning_a_tuple_of_the_wrong_length_says_what_it_should_return():
    x, params = _linear_case()

    def backward(dy, cache):
        dx, grads = kernels.linear_backward(dy, cache)
        return dx, grads["W"], grads["b"]                      # three values, not (dx, grads)
    report = check_layer(kernels.linear_forward, backward, reference.linear, [x], params)
    assert not report.ok and report.error_in == "backward"
    assert ("the backward returned a tuple of 3 values; expected a tuple of 2: (the input "
            "gradients, a dict of the parameter gradients)") in report.error


def test_a_forward_returning_only_its_output_says_out_cache_is_expected():
    x, params = _linear_case()
    x = x[:2]  # an output whose first axis has length 2 would otherwise unpack into two values
    report = check_layer(lambda x, p: kernels.linear_forward(x, p)[0], kernels.linear_backward,
                         reference.linear, [x], params)
    assert not report.ok and report.error_in == "forward"
    assert ("the forward returned an array of shape (2, 4, 5); expected a tuple (out, cache)"
            in report.error)
