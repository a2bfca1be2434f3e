"""What a wrong gradient most likely is, and where it is worst.

``diagnose`` compares the suspect gradient G with the trusted one R (autodiff when the hand leg
is wrong) and tests the common bug shapes in turn, from the most specific:

    cache fields exchanged  the hand backward, called again with two fields of its cache
                            exchanged (or two arguments of one call its code makes), returns
                            the trusted gradients, every tensor (an exact test by replay,
                            ``checks.replay``: the error itself has no shape)
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
    static ignored          G = the trusted gradient with a static argument at another value
                            (causal = False for True, an offset at its default)
    upstream                an element-wise derivative against dout: G dout = R (dout
                            forgotten), G = dout (the derivative forgotten), (G + R)/2 = dout
                            (1 + f for 1 - f: a sign error inside it, not a missing term)
    factor                  G f = R with f constant along some axes: a per-row (per-head ...)
                            factor left out of a product
    path off per slice      G - R = f c_k, one oracle path's contribution times a factor that
                            varies per row (head, token) only: a wrong operand or a missing
                            factor inside that path (a row mean of the wrong tensor)
    oracle paths            G - R = a sparse sum of the oracle's path contributions: a path
                            missing, scaled or with the wrong sign, a matrix product's other
                            operand untransposed or a wrong cached value (checks.attribution)
    substitutions           last: G is another tensor of the oracle's program whole (a value,
                            an input, a gradient: returned in place of this one), or G - R is
                            one to four substitutions: a step of the backward reading another
                            tensor of the same shape (or 1: a factor left out) in place of its
                            upstream gradient or of an operand of its derivative, or a step
                            skipped (checks.substitution); failing those, G = R T or G T = R
                            element by element, T a tensor of the case (a factor of a product
                            taken once too often or left out: the gain in a bias gradient)

A pattern fits when G and the transformed R agree to ``fit_tol`` (a few times the check's
tolerance), normwise.  When none fits, the diagnosis says so.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, NamedTuple

import numpy as np

from checks.attribution import fit_path_per_slice, fit_paths, representative
from checks.legs import normwise
from checks.localise import position, structure
from checks.substitution import (equal_to as substitution_equal, fit as substitution_fit,
                                 times as substitution_times)

NO_PATTERN = "no common bug pattern fits"
FIT_FACTOR = 8  # a pattern fits when G matches it within FIT_FACTOR x the check's tolerance


class Context(NamedTuple):
    """What the diagnosis may compare a tensor's gradient with, besides its trusted one."""
    trusted: dict                  # name -> trusted gradient of every checked tensor
    constants: list                # [(value, label, meaning)] the scale factors worth naming
    axes: dict                     # name -> axis names
    masks: list                    # [(label, boolean array: True where the mask applies)]
    ids: list                      # integer inputs (token ids), for repeated-id rows
    dout: np.ndarray               # the upstream gradient
    slice_vjp: Callable | None     # (axis, index) -> trusted grads with dout restricted to it
    heads: int | None = None       # H, when the layer splits its width into heads
    dtype: str = "float64"         # the checked dtype
    paths: Callable | None = None  # name -> (columns, sites) of checks.attribution, or None
    float64: Callable | None = None  # name -> (float64 hand gradient or None, passes,
    #                                  float64 tolerance) for a low-precision check
    other_static: Callable | None = None  # () -> [(label, trusted grads)]: the oracle's
    #                                  gradients with one static argument at another value
    replay: Callable | None = None    # () -> the replay's finding (checks.replay): two
    #                                  fields of the hand's cache, or two arguments of one call,
    #                                  whose exchange makes its backward right; '' for none


SMALL = [(2.0, "2"), (0.5, "1/2"), (-2.0, "-2"), (-0.5, "-1/2"), (3.0, "3"), (1 / 3, "1/3"),
         (4.0, "4"), (0.25, "1/4"), (10.0, "10"), (0.1, "1/10")]


