"""The post-norm model (``norm_position="post"``, Xiong et al. 2020's Post-LN): every stage
norm(x + layer(x)), no final norm.  Its hand gradients against the oracle's autodiff and finite
differences through the checker (the registry's model case, post-norm), a wrong backward caught,
the stage on its own against central differences, and the default (pre-norm) untouched."""
import dataclasses
import functools

import numpy as np
import pytest

from checks.registry import BY_NAME, run_row
from checks.verdict import Kind
from kernels import model as M
from kernels.attention import mha_backward
from kernels.feedforward import ff_backward, ff_forward
from kernels.norm import EPS

POST_ROW = dataclasses.replace(BY_NAME["model"], name="model-post",
                               static={"norm_position": "post"})


def bypass_backward(dout, cache, *, layer_backward):
    """A plausible slip: the residual path takes dout straight through, as in the pre-norm
    stage, instead of the gradient through the norm."""
    ds, _ = M.rms_norm_backward(dout, cache.norm)
    dinputs, grads = layer_backward(ds, cache.layer)
    dx, dextra = dinputs if isinstance(dinputs, tuple) else (dinputs, None)
    dx = dx + dout
    return dx if dextra is None else (dx, dextra), grads


def stage_case(rng):
    """The post-norm feed-forward stage at small sizes, float64: x (2, 3, 6), F = 8."""
    x = rng.standard_normal((2, 3, 6))                                  # (B, T, D)
    params = {"W1": rng.standard_normal((6, 8)) / np.sqrt(6), "b1": 0.1 * rng.standard_normal(8),
              "W2": rng.standard_normal((8, 6)) / np.sqrt(8), "b2": 0.1 * rng.standard_normal(6)}
    return x, params


def directional_errors(backward, rng, directions=4):
    """|hand - FD| / (|g| |v|) of <stage(x), dout> along random directions of x and of all
    parameters (float64, h = 1e-5: truncation ~h^2 and rounding ~u / h, both below 1e-9 here)."""
    x, params = stage_case(rng)
    forward = lambda x, p: M.post_norm_residual(x, p, layer_forward=ff_forward)
    out, cache = forward(x, params)
    dout = rng.standard_normal(out.shape)                               # random upstream gradient
    dx, grads = backward(dout, cache, layer_backward=ff_backward)
    f = lambda x, p: float(np.sum(forward(x, p)[0] * dout))
    h, errors = 1e-5, []
    for _ in range(directions):
        vx = rng.standard_normal(x.shape)
        vp = {k: rng.standard_normal(v.shape) for k, v in params.items()}
        fd = (f(x + h * vx, {k: p + h * vp[k] for k, p in params.items()})
              - f(x - h * vx, {k: p - h * vp[k] for k, p in params.items()})) / (2 * h)
        hand = np.sum(dx * vx) + sum(np.sum(grads[k] * vp[k]) for k in params)
        norm_g = np.sqrt(np.sum(dx * dx) + sum(np.sum(g * g) for g in grads.values()))
        norm_v = np.sqrt(np.sum(vx * vx) + sum(np.sum(v * v) for v in vp.values()))
        errors.append(abs(hand - fd) / (norm_g * norm_v))
    return errors


def test_post_norm_stage_against_central_differences_and_a_slip_is_caught():
    """Bound 1e-7 relative to |g| |v|: the FD error is below 1e-9 (docstring above) while the
    slip changes the gradient by order one; the slip must exceed 1e-3 in some direction."""
    assert max(directional_errors(M.post_norm_residual_backward, np.random.default_rng(0))) < 1e-7
    assert max(directional_errors(bypass_backward, np.random.default_rng(0))) > 1e-3


def test_post_norm_stage_output_is_normalised_and_differs_from_pre_norm():
    x, params = stage_case(np.random.default_rng(1))
    post, cache = M.post_norm_residual(x, params, layer_forward=ff_forward)
    pre, _ = M.pre_norm_residual(x, params, layer_forward=ff_forward)
    rms = np.sqrt(np.mean(post * post, axis=-1))
    assert np.allclose(rms, 1.0, atol=1e-8) and isinstance(cache, M.PostNormCache)
    assert not np.allclose(np.sqrt(np.mean(pre * pre, axis=-1)), 1.0, atol=1e-2)
    # by hand: norm(x + FF(x))
    y, _ = ff_forward(x, params)
    s = x + y
    assert np.allclose(post, s / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + EPS),
                       rtol=1e-12, atol=0)


