"""The bug zoo: classic backprop bugs applied to the lab's own kernels, each a broken backward
that wraps the real one (the kernels themselves stay correct).  Every bug must be caught, and
the diagnosis must name the pattern the bug is expected to show.  ``checks.zoo_foreign`` is the
second section: bugs in layers the lab has never seen.

``python -m checks zoo`` prints a table per section: bug, caught, the failing tensors and the
diagnosis, then the caught and explained counts (docs/zoo.md).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple

import numpy as np

import kernels
import reference
from checks.registry import BY_NAME, Row, ff_params, normal, run_row
from kernels.activations import softmax_rows
from kernels.attention import split_heads

# Sizes at which every constant the diagnosis names is unambiguous: sqrt(P) = sqrt(6) is no
# small constant, B·T = 8 is no other size, 1 - rate = 0.75; B·T > V, so some token ids repeat.
ZOO_SIZES = {"B": 2, "T": 4, "S": 3, "D": 12, "H": 2, "F": 10, "V": 5}


# --- a pre-norm residual block, x + ff(rms_norm(x)), built from the lab's kernels ---------------

class BlockCache(NamedTuple):
    norm: object  # RmsNormCache
    ff: object    # FeedForwardCache


def block_forward(x, params):
    """x + ff(rms_norm(x)): the model's feed-forward sub-block.  x: (B, T, D) -> (B, T, D)."""
    h, norm = kernels.rms_norm_forward(x, {})    # (B, T, D)
    f, ff = kernels.ff_forward(h, params)        # (B, T, D)
    return x + f, BlockCache(norm, ff)


def block_backward(dy, cache, *, keep_skip=True):
    """The skip path passes dy unchanged; the other goes back through ff and the norm."""
    dh, grads = kernels.ff_backward(dy, cache.ff)            # (B, T, D)
    dx, _ = kernels.rms_norm_backward(dh, cache.norm)        # (B, T, D)
    return (dy + dx if keep_skip else dx), grads


def block_oracle(x, params):
    return x + reference.ff(reference.rms_norm(x, {}), params)


def _block_case(rng, dtype, s):
    x = normal(rng, (s["B"], s["T"], s["D"]), dtype)
    h = x.astype(np.float64) / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True))
    return [x], ff_params(rng, dtype, s, h.astype(dtype))


BLOCK = Row("block", block_forward, block_backward, block_oracle, _block_case,
            axes={"x": ("batch", "token", "feature")})


# --- the broken backwards -------------------------------------------------------------------
# Each wraps the real kernel: it calls the correct backward (with a modified cache where the
# bug lives inside it) and alters what comes back.  No kernel code is copied here.

def _attn_grads(alter):
    """mha_backward with one weight gradient altered: alter(grads) -> grads."""
    def backward(dout, cache):
        dx, grads = kernels.mha_backward(dout, cache)
        return dx, alter(dict(grads))
    return backward


def _swap_qk(grads):
    return {**grads, "WQ": grads["WK"], "WK": grads["WQ"]}


def _transpose(name):
    return lambda grads: {**grads, name: grads[name].swapaxes(-1, -2)}


def _attention_unscaled(dout, cache):
    """Forgets the 1/sqrt(P) of the logits: every gradient through q k^T comes out sqrt(P)
    too large, as if q and k had been cached sqrt(P) times larger."""
    root = math.sqrt(cache.q.shape[-1])
    return kernels.mha_backward(dout, cache._replace(q=cache.q * root, k=cache.k * root))


def _attention_mask_ignored(dout, cache):
    """Recomputes the probabilities in backward without the causal mask."""
    P = cache.q.shape[-1]
    logits = cache.q @ cache.k.swapaxes(-1, -2) / math.sqrt(P)           # (H, B, T, S)
    return kernels.mha_backward(dout, cache._replace(a=softmax_rows(logits)))


def _attention_a_untransposed(dout, cache):
    """dV = a dheads instead of a^T dheads: the value path taken with a untransposed, and the
    rest of the backward (queries, keys) right."""
    zero = lambda *names: {**cache.params, **{n: np.zeros_like(cache.params[n]) for n in names}}
    dx_qk, grads = kernels.mha_backward(dout, cache._replace(params=zero("WV")))
    dx_v, bad = kernels.mha_backward(dout, cache._replace(a=cache.a.swapaxes(-1, -2),
                                                          params=zero("WQ", "WK")))
    return dx_qk + dx_v, {**grads, "WV": bad["WV"]}


