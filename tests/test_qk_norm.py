"""QK-norm in the lab's model: its hand gradients against the oracle (every attention layer
normalises its queries and keys), the option's defaults, and what the norm guarantees."""
import numpy as np
import pytest

import reference
from checks import check_layer
from checks.registry import BY_NAME
from kernels import model as M
from kernels.attention import mha_backward, qknorm_mhca_forward


def qk_case(dtype, *, seed=0, B=2, T=4):
    """A two-block QK-norm model at D = 8, H = 2 (P = 4: the per-head layer norm is well posed
    from P = 4, see the qknorm-mhca row), F = 8, V = 4; the lab's initialisation with random
    biases, and gains drawn around one (the initial gains are all one, which would hide a
    gradient missing a gain)."""
    rng = np.random.default_rng(seed)
    config = M.ModelConfig(D=8, H=2, F=8, V=4, blocks=2, qk_norm=True)
    params = M.init_params(config, seed=seed, dtype=dtype, std=1 / np.sqrt(8), bias_std=0.1)
    for key in params:
        if key.endswith((".gq", ".gk")):
            params[key] = (1 + 0.5 * rng.standard_normal(params[key].shape)).astype(dtype)
    src, tgt = rng.integers(0, 4, (B, T)), rng.integers(0, 2, (B, T))
    return config, params, {"embedding": M.embedding_table(config, np.float64)}, src, tgt


@pytest.mark.slow  # compiles the model's oracle and rounding model (about 40 s of CPU)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: np.dtype(d).name)
def test_qk_norm_model_agrees_with_its_oracle(dtype):
    """Every parameter's hand gradient (the gains of all six attention layers included) against
    autodiff of the oracle and finite differences along random directions, with the checker's
    random upstream gradient and its tolerance rule (docs/tolerances.md), as the model row."""
    _, params, static, src, tgt = qk_case(dtype)
    report = check_layer(M.model_forward, M.model_backward, reference.model, [src, tgt], params,
                         static=static, name="model-qk-norm", input_names=("src", "tgt"),
                         policy=BY_NAME["model"].policy(dtype), seed=1)
    assert report.ok, "\n" + str(report)
    gains = {t.name for t in report.tensors if t.name.endswith((".gq", ".gk"))}
    assert len(gains) == 12                       # 2 blocks x 3 attention layers x (gq, gk)


@pytest.mark.slow  # compiles the oracle for a new shape (about 10 s on a loaded machine)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: np.dtype(d).name)
def test_qk_norm_causal_self_attention_agrees_with_its_oracle(dtype):
    """The model's QK-norm self-attention (the registered cross form with z = x, back through
    mha_backward, which sums the stream's paths) with the decoder's causal mask: hand against
    autodiff and finite differences at the registry row's sizes, T = 5 queries and keys."""
    row = BY_NAME["qknorm-mhca"]
    (x, _), params, _ = row.case(np.random.default_rng(3), dtype)
    report = check_layer(M._qknorm_self_forward, mha_backward,
                         lambda x, p, causal: reference.qknorm_mhca(x, x, p, causal=causal),
                         [x], params, static={"causal": True}, name="qknorm-self-causal",
                         input_names=("x",), axes={k: v for k, v in row.axes.items() if k != "z"},
                         sizes={"B": 2, "T": 5, "D": 16, "H": 2, "P": 8}, policy=row.policy(dtype), seed=2)
    assert report.ok, "\n" + str(report)
    assert {t.name for t in report.tensors} >= {"x", "WQ", "WK", "gq", "gk"}


def test_default_model_is_unchanged_and_gains_take_no_draw():
    """qk_norm defaults to off (no gains, the same parameters as before); on, the weights of a
    seed are the plain model's and the gains start at one."""
    plain_cfg = M.ModelConfig()
    assert plain_cfg.qk_norm is False
    plain = M.init_params(plain_cfg, seed=3)
    qk = M.init_params(M.ModelConfig(qk_norm=True), seed=3)
    assert not any(k.endswith((".gq", ".gk")) for k in plain)
    assert set(qk) - set(plain) == {f"{s}.{g}" for s in ("enc0.attn", "dec0.self", "dec0.cross")
                                    for g in ("gq", "gk")}
    assert all(np.array_equal(plain[k], qk[k]) for k in plain)
    assert all(np.all(qk[k] == 1) for k in set(qk) - set(plain))
    assert M.config_of(qk).qk_norm and not M.config_of(plain).qk_norm
    with pytest.raises(TypeError, match="qk_norm"):
        M.ModelConfig(qk_norm=1)


def test_the_gains_carry_the_logit_scale():
    """With QK-norm every logit lies within sqrt(P) max_j |gq_j gk_j| whatever the weights (the
    module docstring's bound), and scaling the gains by c scales the logits by c^2: the norm
    bounds the logits without removing their scale."""
    rng = np.random.default_rng(5)
    H, P, B, T, S = 2, 8, 2, 6, 5
    x, z = rng.standard_normal((B, T, H * P)), rng.standard_normal((B, S, H * P))
    params = {n: 30 * rng.standard_normal((H, P, P)) for n in ("WQ", "WK", "WV")}
    params |= {"WO": rng.standard_normal((H * P, H * P)), "gq": rng.standard_normal((H, P)),
               "gk": rng.standard_normal((H, P))}
    _, cache = qknorm_mhca_forward(x, z, params)
    logits = cache.q @ np.swapaxes(cache.k, -1, -2) / np.sqrt(P)            # (H, B, T, S)
    limit = np.sqrt(P) * np.abs(params["gq"] * params["gk"]).max(axis=-1)    # (H,)
    assert np.all(np.abs(logits).max(axis=(1, 2, 3)) <= limit)
    _, scaled = qknorm_mhca_forward(x, z, {**params, "gq": 3 * params["gq"], "gk": 3 * params["gk"]})
    np.testing.assert_allclose(scaled.q @ np.swapaxes(scaled.k, -1, -2) / np.sqrt(P), 9 * logits,
                               rtol=1e-12, atol=1e-12 * np.abs(logits).max())


@pytest.mark.slow  # compiles the oracle's gradient of the model four times (about 10 s each)
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk-norm"])
@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_every_option_combination_matches_autodiff(qk_norm, norm_position):
    """The model's hand gradients under each combination of its two options against
    jax.grad of the oracle with the same options, in float64, with a random upstream gradient
    (the loss is scaled by a random factor).  Bound: 1e-10 relative to the largest gradient,
    far above float64 rounding through this two-block model (about 1e-15) and far below what
    a wrong path gives (a kernel pair picked for the wrong option is off by O(1))."""
    import jax
    import jax.numpy as jnp
    _, params, static, src, tgt = qk_case(np.float64, seed=4)
    if not qk_norm:
        params = {k: v for k, v in params.items() if not k.endswith((".gq", ".gk"))}
    dloss = float(np.random.default_rng(5).standard_normal())
    _, cache = M.model_forward(src, tgt, params, norm_position=norm_position, **static)
    _, hand = M.model_backward(dloss, cache)
    auto = jax.grad(lambda p: dloss * reference.model(src, tgt, p, norm_position=norm_position,
                                                      **static))(
        {k: jnp.asarray(v) for k, v in params.items()})
    scale = max(float(np.max(np.abs(np.asarray(g)))) for g in auto.values())
    for key in params:
        np.testing.assert_allclose(hand[key], np.asarray(auto[key]), rtol=0, atol=1e-10 * scale,
                                   err_msg=key)
