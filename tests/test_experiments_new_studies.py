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
    n, delta = 6, 2.5
    p_bound = np.exp(np.r_[delta, np.zeros(n - 1)])
    p_bound /= p_bound.sum()      # one logit at the top, n - 1 at the bottom: equality
    assert entropy_collapse.zhai_bound(delta, n) == pytest.approx(entropy_collapse.row_entropy(p_bound))
    logits = rng.uniform(0, delta, (2000, n))              # any logits within the range: above it
    p = np.exp(logits)
    p /= p.sum(1, keepdims=True)
    assert entropy_collapse.row_entropy(p).min() >= entropy_collapse.zhai_bound(delta, n)


def test_entropy_collapse_tiny():
    config = entropy_collapse.Config(width=8, keys=8, draws=4, scales=(0.5, 8.0, 64.0), train_epochs=0)
    result = entropy_collapse.run(config)
    bound, qk = result.headlines[:2]
    assert bound.kind == "consistent" and bound.agrees and qk.kind == "identity" and qk.agrees
    rows = {(r["scale"], r["qk_norm"]): r for r in result.rows if r["draw"] == 0}
    assert rows[64.0, False]["entropy"] < rows[0.5, False]["entropy"]          # collapse
    assert rows[64.0, True]["entropy"] == pytest.approx(rows[0.5, True]["entropy"], rel=1e-6)


def test_rank_collapse_tiny():
    config = rank_collapse.Config(width=8, tokens=5, draws=4, epsilons=(1e-3, 1e-2, 5e-2), depths=(2, 8))
    layer = rank_collapse.one_layer(np.random.default_rng(1), config)
    for key, power in (("res_out", 3.0), ("dWQ", 2.0), ("dWV", 0.0)):
        mean, se = common.mean_se(rank_collapse.slopes(layer, key))
        assert abs(mean - power) <= 0.05, (key, mean, se)   # orders of the expansion, eps <= 0.05
    result = rank_collapse.run(config)
    assert [h.kind for h in result.headlines] == ["reproduced", "reproduced", "identity", "reproduced", "shown"]
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