def _attention_query_path_only(dout, cache):
    """Self-attention's dx from the query path alone: the stream's key/value gradient, which
    mhca_backward returns as the second stream's, is dropped."""
    (dx, _), grads = kernels.mhca_backward(dout, cache)
    return dx, grads


def _attention_merged_p_major(dout, cache):
    """The right head-space gradient merged with the features laid out (P, H)."""
    dx, grads = kernels.mha_backward(dout, cache)
    H = cache.q.shape[0]
    x_h = split_heads(dx, H)                                                # (H, B*T, P)
    return x_h.transpose(1, 2, 0).reshape(dx.shape), grads                  # (B, T, D)


def _softmax_no_outer(dy, cache):
    return cache.y * dy, {}                                   # the diagonal term only


def _rms_norm_first_term_only(dy, cache):
    return dy * cache.inv_rms, {}                             # forgets the term through the rms


def _leaky_relu_wrong_slope(dy, cache):
    return np.where(cache.gain == 1, dy, 0.01 * dy), {}       # 0.01 instead of the forward's 0.1


def _linear_bias(pick):
    def backward(dy, cache):
        dx, grads = kernels.linear_backward(dy, cache)
        return dx, {**grads, "b": pick(dy)}
    return backward


def _cross_entropy(transform):
    def backward(dloss, cache):
        (dlogits, none), grads = kernels.cross_entropy_backward(dloss, cache)
        return (transform(dlogits, cache), none), grads
    return backward


def _embedding_assigned(dout, cache):
    dE = np.zeros((cache.vocab, dout.shape[-1]), dtype=dout.dtype)          # (V, D)
    dE[cache.ids.reshape(-1)] = dout.reshape(-1, dout.shape[-1])            # last one wins
    return None, {"E": dE}


def _ff_b1_zero(dy, cache):
    dx, grads = kernels.ff_backward(dy, cache)
    return dx, {**grads, "b1": np.zeros_like(grads["b1"])}


def _dropout_mask_ignored(dy, cache):
    kept = cache.scale.max()                                                 # 1 / (1 - rate)
    return dy * kept, {}


def _dropout_unscaled(dy, cache):
    return dy * (cache.scale != 0), {}                                       # mask, no 1/(1 - rate)


def _layernorm(variant):
    def backward(dy, cache):
        dx, grads = kernels.layernorm_backward(dy, cache)
        if variant == "bias mean":
            grads = {**grads, "b": dy.reshape(-1, dy.shape[-1]).mean(axis=0)}
        else:  # forgets the term through the mean: the right dx with that term added back
            dxhat = dy * cache.g                                                 # (..., D)
            dx = dx + dxhat.mean(axis=-1, keepdims=True) * cache.inv_std         # (..., D)
        return dx, grads
    return backward


class Bug(NamedTuple):
    name: str
    row: Row
    backward: Callable
    tensor: str = ""     # where the pattern shows
    pattern: str = ""    # a phrase the diagnosis must contain; "" when no common shape applies


