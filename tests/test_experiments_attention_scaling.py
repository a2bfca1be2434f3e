"""attention_scaling at a tiny size: logit std ∝ d^{1/2, 0, -1/2}, the entropy law, and the chain
rule that turns the lab kernel (always 1/sqrt(P)) into the unscaled and 1/d models."""
import math

import numpy as np
import pytest

import kernels
from experiments import attention_scaling as study

TINY = study.Config(widths=(8, 32, 128), keys=16, batch=2, draws=3, sigma_points=12,
                    sweep_rows=600, seed=3)


pytestmark = pytest.mark.usefixtures("study_sandbox")


def test_logit_std_follows_the_power_laws_and_entropy_the_closed_form():
    result = study.run(TINY)
    rows = [r for r in result.rows if r["d"] != ""]
    d = np.array(TINY.widths, float)
    for name, exponent in study.SCALINGS.items():
        slope, se = study.logit_slope(rows, name, d)  # se propagated from the spread over draws
        assert abs(slope - exponent) <= 3 * se, (name, slope, se)
    by = {(r["d"], r["scaling"]): r for r in rows}
    for w in TINY.widths:  # the three scalings share their draws: exact ratios sqrt(d) apart
        assert by[w, "none"]["logit_std"] == pytest.approx(by[w, "1/sqrt(d)"]["logit_std"] * math.sqrt(w))
        assert by[w, "1/d"]["logit_std"] == pytest.approx(by[w, "1/sqrt(d)"]["logit_std"] / math.sqrt(w))
    none = [by[w, "none"]["entropy"] for w in TINY.widths]
    assert none == sorted(none, reverse=True)  # unscaled logits saturate the softmax as d grows
    n = TINY.keys
    for r in result.rows:
        s = r["scaling"]
        if s.startswith("sweep") and float(s.split("=")[1]) <= 1:
            sigma = float(s.split("=")[1])
            # the closed form is the n -> inf limit; its first 1/n correction bounds the gap
            gap = (sigma ** 2 * math.exp(sigma ** 2) - (math.exp(sigma ** 2) - 1) / 2) / n
            assert abs(r["entropy"] - study.entropy_theory(sigma, n)) <= gap + 0.02, (sigma, r["entropy"])


@pytest.mark.parametrize("exponent", [0.5, -0.5])
def test_rescaled_kernel_gradient_is_the_models_gradient(exponent):
    """A model with logits c q.k / sqrt(d) is the kernel with W_Q' = c W_Q; its dL/dW_Q is
    c times the kernel's dL/dW_Q': checked against central differences in W_Q."""
    rng = np.random.default_rng(0)
    d = 8
    c = d ** exponent
    params = study.init_attention(rng, d)
    x, dout = rng.standard_normal((2, 5, d)), rng.standard_normal((2, 5, d))
    direction = rng.standard_normal(params["WQ"].shape)

    def loss(WQ):  # the rescaled model, written out: logits c (x WQ)(x WK)^T / sqrt(d)
        q, k, v = x @ WQ[0], x @ params["WK"][0], x @ params["WV"][0]
        a, _ = kernels.softmax_forward(c * q @ k.transpose(0, 2, 1) / math.sqrt(d), {})
        return float(((a @ v @ params["WO"]) * dout).sum())

    h = 1e-5
    fd = (loss(params["WQ"] + h * direction) - loss(params["WQ"] - h * direction)) / (2 * h)
    _, cache = kernels.mha_forward(x, {**params, "WQ": params["WQ"] * c})
    _, grads = kernels.mha_backward(dout, cache)
    assert float((c * grads["WQ"] * direction).sum()) == pytest.approx(fd, rel=1e-6)  # FD error ~1e-10


@pytest.mark.parametrize("field, value", [("widths", (8, 4)), ("keys", 1), ("sigma_max", 0.0),
                                          ("draws", 0)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field}: expected .*got"):
        study.Config(**{field: value})