def constants_from(sizes: dict | None, static: dict, shapes) -> list:
    """Scale factors of this case, most plausible first, each (value, label, meaning): small
    numbers, the static rates r (1 - r ...), then the case's own sizes: the declared sizes
    that are axis lengths of its tensors (a default the case overrides is no size of it), their
    products B·T, square roots and inverses, then unnamed axis lengths.  A small number is
    named as the number even where a size has its value (B = 2 in the zoo: the 0.5 of GELU
    dropped is no mean over B)."""
    out = [(v, label, "") for v, label in SMALL]
    for label, r in static.items():
        if isinstance(r, float) and 0 < r < 1:
            out += [(r, label, ""), (1 / r, f"1/{label}", ""), (1 - r, f"1 - {label}", ""),
                    (1 / (1 - r), f"1/(1 - {label})", "")]
        elif isinstance(r, (int, float, np.integer, np.floating)) \
                and not isinstance(r, (bool, np.bool_)) and r not in (0, 1, -1):
            # any other number the case is called with (a soft-cap of 6, a temperature)
            out += [(float(r), label, ""), (1 / float(r), f"1/{label}", ""),
                    (float(r) ** 2, f"{label}^2", ""), (1 / float(r) ** 2, f"1/{label}^2", "")]
    lengths = {int(n) for shape in shapes for n in shape if n > 1}
    named = {k: int(v) for k, v in (sizes or {}).items()
             if isinstance(v, (int, np.integer)) and v > 1 and int(v) in lengths}
    by_value = {}
    for k, v in named.items():  # one name per length: the first declared (B before H)
        by_value.setdefault(v, []).append(k)
    unique = {k: v for k, v in named.items() if by_value[v][0] == k}
    # a length two sizes share is named by both: "T or D" (the case cannot tell them apart)
    labels = {k: " or ".join(by_value[v]) for k, v in unique.items()}
    if "B" in unique and "T" in unique:
        unique["B·T"] = unique["B"] * unique["T"]
        labels["B·T"] = "B·T"
    for label, n in [(labels[k], v) for k, v in unique.items()] + [
            (str(n), n) for n in sorted(lengths) if n not in by_value]:
        wrap = f"({label})" if "·" in label or " or " in label else label
        out += [(float(n), label, ""), (1.0 / n, f"1/{wrap}", ""),
                (math.sqrt(n), f"sqrt({label})", ""), (1 / math.sqrt(n), f"1/sqrt({label})", "")]
    return out


def _broadcast_constants(shape, out_shape, names_of):
    """Means and sums over the output axes a tensor is broadcast over (a bias over B and T):
    (value, label, meaning) for every non-empty set of those leading axes."""
    if out_shape is None or len(out_shape) <= len(shape) or \
            tuple(out_shape[len(out_shape) - len(shape):]) != tuple(shape):
        return []
    lead = range(len(out_shape) - len(shape))
    found = []
    for r in range(len(lead), 0, -1):
        for axes in itertools.combinations(lead, r):
            n = int(np.prod([out_shape[a] for a in axes]))
            if n < 2:
                continue
            which = " and ".join(str(a) for a in axes)
            label = names_of(n) or "·".join(str(out_shape[a]) for a in axes)
            wrap = f"({label})" if "·" in label else label
            word = "axes" if r > 1 else "axis"
            found += [(1.0 / n, f"1/{wrap}", f"the mean over output {word} {which} instead of "
                                             f"the sum"),
                      (float(n), label, f"the sum over output {word} {which} instead of the "
                                        f"mean")]
    return found


def name_constant(c: float, constants, rel: float) -> str:
    """One explanation of c: the first (most plausible) constant of the list within rel,
    '2', 'sqrt(P) = 2.449', '1/(B·T) = 0.06667 (the mean over ...)', else the bare number."""
    text, meaning = _constant(c, constants, rel)
    return text + (f" ({meaning})" if meaning else "")


