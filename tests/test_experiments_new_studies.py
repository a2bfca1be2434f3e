"""entropy_collapse and rank_collapse at a tiny size: the published bound holds, QK-norm keeps
the logits' mean square at 1, the cubic rate and the vanishing query gradient; the schedule
study's comparison by protocol."""
import math

import numpy as np
import pytest

from experiments import common, entropy_collapse, rank_collapse


pytestmark = pytest.mark.usefixtures("study_sandbox")


def test_entropy_bound_is_the_smallest_entropy_over_the_range():
    rng = np.random.default_rng(0)
    for n, delta in ((6, 2.5), (16, 1.0), (16, 6.0)):
        logits = rng.uniform(0, delta, (4000, n))         # any logits within the span: above it
        logits[:1000] = delta * (rng.random((1000, n)) < 0.3)   # corners too, where the minimum is
        p = np.exp(logits)
        p /= p.sum(1, keepdims=True)
        exact = entropy_collapse.min_entropy(delta, n)
        assert entropy_collapse.row_entropy(p).min() >= exact - 1e-12
        k = entropy_collapse.best_k(delta, n)               # attained by k keys at the top
        top = np.exp(np.r_[np.full(k, delta), np.zeros(n - k)])
        assert entropy_collapse.row_entropy(top / top.sum()) == pytest.approx(exact, rel=1e-12)
    # the one-top-key form is the minimum only above Delta_1(n): n = 16, span 1: five keys, 2.650
    assert entropy_collapse.best_k(1.0, 16) == 5
    assert entropy_collapse.min_entropy(1.0, 16) == pytest.approx(2.6497, abs=1e-4)
    assert entropy_collapse.zhai_bound(1.0, 16) == pytest.approx(2.7212, abs=1e-4)
    threshold = entropy_collapse.one_key_threshold(16)
    assert 3.3 < threshold < 3.4
    assert entropy_collapse.best_k(threshold * 1.01, 16) == 1 and entropy_collapse.best_k(threshold * 0.99, 16) > 1


def test_entropy_collapse_tiny():
    config = entropy_collapse.Config(width=8, keys=8, draws=4, scales=(0.5, 8.0, 64.0), train_epochs=0,
                                     sweep_rates=())
    result = entropy_collapse.run(config)
    kinds = [h.kind for h in result.headlines]
    assert kinds == ["consistent", "identity", "shown", "identity"], kinds
    assert all(h.agrees is not False for h in result.headlines)
    rows = {(r["scale"], r["qk_norm"]): r for r in result.rows if r["draw"] == 0}
    assert rows[64.0, False]["entropy"] < rows[0.5, False]["entropy"]          # collapse
    assert rows[64.0, True]["entropy"] == pytest.approx(rows[0.5, True]["entropy"], rel=1e-6)


def _sweep_rows(arm, rate, seed, loss, entropies, logit, limit=""):
    """One run's rows as rate_sweep writes them: one per layer, the largest logit in the last."""
    return [{"rate": rate, "seed": seed, "arm": arm, "layer": f"l{i}", "entropy": e,
             "max_logit": logit if i == len(entropies) - 1 else 1.0, "logit_limit": limit,
             "train_loss": loss, "valid_loss": loss} for i, e in enumerate(entropies)]


def _plain_runs(seed=0, second_entropy=0.1):
    return (_sweep_rows("plain", 0.01, seed, 0.01, (2.7, 1.7), 30.0)
            + _sweep_rows("plain", 0.1, seed, 1.8, (2.5, second_entropy), 900.0)
            + _sweep_rows("plain", 0.3, seed, 2.2, (0.4, 0.05), 2e5))


def test_rate_sweep_headlines_compare_failed_and_learnt_runs():
    config = entropy_collapse.Config(sweep_rates=(0.01, 0.1, 0.3))
    inequality, growth = entropy_collapse._rate_headlines(_plain_runs(), config)
    assert inequality.kind == "consistent" and inequality.agrees and inequality.measured == 0.1
    assert growth.kind == "shown" and growth.measured == pytest.approx(2e5 / 30.0)   # against the article's 0.01
    # a failed run whose entropy stayed high breaks the inequality
    assert not entropy_collapse._rate_headlines(_plain_runs(second_entropy=2.0), config)[0].agrees
    with pytest.raises(ValueError, match="sweep_rates: expected"):
        entropy_collapse.Config(sweep_rates=(0.1, 0.01))


