"""Bisection of the whole model: each zoo bug that applies to a stage of the model, planted in
that stage's backward, is found in that stage (fed the oracle's upstream gradient, the stages
after it stay right) and explained there by the per-layer check."""
import functools

import numpy as np
import pytest

from checks.bisection import bisect_model
from checks.registry import BY_NAME
from checks.zoo import BUGS
from kernels import activations, attention, model as M

ZOO = {bug.name: bug for bug in BUGS}
pytestmark = pytest.mark.slow  # compiles a rounding model per stage of the whole model


@pytest.fixture(scope="module")
def case():
    """The registry's two-block model (D 6, H 2, F 8, V 4), B 2; the source as long as the
    decoder stream (T + 1 = 6) so that encoder and decoder stages share their compiled oracles."""
    rng = np.random.default_rng(0)
    (_, tgt), params, static = BY_NAME["model"].case(rng, np.float64)
    src = rng.integers(0, 4, (2, 6))
    return src, tgt, params, static["embedding"], float(rng.standard_normal())


def run(case, backwards=None, explain=False):
    src, tgt, params, table, dloss = case
    return bisect_model(src, tgt, params, embedding=table, dloss=dloss, backwards=backwards,
                        explain=explain)


def sublayer(layer_backward):
    return functools.partial(M.pre_norm_residual_backward, layer_backward=layer_backward)


def patched(module, attr, replacement, backward):
    """backward, with module.attr replaced while it runs (a bug inside a layer's backward)."""
    def run_patched(dout, cache):
        original = getattr(module, attr)
        setattr(module, attr, replacement)
        try:
            return backward(dout, cache)
        finally:
            setattr(module, attr, original)
    return run_patched


def _residual_dropped(dout, cache):
    dx, grads = M.pre_norm_residual_backward(dout, cache, layer_backward=M.ff_backward)
    return dx - dout, grads                                   # only the path through the layer


SOFTMAX = ZOO["softmax Jacobian missing its outer-product term"].backward
def _with_activation_backward(leaky_backward):
    """The feed-forward backward with its activation's backward replaced: the block applies the
    activation's derivative inline as a gain (kernels.feedforward), so the planted backward's
    gain is read off it (it is linear in dy) and put in the block's cache."""
    def backward(dy, cache):
        gain = leaky_backward(np.ones_like(cache.act.gain), cache.act)[0]
        return M.ff_backward(dy, cache._replace(act=activations.LeakyReluCache(gain)))
    return backward


PLANTED = [  # (stage, its planted backward, a tensor that must fail, a phrase of its diagnosis)
    # the explaining check runs for those with a phrase (a diagnosis without a common bug shape
    # searches the oracle's paths: seconds each)
    ("dec1.self", sublayer(ZOO["dQ and dK swapped"].backward), "WK", "swapped"),
    ("enc0.attn", sublayer(ZOO["missing 1/sqrt(P) in backward"].backward), "WQ", ""),
    ("dec0.self", sublayer(ZOO["causal mask ignored in backward"].backward), "WQ", ""),
    ("dec0.self", sublayer(ZOO["transposed weight gradient (W_O)"].backward), "WO", ""),
    ("enc0.attn", sublayer(ZOO["W_V gradient transposed per head"].backward), "WV", ""),
    ("dec1.self", sublayer(ZOO["heads merged with the wrong transpose in dx"].backward), "x", ""),
    ("enc1.attn", sublayer(ZOO["attention weights not transposed in dV"].backward), "WV", ""),
    ("dec0.self", sublayer(ZOO["self-attention dx misses the key/value path"].backward), "x", ""),
    ("enc1.attn", sublayer(patched(attention, "softmax_rows_backward",
                                   lambda dy, y: SOFTMAX(dy, activations.SoftmaxCache(y))[0],
                                   M.mha_backward)), "WQ", ""),
    ("dec0.ff", patched(M, "rms_norm_backward", ZOO["RMS-norm missing its second term"].backward,
                        sublayer(M.ff_backward)), "x", ""),
    ("enc1.ff", sublayer(_with_activation_backward(ZOO["leaky-ReLU slope wrong in backward"]
                                                   .backward)), "W1", ""),
    ("dec1.ff", sublayer(ZOO["bias gradient never filled (left at zero)"].backward), "b1",
     "identically zero"),
    ("enc0.ff", _residual_dropped, "x", ""),
    ("out", functools.partial(M.head_backward_pass,
                              out_backward=ZOO["bias gradient from the first batch element only"].backward),
     "b", ""),
    ("loss", ZOO["cross-entropy not divided by B·T"].backward, "logits",
     "scaled by a constant: B·T"),
    ("loss", ZOO["cross-entropy gradient with the wrong sign"].backward, "logits", "wrong sign"),
]


def test_the_right_model_bisects_clean(case):
    result = run(case)
    assert result.ok and result.culprit is None, str(result)
    assert [name for name, _ in result.screened][:3] == ["loss", "out", "dec1.ff"]
    assert len(result.screened) == 12 and all(r.ok for _, r in result.screened)


@pytest.mark.parametrize("stage, backward, tensor, phrase", PLANTED,
                         ids=[f"{p[0]}-{p[2]}-{i}" for i, p in enumerate(PLANTED)])
def test_a_planted_bug_is_found_in_its_stage(case, stage, backward, tensor, phrase):
    result = run(case, {stage: backward}, explain=bool(phrase))
    assert result.culprit == stage, str(result)
    names = [name for name, _ in result.screened]
    later = names[:names.index(stage)]                # the stages after it, in backward order
    assert all(r.ok for name, r in result.screened if name in later), str(result)
    screened = {t.name: t for t in dict(result.screened)[stage].tensors}[tensor]
    assert not screened.ok and screened.score > 1, str(result)
    if not phrase:
        return
    explained = {t.name: t for t in result.report.tensors}[tensor]
    assert not explained.ok and "hand is wrong" in str(explained.verdict), str(result)
    assert phrase in explained.diagnosis, str(result)
    assert f"first wrong stage in backward order: {stage}" in str(result)


def test_a_wrong_sum_between_right_stages_is_named_as_glue(case, monkeypatch):
    """The decoder's Z gradient from one block only: every stage is right, the glue is not."""
    original = M._sublayer_backward

    def lose_dz(tape, dx, name, cache, grads, watch=None):
        dx, dextra = original(tape, dx, name, cache, grads, watch)
        return dx, (0 * dextra if name == "dec1.cross" else dextra)
    monkeypatch.setattr(M, "_sublayer_backward", lose_dz)
    result = run(case)
    assert result.culprit is None and "glue between enc1.ff" in result.glue, str(result)


def test_unknown_stage_names_are_rejected(case):
    with pytest.raises(ValueError, match=r"backwards: no stage named 'dec9.ff'"):
        run(case, {"dec9.ff": M.ff_backward})