def _constant(c, constants, rel):
    for entry in constants:
        value, label = entry[0], entry[1]
        if abs(c - value) <= rel * abs(value):
            simple = label.lstrip("-").replace("/", "").replace(".", "").isdigit()
            return (label if simple else f"{label} = {value:.4g}"), \
                (entry[2] if len(entry) > 2 else "")
    return f"{_number(c)} (not a constant of this case)", ""


def _number(c: float) -> str:
    """c to 4 significant digits, or as 1 + d where that would print a scale near 1 as "1"."""
    if c != 1 and abs(c - 1) < 5e-4:
        return f"1 {'+' if c > 1 else '-'} {abs(c - 1):.2g}"
    return f"{c:.4g}"


def locate(index, shape, axis_names) -> str:
    """'batch 3, head 1, query 7, key 2' with axis names, 'index (3, 1, 7, 2)' otherwise."""
    return position(index, shape, axis_names)


def worst_index(g, ref):
    """Index of the largest |g - ref|, or None when there is nothing finite to compare."""
    if g.shape != ref.shape or not g.size or not (np.all(np.isfinite(g)) and np.all(np.isfinite(ref))):
        return None
    diff = np.abs(g - ref)
    return tuple(int(i) for i in np.unravel_index(int(diff.argmax()), diff.shape))


def of_autodiff(sentence: str) -> str:
    """A diagnosis of the oracle's gradient (the suspect when the oracle is blamed), which
    ``diagnose`` words as of the hand's."""
    return sentence.replace("the hand's", "autodiff's").replace("the hand ", "autodiff's ")


def diagnose(name: str, g: np.ndarray, ref: np.ndarray, ctx: Context, tol: float) -> str:
    """What the suspect gradient g most likely is, against its trusted gradient ref: a common
    bug shape, else the sparse set of the oracle's paths that explains it, and where it is wrong
    (axis by axis) when that is structured."""
    fit = FIT_FACTOR * tol
    if g.shape != ref.shape:
        return _diagnose_shape(g, ref, fit)
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(ref))):
        return ""
    small = _small(name, g, ref, ctx, fit)
    if small is not None:
        return small
    if ctx.float64 is not None:  # a low-precision check: explain the float64 run's error,
        g64, passes, tol64 = ctx.float64(name)  # the bug without the dtype's rounding
        if not passes and g64 is not None and g64.shape == ref.shape \
                and np.all(np.isfinite(g64)):
            g, fit = g64, FIT_FACTOR * tol64
    found = ""
    for test in (_replayed, _zero, _scaled, _transposed, _heads_mixed, _swapped, _masked, _repeated_ids,
                 _one_slice, _skip_dropped, _static_ignored, _paths, _upstream, _factor,
                 _path_per_slice, _substituted):
        found = test(name, g, ref, ctx, fit)
        if found:
            break
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    where = structure(np.abs(g - ref) > fit * scale, ctx.axes.get(name)) if scale else ""
    if found and where and not found.startswith("wrong only where"):
        return f"{found}; {where}"
    return found or where or NO_PATTERN


def _small(name, g, ref, ctx, fit):
    """An error within FIT_FACTOR x the tolerance of the right gradient: rounding only when the
    float64 check of the same kernel passes (an ill-conditioned case in a low precision);
    otherwise a small but real error, explained like any other (None: go on)."""
    if not _close(g, ref, fit):
        return None
    if ctx.float64 is not None:
        _, passes, _ = ctx.float64(name)
        if passes:
            return (f"no bug shape: within {FIT_FACTOR}x the {ctx.dtype} tolerance of the right "
                    f"gradient, and the float64 check of the same kernel passes (rounding in an "
                    f"ill-conditioned case)")
    return None


def _close(a, b, fit):
    return normwise(a, b) <= fit


