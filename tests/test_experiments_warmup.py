"""warmup at a tiny size: every arm trains with its own norm position and schedule, the paired
differences the headlines judge are recomputed from the runs, the rule can fail, the gradients
at initialisation are the model's own, and a bad config names its field."""
import math

import numpy as np
import pytest

from experiments import common, tasks, train, warmup as study
from kernels import model

pytestmark = pytest.mark.usefixtures("study_sandbox")

TINY = study.Config(max_tokens=4, batch=8, batches=6, epochs=1, steps=3, warmup=2, seeds=2,
                    rates=(1e-2,), init_blocks=2, init_seeds=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny run of the study, shared by the tests below (about 1 s)."""
    from conftest import sandbox
    mp = pytest.MonkeyPatch()
    sandbox(mp, tmp_path_factory.mktemp("results"), charts=False)
    try:
        yield study.run(TINY)
    finally:
        mp.undo()


def test_arms_differ_in_position_and_schedule_and_share_the_seed(tiny):
    config = TINY.train_config("post", False, 1e-2, 0)
    assert config.norm_position == "post" and config.warmup == 0 and config.start_rate == 1e-2
    assert TINY.train_config("pre", True, 1e-2, 0).warmup == TINY.warmup
    rows = {(r["rate"], r["position"], r["warmup"], r["seed"], r["epoch"]): r["valid_loss"]
            for r in tiny.rows}
    assert len(rows) == 2 * 2 * TINY.seeds * TINY.epochs           # every arm, seed and epoch
    finals = {k[:4]: v for k, v in rows.items() if k[4] == TINY.epochs}
    assert len(set(finals.values())) == len(finals)                # no two arms ran the same
    assert all(0 < v < 5 for v in finals.values())


def test_headlines_are_the_paired_differences_of_the_runs(tiny):
    rows = {(r["rate"], r["position"], r["warmup"], r["seed"]): r["valid_loss"]
            for r in tiny.rows if r["epoch"] == TINY.epochs}
    log = lambda p, w: np.log([rows[1e-2, p, w, s] for s in range(TINY.seeds)])
    d_post = log("post", False) - log("post", True)
    d_pre = log("pre", False) - log("pre", True)
    heads = {h.quantity: h for h in tiny.headlines}
    post = next(h for q, h in heads.items() if q.startswith("Post-LN at rate 0.01"))
    both = next(h for q, h in heads.items() if q.startswith("at rate 0.01: Post-LN's warm-up"))
    assert post.measured == pytest.approx(d_post.mean(), rel=1e-12)
    assert post.measured_se == pytest.approx(d_post.std(ddof=1) / math.sqrt(2), rel=1e-12)
    assert both.measured == pytest.approx((d_post - d_pre).mean(), rel=1e-12)
    for h in (post, both):          # an inequality that can fail: t with 1 df times the SE
        assert h.kind == "consistent"
        assert h.agrees == (h.measured >= common.t_multiplier(1) * h.measured_se)
    kinds = [h.kind for h in tiny.headlines]
    assert kinds.count("consistent") == 2 + 3 and kinds.count("shown") == 1


def test_the_rule_fails_for_no_effect():
    values = np.array([0.1, -0.1, 0.05])
    assert study.positive("q", values, "s", 2).agrees is False
    assert study.positive("q", values + 10, "s", 2).agrees is True


def test_initial_gradients_are_the_models(tiny):
    g = study.init_gradients(TINY, 2, 0, "post")
    mcfg = TINY.train_config("post", True, 1e-2, 0).model_config()
    mcfg = model.ModelConfig(D=mcfg.D, H=mcfg.H, F=mcfg.F, V=mcfg.V, blocks=2)
    params = model.init_params(mcfg, seed=0, dtype=np.float32, std=0.1)
    data = tasks.make_dataset("palindrome", batches=1, batch=8, T=4, seed=0)
    _, cache = model.model_forward(data[0, 0], data[0, 1], params, norm_position="post",
                                   embedding=model.embedding_table(mcfg, np.float32))
    _, grads = model.model_backward(np.float32(1), cache)
    assert g.w2 == pytest.approx([np.linalg.norm(grads[f"dec{i}.ff.W2"]) for i in range(2)], rel=1e-6)
    pre = study.init_gradients(TINY, 2, 0, "pre")
    assert not np.allclose(g.w2, pre.w2) and g.rms == 1.0
    _, cache = model.model_forward(data[0, 0], data[0, 1], params,
                                   embedding=model.embedding_table(mcfg, np.float32))
    y = cache.decoder.head.norm.y / cache.decoder.head.norm.inv_rms       # the stream, back
    assert pre.rms == pytest.approx(np.sqrt(np.mean(y * y, axis=-1)).mean(), rel=1e-4)


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match=r"^warmup: expected 1 \.\.\. 5 steps"):
        study.Config(epochs=2, steps=3, warmup=6)
    with pytest.raises(ValueError, match=r"^rates: expected positive"):
        study.Config(rates=(0.0,))
    with pytest.raises(ValueError, match=r"^seeds: expected"):
        study.Config(seeds=1)
    with pytest.raises(ValueError, match=r"norm_position: expected one of pre, post"):
        train.Config(norm_position="middle")