def _qk_runs(seed=0, top_logit=12.0, top_loss=2.1):
    return (_sweep_rows("QK-norm", 0.01, seed, 0.005, (2.6, 1.5), 8.0, 10.0)
            + _sweep_rows("QK-norm", 0.1, seed, 1.9, (2.6, 1.6), 9.0, 10.0)
            + _sweep_rows("QK-norm", 0.3, seed, top_loss, (2.0, 1.2), top_logit, 20.0))


def test_rate_sweep_qk_norm_arm_against_the_plain_one():
    """The QK-norm arm's ceiling (an identity), its largest logit against the plain runs' at
    failure and its loss where they fail (bounds that can fail either way); with two seeds the
    paired log-ratio of the largest logits at the top rate, mean − t SE."""
    config = entropy_collapse.Config(sweep_rates=(0.01, 0.1, 0.3))
    heads = entropy_collapse._rate_headlines(_plain_runs() + _qk_runs(), config)
    ceiling, logits, learns = heads[2:]
    assert ceiling.kind == "identity" and ceiling.agrees and ceiling.measured == pytest.approx(0.9)
    assert logits.kind == "consistent" and logits.agrees and logits.measured == 12.0
    assert logits.predicted == "≤ 900"                 # the smallest largest logit of a failed plain run
    assert learns.kind == "consistent" and learns.agrees is False and learns.measured == 2.1
    heads = entropy_collapse._rate_headlines(_plain_runs() + _qk_runs(top_logit=1e3, top_loss=0.5), config)
    assert heads[3].agrees is False                    # a QK-norm logit beyond the failed plain runs'
    assert heads[4].agrees is False                    # 0.1's QK-norm run still fails (1.9 nats)
    assert heads[2].agrees is False                    # and 1e3 is beyond its ceiling of 20
    # two seeds, paired: at the top rate log10(2e5 / 12) and log10(2e5 / 15)
    rates = _plain_runs(0) + _plain_runs(1) + _qk_runs(0) + _qk_runs(1, top_logit=15.0)
    heads = entropy_collapse._rate_headlines(rates, config)
    paired, losses = heads[5:]
    d = np.log10([2e5 / 12.0, 2e5 / 15.0])
    assert paired.kind == "consistent" and paired.measured == pytest.approx(
        d.mean() - common.t_multiplier(1) * d.std(ddof=1) / np.sqrt(2))
    assert paired.agrees is (paired.measured >= 0)
    assert losses.kind == "shown" and losses.measured == pytest.approx(np.mean([1.8 - 1.9, 2.2 - 2.1] * 2))


def test_rank_collapse_tiny():
    config = rank_collapse.Config(width=8, tokens=5, draws=4, epsilons=(1e-3, 1e-2, 5e-2), depths=(2, 8))
    layer = rank_collapse.one_layer(np.random.default_rng(1), config)
    for key, power in (("res_out", 3.0), ("dWQ", 2.0), ("dWV", 0.0)):
        mean, se = common.mean_se(rank_collapse.slopes(layer, key))
        assert abs(mean - power) <= 0.05, (key, mean, se)   # orders of the expansion, eps <= 0.05
    result = rank_collapse.run(config)
    assert [h.kind for h in result.headlines] == ["reproduced", "reproduced", "reproduced", "identity",
                                                  "reproduced", "consistent"]
    layer_to_layer = result.headlines[1]   # the pure stack's exponent over depth: Dong's 3
    assert layer_to_layer.agrees and abs(layer_to_layer.measured - 3) < 0.5, layer_to_layer
    with pytest.raises(ValueError, match="betas: expected"):
        rank_collapse.Config(betas=(0.25, 1.0))
    x = np.ones((1, 4, 3)) * np.array([1.0, -2.0, 0.5])
    assert rank_collapse.residual(x)[0] == 0.0 and rank_collapse.residual(x + np.eye(4, 3))[0] > 0


