"""depth at a tiny size: pre-norm growth inside Xiong's band, post-norm flat, rank collapse
without residuals, and the stack's hand backward against finite differences for every variant."""
import numpy as np
import pytest

from experiments import depth as study, common

TINY = study.Config(width=16, heads=2, tokens=8, batch=2, max_depth=6, grad_depths=(1, 2, 4, 6),
                    trials=3, seed=2)


pytestmark = pytest.mark.usefixtures("study_sandbox")


def test_xiong_band_flat_post_norm_and_rank_collapse():
    m = study.measure(TINY)
    lo, hi = study.xiong_band(np.arange(TINY.max_depth + 1))
    ms, se = m[("pre", True)]["ms"]
    # Lemma 2 bounds the expectation; the measured mean may stray by its sampling error (3 SE)
    assert np.all(ms >= lo - 3 * se) and np.all(ms <= hi + 3 * se), (ms, lo, hi)
    assert ms[-1] > ms[0] + TINY.max_depth / 4  # and it does grow: at least half the lower slope
    post, _ = m[("post", True)]["ms"]
    np.testing.assert_allclose(post[1:], 1.0, atol=1e-6)  # RMS norm output: 1 up to eps = 1e-8
    pure = m[("attention only", False)]["cos"][0]
    assert pure[3] > 0.99  # collapsed within three layers (Dong et al. 2021)
    assert m[("pre", True)]["cos"][0][-1] < 0.9  # the residual pre-norm stack is far from it
    ff = m[("pre", True)]["trials"]["ff"]                  # (trials, FF sublayers, 3)
    inc = (ff[:, :, 1] - ff[:, :, 0]).ravel()
    mean, se = common.mean_se(inc)   # each sublayer adds (1 + a^2)/2: t(17 df) 99.7 % is 3.5 SE
    assert abs(mean - study.FF_INCREMENT) <= 3.5 * se, (mean, se)
    direct, direct_se = common.mean_se(ff[:, :, 2].ravel())   # |FF|^2/d itself: no cross term
    assert abs(direct - study.FF_INCREMENT) <= 3.5 * direct_se, (direct, direct_se)
    assert direct_se < se                                     # the sharper estimator
    result = study.run(TINY)  # the whole study at this size, charts and files
    assert (common.RESULTS / "depth" / "data.csv").exists()
    assert [h.kind for h in result.headlines] == ["reproduced"] * 3 + ["consistent", "shown", "consistent",
                                                                      "identity"]
    assert all("t with 2 df" in h.rule for h in result.headlines if h.kind in ("reproduced", "identity"))
    growth, _, lean = result.headlines[3:6]     # Xiong's Fig. 3 pattern: inequalities with margins
    assert growth.predicted.startswith("≥") and "margin measured − limit" in lean.rule


@pytest.mark.parametrize("variant", study.VARIANTS, ids=study.label_of)
def test_stack_backward_matches_finite_differences(variant):
    config = study.Config(width=8, heads=2, tokens=3, batch=1, max_depth=2, grad_depths=(2,), trials=1)
    rng = np.random.default_rng(5)
    blocks, norm, res = study.make_stack(rng, config, variant)
    x, g, v = (rng.standard_normal((1, 3, 8)) for _ in range(3))

    def loss(xx):
        states, _ = study.stack_forward(xx, blocks, norm, res)
        out = states[-1] / np.sqrt((states[-1] ** 2).mean(-1, keepdims=True) + 1e-8) \
            if norm == "pre" else states[-1]
        return float((out * g).sum())

    states, caches = study.stack_forward(x, blocks, norm, res)
    dx, _ = study.stack_backward(g, blocks, states, caches, norm, res, 2)
    h = 1e-6
    fd = (loss(x + h * v) - loss(x - h * v)) / (2 * h)
    # central differences in float64 at h = 1e-6: error ~ h^2 + u/h ~ 1e-10 relative to the scale
    assert float((dx * v).sum()) == pytest.approx(fd, rel=1e-6, abs=1e-8 * np.abs(dx).sum())


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match=r"^grad_depths: expected an integer in \[1, 24\], got 30"):
        study.Config(grad_depths=(1, 30))
    with pytest.raises(ValueError, match=r"^heads: expected a divisor of width = 64, got 5"):
        study.Config(heads=5)
