"""The diagnosis of a local derivative read against dout, of a factor left out of a product, and
of a static number named as a scale: each on a broken backward checked through check_layer."""
import numpy as np
import pytest

import kernels
from checks.engine import check_layer
from checks.registry import BY_NAME, run_row
from examples.my_layers import softcap_forward, softcap_oracle

BTV = ("batch", "token", "class")


def _softcap(backward, cap=6.0):
    x = 8.0 * np.random.default_rng(3).standard_normal((2, 3, 4))
    report = check_layer(lambda x, p, cap: softcap_forward(x, p, cap=cap), backward,
                         softcap_oracle, [x], {}, static={"cap": cap}, name="softcap",
                         input_names=("x",), axes={"x": BTV})
    assert not report.ok
    return report.tensors[0].diagnosis


@pytest.mark.parametrize("backward, phrase", [
    (lambda dy, c: (1 - c.t * c.t, {}), "the upstream gradient is missing as a factor"),
    (lambda dy, c: (dy, {}), "the local derivative is missing"),
    (lambda dy, c: (dy * (1 + c.t * c.t), {}), "a sign error inside the local derivative"),
    (lambda dy, c: (dy * (1 - c.t * c.t) * 6.0, {}), "scaled by a constant: cap = 6"),
])
def test_an_elementwise_derivative_against_dout(backward, phrase):
    assert phrase in _softcap(backward)


def test_a_static_number_is_a_constant_of_the_case_only_when_given():
    # the same factor 6 with the cap at 5: no longer a constant of the case
    wrong = lambda dy, c: (dy * (1 - c.t * c.t) * 6.0, {})
    assert "not a constant of this case" in _softcap(wrong, cap=5.0)


@pytest.mark.slow  # RMS norm's oracle attributed first: about 4 s
def test_a_per_row_factor_left_out():
    """RMS norm's dx without the 1/rms factor: hand x f = right with f one value per row."""
    def no_inv_rms(dy, cache):
        return dy - cache.y * (dy * cache.y).mean(axis=-1, keepdims=True), {}
    report = run_row(BY_NAME["rms_norm"], np.float64, backward=no_inv_rms)
    diagnosis = report.tensors[0].diagnosis
    assert "a factor is missing or extra" in diagnosis
    assert "constant along feature (one value per batch, token" in diagnosis


def test_a_right_gradient_of_dout_itself_is_no_finding():
    """posenc's gradient is dout: a backward that scales it is 'scaled', never 'the local
    derivative is missing'."""
    report = run_row(BY_NAME["posenc"], np.float64,
                     backward=lambda d, c: (2 * kernels.posenc_backward(d, c)[0], {}))
    assert "scaled by a constant: 2" in report.tensors[0].diagnosis
