"""The whole model: every parameter's hand gradient against jax.grad of the oracle (registry row,
multi-block, the article's configuration, dropout), generation, and validation."""
import jax
import numpy as np
import pytest

import reference
from checks import check_layer
from checks.registry import BY_NAME
from kernels import model as M

def test_the_registry_row_is_a_multi_block_model():
    """The 'model' row (run in both dtypes by test_layers.py and shown by python -m checks) checks
    a two-block-per-side model: every parameter of both blocks is among its tensors."""
    _, params, static = BY_NAME["model"].case(np.random.default_rng(0), np.float64)
    assert set(params) == set(M.param_shapes(M.ModelConfig(D=6, H=2, F=8, V=4, blocks=2)))
    assert {"enc1.attn.WQ", "dec1.cross.WK", "dec1.ff.b1", "out.b"} <= set(params)


def test_dropout_before_the_output_layer_against_finite_differences():
    """With a fixed keep-mask, the hand gradient through dropout against central differences of
    dloss * L (float64, a random upstream scalar) along random directions in all parameters at
    once.  Bound 1e-6 relative to |g| |v|: with h = 1e-5 the truncation error is about h^2 times
    the third derivative (~1e-9) and the rounding error about u |L| / h (~1e-11), while a missing
    or unscaled mask is off by order one."""
    rng = np.random.default_rng(4)
    (src, tgt), params, static = BY_NAME["model"].case(rng, np.float64)
    mask = rng.random((2, 6, 6)) >= 0.3                            # (B, T+1, D) keep-mask
    drop = {**static, "dropout": 0.3, "dropout_mask": mask}
    dloss = rng.standard_normal()
    loss, cache = M.model_forward(src, tgt, params, **drop)
    _, grads = M.model_backward(dloss, cache)
    L = lambda p: dloss * float(M.model_forward(src, tgt, p, **drop)[0])
    h = 1e-5
    for _ in range(3):
        v = {k: rng.standard_normal(p.shape) for k, p in params.items()}
        fd = (L({k: p + h * v[k] for k, p in params.items()})
              - L({k: p - h * v[k] for k, p in params.items()})) / (2 * h)
        hand = sum(np.sum(grads[k] * v[k]) for k in params)
        scale = np.sqrt(sum(np.sum(g * g) for g in grads.values())
                        * sum(np.sum(x * x) for x in v.values()))
        assert abs(hand - fd) < 1e-6 * scale, (hand, fd)
    plain, _ = M.model_forward(src, tgt, params, **static)
    assert plain != loss                                           # the mask does act


def article_case(dtype, B=8, T=16):
    config = M.ModelConfig()                        # D 32, H 4, F 128, V 12, one block per side
    params = M.init_params(config, seed=7, dtype=dtype)   # the article's init: std 0.1, zero biases
    rng = np.random.default_rng(8)
    src, tgt = rng.integers(0, 10, (B, T)), rng.integers(0, 10, (B, T))
    return config, params, M.embedding_table(config, np.float64), src, tgt


@pytest.mark.slow  # compiles the article-sized model twice (jax.grad, rounding model)
def test_article_configuration_matches_jax_grad():
    """Hand backward vs jax.grad of the oracle's loss (float64), with a random upstream scalar,
    for every parameter: float64 within 1e-10 relative (the foundation's bar).  float32: the
    checker's full rule at the article's configuration — every element of every gradient within
    its rounding-model tolerance, forward too (docs/tolerances.md)."""
    dloss = float(np.random.default_rng(9).standard_normal())
    oracle_grad = jax.jit(jax.grad(lambda p, s, t, e: dloss * reference.model(s, t, p, embedding=e)))
    config, params, table, src, tgt = article_case(np.float64)
    loss, cache = M.model_forward(src, tgt, params, embedding=table)
    _, grads = M.model_backward(np.float64(dloss), cache)
    ref = oracle_grad(params, src, tgt, table)
    assert sum(v.size for v in params.values()) == 22476   # "about 22.5 thousand"
    assert set(grads) == set(params) and loss.dtype == np.float64
    for key in params:
        g, r = grads[key], np.asarray(ref[key])
        assert g.dtype == np.float64 and g.shape == r.shape
        err = np.max(np.abs(g - r)) / np.max(np.abs(r))
        assert err < 1e-10, f"float64 {key}: {err:.1e}"
    config, params, table, src, tgt = article_case(np.float32)
    report = check_layer(M.model_forward, M.model_backward, reference.model, [src, tgt], params,
                         static={"embedding": table}, name="model", input_names=("src", "tgt"),
                         fd="none")  # 22k parameters: hand vs autodiff, element by element
    assert report.ok and len(report.tensors) == len(params), "\n" + str(report)


def crafted(finish_bias, pad_seed=5):
    """A random model (std 1) whose Finish logit is raised by finish_bias."""
    config = M.ModelConfig(D=16, H=2, F=32, V=12)
    params = M.init_params(config, seed=pad_seed, dtype=np.float64, std=1.0)
    params["out.b"] = params["out.b"].copy()
    params["out.b"][config.finish] = finish_bias
    src = np.random.default_rng(1).integers(0, 10, (32, 6))
    return config, params, M.embedding_table(config, np.float64), src


