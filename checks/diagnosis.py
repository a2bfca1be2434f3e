"""What a wrong gradient most likely is, and where it is worst.

``diagnose`` compares the suspect gradient G with the trusted one R (autodiff when the hand leg
is wrong) and tests the common bug shapes in turn, from the most specific:

    identically zero        G = 0
    wrong sign              G = -R
    scaled by a constant    G = c R, c named when it is 2, 1/2, sqrt(P), 1/(B·T), 1 - rate ...
    transposed              G = R with its last two axes swapped (per head for (H, P, P)), or
                            a width D = H P laid out as (P, H): heads merged the wrong way
    swapped                 G = the trusted gradient of another tensor of the same shape
    masked region           G = R except where a mask applies (causal triangle, dropout mask)
    repeated ids            G = R except in the rows of ids that occur more than once
    missing a sum           G = the gradient of one slice of a broadcast axis only, or G carries
                            an extra leading axis that, summed, gives R
    skip connection dropped G + dout = R

A pattern fits when G and the transformed R agree to ``fit_tol`` (a few times the check's
tolerance), normwise.  When none fits, the diagnosis says so.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, NamedTuple

import numpy as np

from checks.legs import normwise

NO_PATTERN = "no common bug pattern fits"
FIT_FACTOR = 8  # a pattern fits when G matches it within FIT_FACTOR x the check's tolerance


class Context(NamedTuple):
    """What the diagnosis may compare a tensor's gradient with, besides its trusted one."""
    trusted: dict                  # name -> trusted gradient of every checked tensor
    constants: list                # [(value, label)] the scale factors worth naming
    axes: dict                     # name -> axis names
    masks: list                    # [(label, boolean array: True where the mask applies)]
    ids: list                      # integer inputs (token ids), for repeated-id rows
    dout: np.ndarray               # the upstream gradient
    slice_vjp: Callable | None     # (axis, index) -> trusted grads with dout restricted to it
    heads: int | None = None       # H, when the layer splits its width into heads


def constants_from(sizes: dict | None, static: dict, shapes) -> list:
    """Scale factors a bug commonly introduces, each with a label: small ones, the layer's sizes
    (n, 1/n, sqrt(n), 1/sqrt(n), B·T), and a rate r among the static arguments (1 - r...)."""
    out = [(2.0, "2"), (0.5, "1/2"), (-2.0, "-2"), (-0.5, "-1/2"), (4.0, "4"), (0.25, "1/4")]
    named = dict(sizes or {})
    if not named:  # no declared sizes: every distinct axis length, unnamed
        for n in sorted({int(n) for shape in shapes for n in shape if n > 1}):
            named[f"n={n}"] = n
    elif "B" in named and "T" in named:
        named["B·T"] = named["B"] * named["T"]
    for label, n in named.items():
        if not isinstance(n, (int, np.integer)) or n <= 1:
            continue
        wrap = f"({label})" if "·" in label else label
        out += [(float(n), label), (1.0 / n, f"1/{wrap}"),
                (math.sqrt(n), f"sqrt({label})"), (1 / math.sqrt(n), f"1/sqrt({label})")]
    for label, r in static.items():
        if isinstance(r, float) and 0 < r < 1:
            out += [(r, label), (1 / r, f"1/{label}"), (1 - r, f"1 - {label}"),
                    (1 / (1 - r), f"1/(1 - {label})")]
    return out


def name_constant(c: float, constants, rel: float) -> str:
    """'2', 'sqrt(P) = 2.45', '2 = sqrt(P)' or '2.37' when no constant of the list is that close."""
    hits = []
    for value, label in constants:
        if abs(c - value) <= rel * abs(value) and label not in hits:
            hits.append(label)
    if not hits:
        return f"{c:.4g} (not a simple constant)"
    pretty = " = ".join(hits)
    return pretty if hits[0].lstrip("-").replace("/", "").replace(".", "").isdigit() \
        else f"{pretty} = {c:.3g}"


def locate(index, shape, axis_names) -> str:
    """'batch 3, head 1, query 7, key 2' with axis names, a flat index otherwise."""
    if index is None:
        return ""
    if axis_names and len(axis_names) == len(shape):
        return ", ".join(f"{a} {i}" for a, i in zip(axis_names, index))
    flat = int(np.ravel_multi_index(index, shape)) if shape else 0
    return f"flat index {flat}"


def worst_index(g, ref):
    """Index of the largest |g - ref|, or None when there is nothing finite to compare."""
    if g.shape != ref.shape or not g.size or not (np.all(np.isfinite(g)) and np.all(np.isfinite(ref))):
        return None
    diff = np.abs(g - ref)
    return tuple(int(i) for i in np.unravel_index(int(diff.argmax()), diff.shape))


def diagnose(name: str, g: np.ndarray, ref: np.ndarray, ctx: Context, tol: float) -> str:
    """The first common bug shape that fits g against its trusted gradient ref."""
    fit = FIT_FACTOR * tol
    if g.shape != ref.shape:
        return _diagnose_shape(g, ref, fit)
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(ref))):
        return ""
    for test in (_zero, _scaled, _transposed, _heads_mixed, _swapped, _masked, _repeated_ids,
                 _one_slice, _skip_dropped):
        found = test(name, g, ref, ctx, fit)
        if found:
            return found
    return NO_PATTERN


def _close(a, b, fit):
    return normwise(a, b) <= fit


