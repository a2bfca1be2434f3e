"""Oracles as people write them: -inf masks, and a recurrence under lax.scan."""
import math

import numpy as np
import pytest

import kernels
from checks.engine import check_layer
from checks.wild import attention_params, mha_inf_oracle


@pytest.mark.parametrize("dtype", [pytest.param("float64", marks=pytest.mark.slow),
                                   pytest.param("float32", marks=pytest.mark.slow), "bfloat16"])
def test_an_attention_oracle_masking_with_minus_inf_passes(dtype):
    """Before: a NaN tolerance ("8.8e-17, nanx its tolerance") and a FAIL in every dtype."""
    from kernels.precision import finfo  # noqa: F401  (bfloat16 through ml_dtypes)
    rng = np.random.default_rng(0)
    dt = np.dtype(dtype)
    x = rng.standard_normal((2, 5, 8)).astype(dt)
    params = attention_params(rng, dt, 8, 2)
    report = check_layer(kernels.mha_forward, kernels.mha_backward, mha_inf_oracle, [x], params,
                         static={"causal": True}, input_names=["x"])
    assert report.ok, str(report)
    assert math.isfinite(report.forward_score)
    assert all(math.isfinite(t.score) and math.isfinite(t.tol) for t in report.tensors)


def _rnn_report(dtype, backward=None):
    from checks.wild import rnn_backward, rnn_case, rnn_forward, rnn_oracle
    x, params = rnn_case(np.random.default_rng(1), np.dtype(dtype))
    return check_layer(rnn_forward, backward or rnn_backward, rnn_oracle, [x], params,
                       input_names=["x"])


@pytest.mark.slow  # (the fast tier: the 1e-4 error below, whose other tensors must pass)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_recurrence_under_lax_scan_is_inside_the_rounding_model(dtype):
    from checks.verdict import Finding
    report = _rnn_report(dtype)
    assert report.ok, str(report)
    assert Finding.NO_ROUNDING_MODEL not in {n.finding for n in report.notes}


@pytest.mark.slow  # the unrolled recurrence's rounding model compiles for seconds
def test_a_uniform_1e_4_float32_error_under_a_scan_oracle_fails():
    """Before: the normwise fallback let it pass (1e-5 was caught when the maths was unrolled)."""
    from checks.wild import rnn_backward

    def scaled(dhs, cache):
        dx, grads = rnn_backward(dhs, cache)
        return dx, {**grads, "U": grads["U"] * np.float32(1 + 1e-4)}
    report = _rnn_report("float32", scaled)
    assert report.failing == ["U"], str(report)


def test_a_cond_oracle_falls_back_with_a_finding_that_says_what_is_lost():
    import jax

    from checks.verdict import Finding

    def doubled(x, p):
        return jax.lax.cond(x.sum() > -1e9, lambda x: 2 * x, lambda x: 3 * x, x)
    x = np.random.default_rng(0).standard_normal((3, 4))
    report = check_layer(lambda x, p: (2 * x, None), lambda dy, c: (2 * dy, {}), doubled, [x],
                         {})
    assert report.ok, str(report)
    note = next(n for n in report.notes if n.finding is Finding.NO_ROUNDING_MODEL)
    assert "control flow ('cond')" in str(note) and "x u x the tensor's largest" in str(note)


def test_an_oracle_the_model_cannot_follow_is_tried_once_per_check(monkeypatch):
    """The oracle's run tries the rounding model first (the check builds it anyway); a program
    it cannot follow is not traced into a model a second time for the spreads, and the check
    still falls back with its finding."""
    import jax

    from checks import rounding
    from checks.verdict import Finding
    tries = []
    build = rounding.RoundingModel.__init__

    def counted(self, *args, **kw):
        tries.append(1)
        build(self, *args, **kw)
    monkeypatch.setattr(rounding.RoundingModel, "__init__", counted)

    def tripled(x, p):
        return jax.lax.cond(x.sum() > -1e9, lambda x: 3 * x, lambda x: 2 * x, x)
    x = np.random.default_rng(1).standard_normal((2, 5))
    report = check_layer(lambda x, p: (3 * x, None), lambda dy, c: (3 * dy, {}), tripled, [x],
                         {})
    assert report.ok and tries == [1], (tries, str(report))
    assert any(n.finding is Finding.NO_ROUNDING_MODEL for n in report.notes)