def test_generation_stops_when_every_sequence_has_finished():
    config, params, table, src = crafted(100.0)    # every sequence says Finish at once
    gen = M.generate(src, params, embedding=table, max_new=7)
    assert gen.steps == 1 and gen.tokens.shape == (32, 2)
    assert (gen.tokens[:, 0] == config.start).all() and (gen.tokens[:, 1] == config.finish).all()


def test_generation_pads_finished_sequences():
    config, params, table, src = crafted(10.0)
    gen = M.generate(src, params, embedding=table, pad=0)
    out = gen.tokens[:, 1:]                          # (B, steps)
    finished = [r for r in range(len(out)) if config.finish in out[r]]
    first = {r: list(out[r]).index(config.finish) for r in finished}
    # the scenario is meaningful: some but not all finish, before the last step, and the model
    # would have said something other than the pad afterwards
    assert 0 < len(finished) < len(out) and gen.steps == 7
    assert any(first[r] < gen.steps - 1 for r in finished)
    would_say = gen.logits.argmax(axis=-1)
    assert any((would_say[r, first[r] + 1:] != 0).any() for r in finished)
    for r in finished:
        assert (out[r, first[r] + 1:] == 0).all()
    default = M.generate(src, params, embedding=table)   # pad defaults to Finish
    for r in finished:
        assert (default.tokens[r, 1 + first[r]:] == config.finish).all()


def test_teacher_forced_logits_equal_generation_logits():
    """decode() on the generated prefix, teacher-forced, gives the logits generation computed
    step by step (the lab keeps the final norm in both).  Equal to rounding, not bitwise: the
    same sums on matrices of other shapes may be added in another order by BLAS; float64 with a
    few dozen terms per sum stays far below 1e-12 relative."""
    config, params, table, src = crafted(10.0)
    gen = M.generate(src, params, embedding=table)
    z, _ = M.encode(src, params, embedding=table)
    forced, _ = M.decode(gen.tokens[:, :-1], z, params, embedding=table)   # (B, steps, V)
    assert forced.shape == gen.logits.shape
    assert np.max(np.abs(forced - gen.logits)) <= 1e-12 * np.max(np.abs(forced))
    assert (forced.argmax(-1) == gen.tokens[:, 1:]).sum() > 0


def test_init_is_seeded_and_as_the_article():
    config = M.ModelConfig(blocks=2)
    a, b = M.init_params(config, seed=3), M.init_params(config, seed=3)
    c = M.init_params(config, seed=4)
    assert all(np.array_equal(a[k], b[k]) for k in a) and not np.array_equal(a["out.W"], c["out.W"])
    assert all(not a[k].any() for k in a if k.rsplit(".", 1)[1].startswith("b"))
    W = np.concatenate([v.ravel() for k, v in a.items() if not k.rsplit(".", 1)[1].startswith("b")])
    assert abs(W.std() - 0.1) < 0.002 and a["out.W"].dtype == np.float32
    assert M.config_of(a) == config
    table = M.embedding_table(config)
    assert np.allclose(table @ table.T, np.eye(12), atol=1e-6)   # orthonormal rows


@pytest.mark.parametrize("kwargs, match", [
    ({"D": 30, "H": 4}, r"D: the width D = 30 must be divisible by H = 4"),
    ({"D": 8, "H": 2, "V": 12}, r"V: orthogonal embeddings need V <= D"),
    ({"blocks": 0}, r"blocks: expected a positive integer"),
    ({"D": 10, "H": 5, "V": 10, "F": 8}, None),
])
def test_model_config_validation(kwargs, match):
    if match is None:
        assert M.ModelConfig(**kwargs).finish == kwargs["V"] - 1
        return
    with pytest.raises(ValueError, match=match):
        M.ModelConfig(**kwargs)


def test_bad_inputs_name_the_argument():
    config, params, table, src, tgt = article_case(np.float64, B=2, T=4)
    with pytest.raises(ValueError, match=r"tgt: token ids must lie in \[0, 12\)"):
        M.model_forward(src, tgt - 1, params, embedding=table)
    with pytest.raises(ValueError, match=r"src, tgt: expected \(B, S\) and \(B, T\) with the same B"):
        M.model_forward(src, tgt[:1], params, embedding=table)
    with pytest.raises(ValueError, match=r"missing \['out.b'\]"):
        M.model_forward(src, tgt, {k: v for k, v in params.items() if k != "out.b"}, embedding=table)
    with pytest.raises(ValueError, match=r"embedding: expected shape \(V, D\) = \(12, 32\)"):
        M.model_forward(src, tgt, params, embedding=table[:10])
    with pytest.raises(ValueError, match=r"pad: expected an id in \[0, 12\)"):
        M.generate(src, params, embedding=table, pad=12)


def test_watch_names_the_first_non_finite_layer():
    config, params, table, src, tgt = article_case(np.float64, B=2, T=4)
    seen = []

    def watch(layer, direction, value):
        if not np.all(np.isfinite(value)) and not seen:
            seen.append((layer, direction))

    poisoned = {**params, "dec0.cross.WV": params["dec0.cross.WV"].copy()}
    poisoned["dec0.cross.WV"][0, 0, 0] = np.nan
    loss, cache = M.model_forward(src, tgt, poisoned, embedding=table, watch=watch)
    assert seen == [("dec0.cross", "forward")]
    seen.clear()
    _, cache = M.model_forward(src, tgt, params, embedding=table, watch=watch)
    M.model_backward(np.inf, cache, watch=watch)
    assert seen == [("loss", "backward")]