def test_default_is_pre_norm_and_post_differs():
    (src, tgt), params, static = BY_NAME["model"].case(np.random.default_rng(2), np.float64)
    plain, _ = M.model_forward(src, tgt, params, **static)
    pre, _ = M.model_forward(src, tgt, params, norm_position="pre", **static)
    post, cache = M.model_forward(src, tgt, params, norm_position="post", **static)
    assert plain == pre and post != pre
    assert M.ModelConfig().norm_position == "pre" and cache.decoder.head.norm is None
    assert isinstance(cache.encoder.blocks[0].attn, M.PostNormCache)
    gen = M.generate(src, params, norm_position="post", max_new=3, **static)
    assert gen.tokens.shape[0] == src.shape[0]


def test_norm_position_is_validated():
    with pytest.raises(ValueError, match=r"norm_position: expected one of pre, post, got 'mid'"):
        M.ModelConfig(norm_position="mid")
    (src, tgt), params, static = BY_NAME["model"].case(np.random.default_rng(3), np.float64)
    with pytest.raises(ValueError, match=r"norm_position: expected one of pre, post, got 'Post'"):
        M.model_forward(src, tgt, params, norm_position="Post", **static)


@pytest.mark.slow  # compiles the post-norm oracle (about 10 s per dtype on the shared machine)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_post_norm_model_agrees_with_its_oracle(dtype):
    """The checker's full rule on the registry's model case (two blocks per side, random
    upstream gradient), post-norm: every parameter's hand gradient agrees with jax autodiff of
    reference.model(norm_position="post") and with finite differences, forward too."""
    report = run_row(POST_ROW, dtype)
    _, params, _ = POST_ROW.case(np.random.default_rng(0), dtype)
    assert report.ok and len(report.tensors) == len(params), "\n" + str(report)


class Planted(M.Direct):
    """Runs the model's stages as written, but enc1.attn's backward with the slip."""

    def backward(self, name, backward, dout, cache):
        if name == "enc1.attn":
            return bypass_backward(dout, cache, layer_backward=mha_backward)
        return backward(dout, cache)


@pytest.mark.slow  # one more post-norm model check (float64)
def test_a_wrong_post_norm_backward_is_caught():
    """The residual path bypassing the norm's backward, planted in the stage enc1.attn: the
    check fails exactly on the tensors below it (enc0's) and blames the hand, which autodiff
    and finite differences contradict."""
    row = dataclasses.replace(POST_ROW, forward=functools.partial(M.model_forward, tape=Planted()))
    report = run_row(row, "float64")
    failing = [t for t in report.tensors if not t.ok]
    assert {t.name for t in failing} == {k for k in M.param_shapes(M.ModelConfig(
        D=6, H=2, F=8, V=4, blocks=2)) if k.startswith("enc0.")}, "\n" + str(report)
    assert all(t.verdict.kind is Kind.HAND_WRONG for t in failing), "\n" + str(report)


@pytest.mark.slow  # screens every stage of the model against its oracle (many small compiles)
def test_bisection_of_the_post_norm_model_names_the_planted_stage():
    """The stages carry norm_position="post" as a static argument, so the bisection's oracles,
    looked up by the stage's kind, are the post-norm ones: a clean post-norm model bisects clean,
    and the slip planted in dec1.ff alone is named."""
    import jax.numpy as jnp

    import reference
    from checks.bisection import bisect, model_tape
    from kernels.feedforward import ff_backward as ff_b
    (src, tgt), params, static = BY_NAME["model"].case(np.random.default_rng(5), np.float64)
    dloss = float(np.random.default_rng(6).standard_normal())
    oracle = lambda probes: reference.model(src, tgt, {k: jnp.asarray(v) for k, v in params.items()},
                                            probes=probes, norm_position="post", **static)
    found = {}
    for planted in ({}, {"dec1.ff": functools.partial(bypass_backward, layer_backward=ff_b)}):
        tape = model_tape(planted)
        _, cache = M.model_forward(src, tgt, params, tape=tape, norm_position="post", **static)
        M.model_backward(np.float64(dloss), cache)
        found[bool(planted)] = bisect(tape, oracle, dloss, explain=False)
    assert found[False].ok, "\n" + str(found[False])
    assert found[True].culprit == "dec1.ff", "\n" + str(found[True])