def _zero(name, g, ref, ctx, fit):
    if float(np.max(np.abs(g))) <= fit * float(np.max(np.abs(ref))):
        return "the gradient is identically zero"
    return ""


def _scaled(name, g, ref, ctx, fit):
    rr = float(np.sum(ref * ref))
    if rr == 0.0:
        return ""
    c = float(np.sum(g * ref)) / rr  # least-squares factor
    if not _close(g, c * ref, fit):
        return ""
    if abs(c - 1) <= fit:
        return (f"no bug shape: within {FIT_FACTOR}x the tolerance of the right gradient "
                f"(rounding in an ill-conditioned case?)")
    if abs(c + 1) <= max(fit, 1e-6):
        return "wrong sign: the gradient is -1 x the right one"
    return f"scaled by a constant: {name_constant(c, ctx.constants, max(fit, 1e-6))} x the right one"


def _transposed(name, g, ref, ctx, fit):
    if g.ndim < 2 or g.shape[-1] != g.shape[-2] or not _close(g, np.swapaxes(ref, -1, -2), fit):
        return ""
    axes = ctx.axes.get(name) or ()
    per_head = g.ndim == 3 and (not axes or axes[0] == "head")
    return "transposed per head (last two axes swapped)" if per_head else \
        "transposed (last two axes swapped)"


def _heads_mixed(name, g, ref, ctx, fit):
    """Width D = H P laid out as (P, H) instead of (H, P): heads split or merged transposed."""
    H = ctx.heads
    if not H or H < 2 or g.ndim < 1 or g.shape[-1] % H or g.shape[-1] == H:
        return ""
    P = g.shape[-1] // H
    mixed = ref.reshape(g.shape[:-1] + (H, P)).swapaxes(-1, -2).reshape(g.shape)
    if _close(g, mixed, fit):
        return ("transposed per head: the width is laid out as (P, H) instead of (H, P) "
                "(heads split or merged with the wrong transpose)")
    return ""


def _swapped(name, g, ref, ctx, fit):
    for other, r in ctx.trusted.items():
        if other != name and r.shape == g.shape and _close(g, r, fit) and not _close(ref, r, fit):
            return (f"looks like d{name} and d{other} are swapped (the hand d{name} equals the "
                    f"true d{other})")
    return ""


def _masked(name, g, ref, ctx, fit):
    scale = float(np.max(np.abs(ref)))
    wrong = np.abs(g - ref) > fit * scale
    regions = list(ctx.masks)
    axes = ctx.axes.get(name) or ()
    if "query" in axes and "key" in axes:  # the causal triangle: keys after the query
        qa, ka = axes.index("query"), axes.index("key")
        q = np.arange(g.shape[qa]).reshape([-1 if i == qa else 1 for i in range(g.ndim)])
        k = np.arange(g.shape[ka]).reshape([-1 if i == ka else 1 for i in range(g.ndim)])
        regions.append(("the causal mask (keys after the query)", np.broadcast_to(k > q, g.shape)))
    for label, region in regions:
        if np.shape(region) != g.shape:
            continue
        if wrong.any() and not wrong[~region].any():
            return f"wrong only where {label} applies"
    return ""


def _repeated_ids(name, g, ref, ctx, fit):
    scale = float(np.max(np.abs(ref)))
    wrong_rows = (np.abs(g - ref) > fit * scale).reshape(g.shape[0], -1).any(axis=1)
    for ids in ctx.ids:
        if ids.size == 0 or ids.max() >= g.shape[0]:
            continue
        repeated = np.bincount(ids.reshape(-1), minlength=g.shape[0]) > 1
        if wrong_rows.any() and not wrong_rows[~repeated].any():
            return ("wrong only in the rows of repeated ids: missing a sum over repeated "
                    "positions (assigned, not accumulated)")
    return ""


def _one_slice(name, g, ref, ctx, fit):
    """A parameter broadcast over the batch whose gradient kept one slice instead of the sum."""
    if ctx.slice_vjp is None or g.ndim >= ctx.dout.ndim:  # only what is broadcast over dout
        return ""
    for axis, index in itertools.product(range(ctx.dout.ndim - 1), (0, -1)):
        if ctx.dout.shape[axis] < 2:
            continue
        part = ctx.slice_vjp(axis, index).get(name)
        if part is not None and part.shape == g.shape and _close(g, part, fit):
            n = ctx.dout.shape[axis]
            return (f"missing a sum over output axis {axis} (size {n}): the gradient equals "
                    f"the contribution of index {index % n} alone")
    return ""


def _skip_dropped(name, g, ref, ctx, fit):
    if g.shape == ctx.dout.shape and _close(g + ctx.dout, ref, fit):
        return "the skip connection's gradient is missing: hand + dout equals the right gradient"
    return ""


def _diagnose_shape(g, ref, fit):
    """A misshapen gradient: transposed, or with an extra leading axis left unsummed."""
    if g.shape == ref.shape[::-1] or (g.ndim >= 2 and g.shape[:-2] + g.shape[-2:][::-1] == ref.shape):
        return "its shape is the transpose of the expected one"
    extra = g.ndim - ref.ndim
    if extra > 0 and g.shape[extra:] == ref.shape:
        summed = np.sum(g, axis=tuple(range(extra)))
        if _close(summed, ref, fit):
            return (f"missing a sum over a broadcast axis: summed over its leading axis of size "
                    f"{g.shape[0]} it equals the right gradient")
        return f"it has an extra leading axis of size {g.shape[0]} (a sum over it missing?)"
    return ""