BUGS = [
    Bug("transposed weight gradient (W_O)", BY_NAME["mha"], _attn_grads(_transpose("WO")),
        "WO", "transposed (last two axes"),
    Bug("W_V gradient transposed per head", BY_NAME["mha"], _attn_grads(_transpose("WV")),
        "WV", "transposed per head"),
    Bug("dQ and dK swapped", BY_NAME["mha"], _attn_grads(_swap_qk), "WK", "dWK and dWQ are swapped"),
    Bug("heads merged with the wrong transpose in dx", BY_NAME["mha"],
        _attention_merged_p_major, "x", "width is laid out as (P, H)"),
    Bug("attention weights not transposed in dV", BY_NAME["mha"], _attention_a_untransposed,
        "WV", "the gradient takes the other operand untransposed"),
    Bug("missing 1/sqrt(P) in backward", BY_NAME["mha"], _attention_unscaled, "WQ",
        "scaled by a constant: sqrt(P)"),
    Bug("causal mask ignored in backward", BY_NAME["mha-causal"], _attention_mask_ignored, "WQ",
        "the right one for causal = False"),
    Bug("self-attention dx misses the key/value path", BY_NAME["mha"], _attention_query_path_only,
        "x", "missing the path through"),
    Bug("softmax Jacobian missing its outer-product term", BY_NAME["softmax"], _softmax_no_outer, "x",
        "missing the path through"),
    Bug("bias gradient summed over the wrong axis", BY_NAME["linear"],
        _linear_bias(lambda dy: dy.sum(axis=0)), "b", "missing a sum over a broadcast axis"),
    Bug("bias gradient from the first batch element only", BY_NAME["linear"],
        _linear_bias(lambda dy: dy[0].sum(axis=0)), "b", "missing a sum over output axis 0"),
    Bug("residual gradient dropped", BLOCK, lambda dy, c: block_backward(dy, c, keep_skip=False),
        "x", "skip connection"),
    Bug("RMS-norm missing its second term", BY_NAME["rms_norm"], _rms_norm_first_term_only, "x",
        "missing the path through `integer_pow`"),
    Bug("leaky-ReLU slope wrong in backward", BY_NAME["leaky_relu"], _leaky_relu_wrong_slope, "x",
        "is scaled by 1/10"),
    Bug("cross-entropy not divided by B·T", BY_NAME["cross_entropy"],
        _cross_entropy(lambda d, c: d * c.targets.size), "logits", "scaled by a constant: B·T"),
    Bug("cross-entropy gradient with the wrong sign", BY_NAME["cross_entropy"],
        _cross_entropy(lambda d, c: -d), "logits", "wrong sign"),
    Bug("embedding ids assigned, not accumulated", BY_NAME["embedding"], _embedding_assigned, "E",
        "repeated ids"),
    Bug("bias gradient never filled (left at zero)", BY_NAME["ff"], _ff_b1_zero, "b1",
        "identically zero"),
    Bug("dropout mask ignored in backward", BY_NAME["dropout"], _dropout_mask_ignored, "x",
        "wrong only where the mask 'mask'"),
    Bug("dropout backward forgets 1/(1 - rate)", BY_NAME["dropout"], _dropout_unscaled, "x",
        "scaled by a constant: 1 - rate"),
    Bug("layer-norm bias gradient averaged, not summed", BY_NAME["layernorm"],
        _layernorm("bias mean"), "b", "scaled by a constant: 1/(B·T)"),
    Bug("layer-norm missing the term through the mean", BY_NAME["layernorm"],
        _layernorm("no mean term"), "x", "missing the path through `reduce_sum`"),
]


@dataclasses.dataclass
class ZooResult:
    bug: Bug
    caught: bool
    failing: list
    diagnosis: str
    named: bool   # the expected pattern was named (True when none is expected)
    report: object


def run_bug(bug: Bug, dtype=np.float64, seed=0) -> ZooResult:
    """One bug's check: a registry row's case, or a layer outside the registry checked
    through check_layer as a user would (its own ``check``)."""
    check = getattr(bug.row, "check", None)
    report = check(dtype, seed, backward=bug.backward) if check else \
        run_row(bug.row, dtype, seed=seed, sizes=ZOO_SIZES, backward=bug.backward)
    shown = next((t for t in report.tensors if t.name == bug.tensor and not t.ok), None)
    diagnosis = shown.diagnosis if shown else ""
    if shown and not diagnosis:
        diagnosis = str(shown.verdict)
    return ZooResult(bug, not report.ok, report.failing, diagnosis,
                     bug.pattern in diagnosis if bug.pattern else True, report)


def sections():
    """(title, bugs): the lab's own layers, then layers the lab has never seen."""
    from checks.zoo_foreign import BUGS as FOREIGN
    return [("the lab's own layers", BUGS), ("layers outside the lab (checks/zoo_foreign.py)",
                                             FOREIGN)]


def run_zoo(dtype=np.float64, seed=0, bugs=None):
    return [run_bug(bug, dtype, seed) for bug in (BUGS if bugs is None else bugs)]


def counts(results):
    """(caught, explained, total): explained = the diagnosis names the bug's expected pattern
    (a bug shape, an oracle path or a structured location); a bug with no expected pattern is
    not explained, whatever its diagnosis says."""
    return (sum(r.caught for r in results), sum(r.named and bool(r.bug.pattern) for r in results),
            len(results))


def format_zoo(results, title="") -> str:
    head = ("bug", "layer", "caught", "failing", f"diagnosis (of the named tensor)")
    rows = [(r.bug.name, r.bug.row.name, "yes" if r.caught else "NO", ", ".join(r.failing),
             (f"{r.bug.tensor}: " if r.bug.tensor else "") + (r.diagnosis or "-")
             + ("" if r.named else "   <- expected: " + r.bug.pattern)) for r in results]
    widths = [max(len(x[i]) for x in rows + [head]) for i in range(len(head))]
    line = lambda x: "  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip()
    caught, explained, total = counts(results)
    return "\n".join(([title + ":"] if title else [])
                     + [line(head), line(["-" * w for w in widths])] + [line(x) for x in rows]
                     + [f"\n{caught} of {total} bugs caught; {explained} of {total} explained "
                        f"(the expected pattern named)"])
