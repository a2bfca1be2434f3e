"""attention_scaling at a tiny size: the logits' mean square d, the corrected entropy law, the
logit gradient through the lab's softmax, the saturation rate, and the functional test's hand
gradient against finite differences."""
import math

import numpy as np
import pytest

from checks.legs import normwise
from experiments import attention_scaling as study, common

TINY = study.Config(widths=(8, 32), keys=16, batch=2, draws=4, sigma_points=6, sweep_rows=200,
                    entropy_keys=(64, 512), entropy_rows=1000, grad_keys=(16, 64),
                    grad_sigmas=(1.0, 8.0, 16.0, 32.0), grad_rows=500, adam_widths=(16,),
                    adam_seeds=2, adam_steps=20, seed=3)


pytestmark = pytest.mark.usefixtures("study_sandbox")


def test_tiny_run_meets_its_predictions():
    result = study.run(TINY)
    heads = {h.quantity.split(",")[0]: h for h in result.headlines}
    ms = heads["unscaled logits: mean square of q·k over d"]
    assert ms.agrees and "t with 3 df" in ms.rule                  # 4 draws: Student's t
    for h in result.headlines:
        if h.kind in ("reproduced", "identity"):   # each verdict is the printed rule, applied
            assert h.agrees == (abs(h.measured - h.predicted) <= float(h.rule.split("≤ ")[1].split(" ×")[0])
                                * math.hypot(h.measured_se, h.predicted_se)), h
    # Vaswani's own d_k = 64 is a headline (shown: the claim has no number), and every Adam width
    assert any(h.quantity.startswith("d_k = 64 (σ = 8)") and h.kind == "shown" and h.measured_se > 0
               for h in result.headlines)
    assert sum(h.quantity.startswith("Adam steps") for h in result.headlines) == len(TINY.adam_widths)
    assert [t for t, _ in result.tables][:2] == ["per width (4 weight draws each, ± SE)",
                                                 "softmax entropy of n Gaussian logits at σ = 1"]


def test_logit_gradient_gain_is_the_jacobian_applied():
    rng = np.random.default_rng(0)
    logits, g = rng.standard_normal((5, 7)) * 3, rng.standard_normal((5, 7))
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    J = np.einsum("ri,ij->rij", p, np.eye(7)) - p[:, :, None] * p[:, None, :]   # diag(p) - p p^T
    expected = np.linalg.norm(np.einsum("rij,rj->ri", J, g), axis=1) / np.linalg.norm(g, axis=1)
    np.testing.assert_allclose(study.logit_gradient_gain(logits, g), expected, rtol=1e-12)


def test_quadratures_match_sampling():
    rng = np.random.default_rng(1)
    z = np.sort(rng.standard_normal((20000, 64)), axis=1)
    assert study.expected_max(64) == pytest.approx(z[:, -1].mean(), abs=4 * z[:, -1].std() / 141)
    gaps = z[:, -1] - z[:, -2]        # the median of 20000 draws: within 4 of its ~0.003 SE
    assert study.median_gap(64) == pytest.approx(np.median(gaps), abs=0.012)


def test_head_gradient_matches_finite_differences():
    rng = np.random.default_rng(2)
    S, B, n, d = 2, 3, 4, 5
    params = {k: rng.standard_normal((S, d, d)) for k in ("WQ", "WK")}
    keys = rng.standard_normal((S, B, n, d))
    target = rng.integers(0, n, (S, B))
    xq = rng.standard_normal((S, B, d))
    _, grads, _ = study.head_loss(params, keys, xq, target, 0.7)
    for name in params:
        fd = np.empty(params[name].size)
        for i in range(fd.size):
            e = np.zeros(params[name].size)
            e[i] = 1e-6
            e = e.reshape(params[name].shape)
            up = study.head_loss({**params, name: params[name] + e}, keys, xq, target, 0.7)[0]
            down = study.head_loss({**params, name: params[name] - e}, keys, xq, target, 0.7)[0]
            fd[i] = (up - down) / 2e-6
        # central differences at h = 1e-6 in float64: error ~ h^2 + u/h ~ 1e-10 of the scale
        assert normwise(grads[name].ravel(), fd) < 1e-7, name


@pytest.mark.parametrize("field, value", [("widths", (8, 4)), ("keys", 1), ("sigma_max", 0.0),
                                          ("draws", 0), ("grad_sigmas", (1.0, 2.0)), ("rho", 1.0)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field}: expected .*got"):
        study.Config(**{field: value})


def test_the_race_is_paired_and_censored_seeds_are_counted_as_bounds():
    budget = 10
    race = {(16, True): np.array([3, 5, 11, 11, 4]), (16, False): np.array([6, 2, 11, 7, 11])}
    diff, signs, censored = study.race_pairs(race, 16, budget)
    assert diff.tolist() == [3, -3, 0, -4, 7]          # the last pair: unscaled censored, a bound
    assert signs == (2, 2, 1) and censored == (2, 2)  # both censored: a tie
    # the two scalings of a width start from the same seed: same weights, same data
    config = study.Config(adam_widths=(16,), adam_seeds=2, adam_steps=10, adam_keys=4, adam_batch=4)
    a = study.adam_race(np.random.default_rng([0, 16]), config, 16, 1.0)
    b = study.adam_race(np.random.default_rng([0, 16]), config, 16, 1.0)
    assert (a == b).all()


def test_median_ratio_of_paired_rows_and_its_bootstrap_se():
    rng = np.random.default_rng(1)
    a = rng.lognormal(size=4000)
    ratio, se = study.median_ratio(2 * a, a, rng)
    assert ratio == pytest.approx(2.0) and se < 1e-9         # exactly paired: no spread at all
    ratio, se = study.median_ratio(rng.lognormal(size=4000), a, rng)
    assert 0 < se < 0.1 and abs(ratio - 1) < 4 * se           # independent rows: a real spread