def test_schedule_compares_the_article_only_under_its_own_protocol():
    """The article's schedule over seeds against the article's numbers (t with seeds - 1 df, one
    run's spread as the article's uncertainty); the intended schedule shown, never judged."""
    import types
    from experiments import schedule
    rng = np.random.default_rng(0)

    def fake(scale):  # a fit's per-epoch history, losses spread multiplicatively over seeds
        return types.SimpleNamespace(history=[{"epoch": e, "train_loss": v * scale, "valid_loss": v * scale}
                                              for e, v in enumerate([2.2, 1.7, 1.0, 0.5, 0.2, 0.1,
                                                                     0.05, 0.03, 0.02, 0.0165], 1)])
    seeds = range(5)
    fits = {("article", s): fake(math.exp(0.05 * rng.standard_normal())) for s in seeds}
    fits["intended", 0] = fake(0.1)
    heads = schedule._protocol_headlines(schedule.Config(), fits, seeds)
    judged = [h for h in heads if h.kind == "reproduced"]
    assert len(judged) == len(schedule.ARTICLE) and all("t with 4 df" in h.rule for h in judged)
    for h in judged:   # the article's uncertainty is one run's spread: the seeds' SD of the log
        assert h.predicted_se == pytest.approx(h.measured_se * math.sqrt(5))
    by_name = {h.quantity.split(",")[0]: h for h in judged}
    assert not by_name["log valid loss at epoch 2"].agrees     # 1.7 against 0.302: far in log SDs
    assert by_name["log valid loss at epoch 10"].agrees        # 0.0165 spread by 5 %: within
    shown = [h for h in heads if "intended" in h.quantity]
    assert shown and all(h.kind == "shown" and h.agrees is None for h in shown)
    other = schedule.Config(epochs=3)   # not the article's protocol: nothing compared
    assert all(h.kind == "shown" for h in schedule._protocol_headlines(other, fits, seeds))


def test_attention_layers_of_the_plain_and_the_qk_norm_model():
    """What the sweeps read from one forward pass: the plain model's unmasked layers with the
    entropy bound's margin (never negative), the QK-norm model's logits within its ceiling."""
    from kernels import model
    rng = np.random.default_rng(2)
    src, tgt = rng.integers(0, 10, (2, 5)), rng.integers(0, 10, (2, 5))
    for qk in (False, True):
        config = model.ModelConfig(qk_norm=qk)
        params = model.init_params(config, seed=1, std=0.5)
        layers = entropy_collapse.attention_layers(params, model.embedding_table(config), src, tgt,
                                                   margins=not qk)
        assert list(layers) == list(entropy_collapse.LAYERS)
        for name, (a, logits, margin) in layers.items():
            np.testing.assert_allclose(a.sum(axis=-1), 1.0, rtol=1e-5)
            if qk:
                assert margin is None
                limit = entropy_collapse.qk_logit_limit(params, entropy_collapse.LAYERS[name])
                assert np.abs(logits).max() <= limit
            else:
                assert (margin is None) == ("causal" in name)
                assert margin is None or margin[0] >= 0


@pytest.mark.slow  # trains the palindrome model twice for an epoch (a few seconds)
def test_rate_sweep_runs_both_arms_on_the_same_seed():
    config = entropy_collapse.Config(sweep_rates=(0.01,), sweep_epochs=1, train_epochs=0)
    rows = entropy_collapse.rate_sweep(config)
    assert [(r["arm"], r["layer"]) for r in rows] == [(arm, layer) for arm in entropy_collapse.ARMS
                                                      for layer in entropy_collapse.LAYERS]
    assert {(r["rate"], r["seed"]) for r in rows} == {(0.01, 0)}
    for r in rows:
        assert 0 < r["entropy"] <= np.log(16 + 1) and r["max_logit"] > 0
        if r["arm"] == "QK-norm":
            assert r["max_logit"] <= r["logit_limit"]
        else:
            assert r["logit_limit"] == ""
    runs = entropy_collapse.sweep_runs(rows)
    assert set(runs) == {("plain", 0.01, 0), ("QK-norm", 0.01, 0)}
    # different models trained on the same data: different losses, the same task
    assert runs["plain", 0.01, 0].valid_loss != runs["QK-norm", 0.01, 0].valid_loss