def _replayed(name, g, ref, ctx, fit):
    """Two fields of the hand's cache, or two arguments of one of its calls, in each other's
    place: the replay that exchanges them makes every gradient right (``checks.replay``), an
    exact test where the error itself has no shape."""
    return (ctx.replay() or "") if ctx.replay is not None else ""


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
        return (f"a small error ({normwise(g, ref):.2g} of the largest element) that no bug "
                f"shape explains" + ("; the float64 check fails too" if ctx.float64 else ""))
    if abs(c + 1) <= max(fit, 1e-6):
        return "wrong sign: the gradient is -1 x the right one"
    names_of = _size_namer(ctx.constants)
    constants = list(ctx.constants[:len(SMALL)]) + _broadcast_constants(
        g.shape, ctx.dout.shape, names_of) + list(ctx.constants[len(SMALL):])
    text, meaning = _constant(c, constants, max(fit, 1e-6))
    return f"scaled by a constant: {text} x the right one" + (f": {meaning}" if meaning else "")


def _size_namer(constants):
    """n -> the label of a declared size (or product) equal to n, else ''."""
    labels = {}
    for value, label, _ in constants[len(SMALL):]:
        if value >= 2 and float(value).is_integer() and not label.isdigit():
            labels.setdefault(int(value), label)
    return lambda n: labels.get(int(n), "")


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
    regions = list(ctx.masks)  # triangles of equal-length axes: checks.localise
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


def _upstream(name, g, ref, ctx, fit):
    """An element-wise layer's local derivative gone wrong, read against the upstream gradient
    dout: its factor dout forgotten (G dout = R), the derivative forgotten (G = dout), or the
    sign of its non-constant term flipped (1 + f for 1 - f: G and R average to dout)."""
    d = ctx.dout
    if g.shape != d.shape or not d.size or _close(ref, d, fit):
        return ""
    if _close(g * d, ref, fit):
        return ("the upstream gradient is missing as a factor: hand x dout equals the right "
                "gradient (the local derivative returned without the chain rule's dout)")
    if _close(g, d, fit):
        return ("the local derivative is missing: the hand gradient is dout passed through "
                "unchanged (every term of the derivative but its constant 1 dropped)")
    if _close(0.5 * (g + ref), d, fit):
        return ("a sign error inside the local derivative: hand and right average to dout, "
                "as 1 + f for 1 - f (not a missing term: that would give dout itself)")
    return ""


def _factor(name, g, ref, ctx, fit):
    """A factor left out of (or added to) a product: G f = R with f constant along some axes
    (a per-row normaliser, a per-head scale), one value per index of the others.  The largest
    set of axes that fits is named; a factor constant along every axis is _scaled's."""
    if g.ndim < 2 or float(np.sum(g * g)) == 0.0:
        return ""
    labels = list(ctx.axes.get(name) or [f"axis {i}" for i in range(g.ndim)])
    for r in range(g.ndim - 1, 0, -1):
        for along in itertools.combinations(range(g.ndim), r):
            if any(g.shape[a] < 2 for a in along):  # f would hold one value per element
                continue
            gg = np.sum(g * g, axis=along, keepdims=True)
            f = np.sum(g * ref, axis=along, keepdims=True) / np.where(gg > 0, gg, 1.0)
            if not _close(g * f, ref, fit) or np.ptp(f) <= fit * float(np.max(np.abs(f))):
                continue
            const = ", ".join(labels[a] for a in along)
            per = ", ".join(labels[a] for a in range(g.ndim) if a not in along)
            return (f"a factor is missing or extra: hand x f equals the right gradient with f "
                    f"constant along {const} (one value per {per}: a per-{per} scale such as "
                    f"a normaliser left out of a product)")
    return ""


def _static_ignored(name, g, ref, ctx, fit):
    """The right gradient of the layer with one static argument at another value (a causal
    flag, a position offset): the backward ignores that argument."""
    for label, grads in (ctx.other_static() if ctx.other_static is not None else []):
        other = grads.get(name)
        if other is not None and other.shape == g.shape and _close(g, other, fit) \
                and not _close(ref, other, fit):
            return (f"the backward ignores a static argument: the gradient is the right one "
                    f"for {label}")
    return ""


def _paths(name, g, ref, ctx, fit):
    """The sparse set of the oracle's paths whose contributions explain g - ref."""
    columns, sites, found = _fitted(fit_paths, name, g, ref, ctx, fit)
    if found is None:
        return ""
    rel = max(fit, 1e-6)
    phrases = []
    for k, a in found.terms:
        site = sites[representative(k, columns, sites, fit)]
        phrases.append(_path_phrase(site, a, ctx.constants, rel))
    return "; ".join(phrases)


def _fitted(fitter, name, g, ref, ctx, fit):
    """(columns, sites, what fitter found in g - ref or None) from the oracle's paths."""
    got = ctx.paths(name) if ctx.paths is not None else None
    if got is None:
        return None, None, None
    columns, sites = got
    return columns, sites, fitter(g - ref, columns, sites, ref, fit)


def _path_per_slice(name, g, ref, ctx, fit):
    """g - ref = f c_k: one path's contribution times a factor that varies per row (per head,
    per feature) and is constant along the other axes: a wrong operand or a factor missing
    inside that path (a row mean of the wrong tensor, a normaliser left out)."""
    columns, sites, found = _fitted(fit_path_per_slice, name, g, ref, ctx, fit)
    if found is None:
        return ""
    k, along = found
    labels = list(ctx.axes.get(name) or [f"axis {i}" for i in range(g.ndim)])
    const = ", ".join(labels[a] for a in along)
    per = ", ".join(labels[a] for a in range(g.ndim) if a not in along)
    site = sites[representative(k, columns, sites, fit)]
    return (f"the path through {site.describe()} is off by a factor per {per} (constant along "
            f"{const}): the hand's error is that path's contribution times it, a wrong operand "
            f"or a missing factor inside that path")


def _substituted(name, g, ref, ctx, fit):
    """g - ref = the sum of one to three substitutions' columns (checks.substitution): a step
    of the backward read another tensor of the program (a value or a gradient) in place of
    its upstream gradient or of a product's other operand."""
    columns = getattr(ctx.paths, "substitutions", None) if ctx.paths is not None else None
    got = columns(name) if columns is not None else None
    if got is None:
        return ""
    column, catalogue = got
    whole = substitution_equal(g, ref, catalogue.tensors, fit)
    if whole is not None:
        tensor, moved = whole
        return (f"the hand d{name} is {tensor.describe()}"
                + (" (its axes reordered or reshaped to fit)" if moved else "")
                + f": another tensor returned in place of d{name}")
    found = substitution_fit(g - ref, column, catalogue.subs, ref, fit)
    if found is not None:
        return "; ".join(s.describe() for s in found.subs)
    product = substitution_times(g, ref, catalogue.tensors, fit)
    if product is None:
        return ""
    tensor, extra = product
    if extra:
        return (f"the hand d{name} is the right gradient times {tensor.describe()}, element by "
                f"element: a factor of a product taken once too often")
    return (f"the hand d{name} times {tensor.describe()}, element by element, is the right "
            f"gradient: a factor of a product left out")


def _path_phrase(site, a, constants, rel):
    what = site.describe()
    if site.kind == "other operand":
        if abs(a - 1) <= rel:
            return (f"in {what} the gradient takes {site.alt} as the other operand (a wrong "
                    f"cached value)")
        return f"in {what} the gradient mixes in {site.alt} as the other operand ({a:.3g} x)"
    if site.kind == "untransposed":
        if abs(a - 1) <= rel:
            return (f"in {what} the gradient takes the other operand untransposed (two of its "
                    f"axes swapped)")
        return f"in {what} the gradient mixes the other operand untransposed ({a:.3g} x)"
    if abs(a + 1) <= rel:
        return f"missing the path through {what}"
    if abs(a + 2) <= rel:
        return f"the path through {what} has the wrong sign"
    return f"the path through {what} is scaled by {name_constant(1 + a, constants, rel)}"


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
