"""The aggregate test: the bias of the hand error along autodiff's gradient, tensor and slices.

The element-wise rule (``checks.tolerances``) judges each element against its own rounding
spread, LAMBDA = 8 spreads wide: an error of a few spreads in every element passes, however
many elements share it.  A wrong constant, a row scaled by 1.05, a missing term along one head
are errors of one sign and size across many elements; their mean is what rounding cannot make.
For a gradient g (autodiff's) and the hand error e = h - g, the statistic of a set of elements
S (the whole tensor, or one slice: one index of one axis, a row, a head, a token) is

    b_S = sum_S e_i g_i / sum_S g_i^2,

the relative scale of the hand along g on S (a slice scaled by 1 + eps has b_S = eps exactly).
Its null distribution comes from the rounding model's own perturbed runs
(``checks.rounding``): each sample's deviation from the exact run, projected the same way,
is a draw of b_S for a correct implementation, and the root-mean-square of those draws per
part of the program (``Spread.bias``) is scaled to the check's roundoffs as the element-wise
spread is (``Spread.at``).  A set passes when

    |b_S| <= band_S = BIAS_LAMBDA sigma_S + BIAS_ULPS u_c + round_S + kink_S,

* sigma_S: the model's rms of b_S (the samples' projections over sum_S g^2), or, where larger,
  the rms the same element spreads s_i give errors independent between elements,
  sqrt(sum_S s_i^2 g_i^2) / sum_S g_i^2 (a kernel that orders its operations otherwise than the
  oracle's program need not share the model's correlations: a peaked softmax's gradient
  cancels along g in the program, not in every kernel); BIAS_LAMBDA = 3.36 of them.  The
  model draws every rounding with rms u (xi ~ N(0, 1) times the bound), where rounding to
  nearest errs by at most u, uniformly within half a unit in the last place, so with rms at
  most u / sqrt(3): 3.36 model spreads are at least 5.8 spreads of a correct kernel's real
  bias, and with the spread estimated from SAMPLES = 64 samples per part, P(|t_64| > 5.8) =
  2e-7 per set (``checks.tolerances.student``; LAMBDA = 8 of the element-wise rule asks
  P(|t_64| > 8) = 3e-11 of the model's own spread, the model taken as exact).  The
  calibration measures the margin: correct kernels' biases stay within about 1.5 model
  spreads (docs/tolerances.md);
* BIAS_ULPS u_c, the floor, BIAS_ULPS = 2: a kernel's rounded constants (1/sqrt(P), leaky
  ReLU's slope, 1/n) scale a whole tensor by up to u each of the format they are held in (u_c,
  the largest roundoff of the parts of the program at the check's roundoffs: float32's for a
  half-precision kernel computing in float32, the format's for plain NumPy), up to two of them
  along a path; the model perturbs no literal the oracle folds into its program;
* round_S: the final rounding of what the kernel returns, which the element-wise rule allows
  as its ULPS term and the model does not perturb (a half-precision kernel computing in
  float32 rounds once to the format): u, the bound of |sum_S r_i g_i| / sum_S g_i^2 when every
  |r_i| <= u |g_i|, whatever the roundings' correlation (equal values round alike: a dominant
  class's rows gave a whole-tensor bias of 0.7 u in bfloat16, which an independent-rounding
  rms would have failed); below the format's normal range the rounding is absolute, so
  round_S adds tiny sum_S |g_i| / sum_S g_i^2, tiny the element-wise rule's ULPS smallest
  subnormals (an element of 2.3e-7 rounds to 1.8e-7 in float16, whose subnormals are 6e-8
  apart: a dominant class's small gradients and a peaked attention's failed the half-precision
  calibration without it, four checks in 5000).  Each set is also judged beyond the rounding
  that is known, and fails either test: fl(g_i), g rounded to the format returned, is computed
  exactly, so b_S - known_S (known_S the bias of fl(g) - g) moves only where the kernel's
  value before its rounding crosses a point halfway between two of the format's numbers, and
  its band has, for round_S, what the elements within reach of such a point can move it by
  (``final_rounding``).  A half-precision kernel computing in float32 errs inside by
  float32's few u: over a large set few of its elements lie that close, and the bound is a
  small part of u (under u / 20 for 4000 plain random elements);
* kink_S: elements within rounding of a kink may take either branch (``RoundingModel.kinks``):
  sum_S |moved_i| |g_i| / sum_S g_i^2 bounds what that does to b_S.  An element that a flip
  moves by more than its own rounding spread (|moved_i| > s_i) is left out of every set
  (``Bands.keep``): a correct kernel may move it by a whole branch's difference, which one
  element can make larger than the rest of the set's band (one flip of leaky ReLU in one of a
  feed-forward block's 2048 tokens moves its db1's whole-tensor bias by about 2e-5), and the
  element-wise rule judges it with that move in its tolerance.  The statistic, its band and
  FD's direction are then those of the rest of the set.

A set whose g is identically zero is not judged (no direction to be biased along).  A tensor
or slice outside its band fails; the blame follows finite differences along that set's own
direction v = g restricted to S (``examine``): FD sides with autodiff when it lands within its
own tolerance of <g, v> and the hand's <h, v> misses it by DECISIVE times FD's tolerance plus
the hand's band, as ``checks.evidence`` decides at single elements.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from checks.evidence import Element, along, blame
from checks.verdict import Verdict


def slice_axes(shape) -> tuple:
    """The axes whose indices are slices: every axis of a tensor of rank 2 or more (a vector's
    slice would be one element, which the element-wise rule judges)."""
    return tuple(range(len(shape))) if len(shape) >= 2 else ()


def slice_count(shape) -> int:
    """How many sets a tensor of this shape has: the whole tensor, then every slice."""
    return 1 + sum(shape[a] for a in slice_axes(shape))


def slice_sums(a, lead=0, xp=np, reduce="sum"):
    """Sums of a over the whole tensor and over every slice, concatenated along the last axis:
    (*lead dims, slice_count(shape)) for a of shape (*lead dims, *shape).  xp: numpy or
    jax.numpy (``checks.rounding`` projects its samples with it); reduce="max": the maxima."""
    shape = tuple(a.shape[lead:])
    head = tuple(a.shape[:lead])
    op = getattr(xp, reduce)
    parts = [xp.reshape(op(xp.reshape(a, head + (-1,)), axis=-1), head + (1,))]  # whole
    for axis in slice_axes(shape):
        others = tuple(lead + j for j in range(len(shape)) if j != axis)
        parts.append(op(a, axis=others))                               # (*head, shape[axis])
    return xp.concatenate(parts, axis=-1)


def slice_labels(shape, axes=None) -> list:
    """A name for every set of ``slice_sums``: "the whole tensor", "index 3 of axis 0" (or of
    the axis's name when the caller named them: "index 3 of axis 'head'")."""
    labels = ["the whole tensor"]
    for axis in slice_axes(shape):
        name = f"axis '{axes[axis]}'" if axes and axis < len(axes) else f"axis {axis}"
        labels += [f"index {i} of {name}" for i in range(shape[axis])]
    return labels


def slice_mask(shape, k) -> tuple:
    """The index (for a[...]) of set k of ``slice_sums``."""
    if k == 0:
        return (Ellipsis,)
    k -= 1
    for axis in slice_axes(shape):
        if k < shape[axis]:
            where = [slice(None)] * len(shape)
            where[axis] = k
            return tuple(where)
        k -= shape[axis]
    raise IndexError(f"set {k}: a tensor of shape {shape} has {slice_count(shape)} sets")


def pools(g2, g4, policy):
    """Per set, from its sum g^2 and sum g^4: is it carried by at least BIAS_MIN_ELEMENTS
    elements, (sum g^2)^2 / sum g^4, so that the aggregate test judges it?"""
    return (g2 > 0) & (g2 ** 2 >= policy.BIAS_MIN_ELEMENTS * g4)


class Bands(NamedTuple):
    """The aggregate test of one tensor: per set (``slice_sums``' order), sum g^2 and the band
    of b over the set's kept elements; sets with sum g^2 = 0, or carried by fewer than
    BIAS_MIN_ELEMENTS elements, have an infinite band (not judged)."""
    norms: np.ndarray   # (sets,) sum_S g_i^2 over the kept elements
    band: np.ndarray    # (sets,) band_S
    keep: np.ndarray | float = 1.0   # like g: 1 where an element is judged, 0 where a kink's
    #                                  move exceeds its rounding (module docstring)
    known: np.ndarray | None = None  # (sets,) the bias of fl(g) - g, g rounded to the format
    #                                  the kernel returns (``final_rounding``)
    beyond: np.ndarray | None = None  # (sets,) the band of the bias beyond it


def bands(projection_rms, element_rms, g, moved, *, floor_u, final_u, policy,
          tiny=0.0, dtype=None) -> Bands:
    """Bands of a tensor (module docstring): projection_rms the model's rms of sum_S d_i g_i at
    the check's roundoffs (``Spread.bias.at``), element_rms its rms per element (``Spread.at``),
    g autodiff's gradient, moved the kink bound (an array like g, or 0), floor_u the roundoff
    of the constants, final_u the format returned, tiny the absolute error that format allows
    an element below its normal range (the element-wise rule's ULPS smallest subnormals);
    dtype, the format returned, adds the bands beyond its known rounding (``final_rounding``)."""
    g = np.asarray(g, np.float64)
    element_rms = np.asarray(element_rms, np.float64)
    moved = np.abs(np.broadcast_to(moved, g.shape))
    keep = (moved <= element_rms).astype(np.float64) if np.any(moved) else 1.0
    everywhere = np.sqrt(slice_sums((element_rms * g) ** 2))
    g = g * keep  # left-out elements weigh nothing in any set
    g2 = slice_sums(g * g)
    # the model's deviations are correlated as the oracle's program makes them; a correct
    # kernel that orders its operations otherwise errs independently element by element, with
    # the same rms: its projection's rms is sqrt(sum_S s_i^2 g_i^2) (a gradient that cancels
    # along g in the oracle's program, as a peaked softmax's, need not cancel in the kernel's)
    independent = np.sqrt(slice_sums((element_rms * g) ** 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        # the model's projections are over whole sets: with elements left out, in proportion
        # to the independent rms of what is kept
        correlated = np.asarray(projection_rms, np.float64) * np.where(
            everywhere > 0, independent / everywhere, 1.0)
        sigma = np.maximum(correlated, independent) / g2
        # the final rounding to the returned format, |r_i| <= final_u |g_i|, moves b_S by at
        # most final_u whatever its correlation: equal values round alike (a dominant class's
        # rows: a whole-tensor bias of 0.7 u in bfloat16), so no independence is assumed
        kink = slice_sums(moved * np.abs(g)) / g2
        # below the format's normal range its rounding is absolute, not relative: an element
        # of autodiff's 2.3e-7 is 1.8e-7 in float16, whose subnormals are 6e-8 apart
        subnormal = tiny * slice_sums(np.abs(g)) / g2
        inner = policy.bias_lambda(dtype) * sigma + policy.BIAS_ULPS * floor_u + kink
        band = inner + final_u + subnormal
        # a set carried by a few elements (a slice of one element, a dominant class's logit, a
        # peaked attention row) pools nothing: its errors are the element-wise rule's to judge,
        # at LAMBDA (calibration in float16: such sets failed at up to 2e3 times this band)
        judged = pools(g2, slice_sums(g ** 4), policy)
        if dtype is None:
            return Bands(g2, np.where(judged, band, np.inf), keep)
        reach = (policy.LAMBDA * element_rms + policy.BIAS_ULPS * floor_u * np.abs(g)
                 + moved * keep)
        # a second test of each set, beyond fl(g): its crossings' band (tight where few
        # elements lie within reach of a rounding boundary; where many do, the bound u of any
        # rounding is the tighter)
        known, crossings = final_rounding(g, g2, dtype, reach)
        beyond = inner + crossings
    return Bands(g2, np.where(judged, band, np.inf), keep, known,
                 np.where(judged, beyond, np.inf))


def final_rounding(g, g2, dtype, reach):
    """The final rounding of what a kernel returns, known but for its crossings: (known,
    crossings) per set.

    A kernel returns h_i = fl(g_i + d_i), d_i its error before the rounding to the format (its
    operations inside; for the lab's half-precision kernels, float32's few u).  fl(g_i) is known
    exactly, so b_S - known_S, known_S = sum_S (fl(g_i) - g_i) g_i / sum_S g_i^2, is the bias
    of f_i = h_i - fl(g_i), which is non-zero only where g_i + d_i rounds elsewhere than g_i.
    With |d_i| <= reach_i (LAMBDA model spreads, the element-wise rule's bound, the constants'
    floor and the kink's move), an element rounds elsewhere only if g_i - reach_i or
    g_i + reach_i does, and then by at most step_i = max |fl(g_i +- reach_i) - fl(g_i)|; every
    other element has f_i = 0 exactly.  ``crossings`` is sum_S step_i |g_i| / sum_S g_i^2, a
    bound whatever the signs and correlations of the d_i: it assumes nothing of where g_i sits
    among the format's numbers (rows of a near-constant input give gradients exactly halfway
    between two of them, which every correct kernel rounds by its own error's sign).  A
    half-precision kernel computing in float32 has d_i of float32's roundoff: few elements lie
    within it of a point halfway between two numbers of the format, and over a large set the
    bound is a small part of the u that the rounding of what it returns allows without knowing
    fl(g); a kernel rounding in the format inside (plain NumPy) has most elements within
    reach, and the bound u stays the tighter band."""
    g = np.asarray(g, np.float64)
    reach = np.asarray(reach, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = g.astype(dtype).astype(np.float64)
        up = (g + reach).astype(dtype).astype(np.float64)
        down = (g - reach).astype(dtype).astype(np.float64)
        step = np.maximum(np.abs(up - rounded), np.abs(rounded - down))
    # beyond the format's largest number the kernel overflows too: non-finite, not judged here
    known = slice_sums(np.where(np.isfinite(rounded), rounded - g, 0.0) * g) / g2
    with np.errstate(invalid="ignore"):
        crossings = slice_sums(np.where(g != 0, step * np.abs(g), 0.0)) / g2
    return known, np.where(np.isnan(crossings), np.inf, crossings)


class Outside(NamedTuple):
    """The set of a tensor whose bias is furthest outside its band."""
    k: int            # its position in ``slice_sums``' order
    label: str        # "the whole tensor", "index 3 of axis 0"
    bias: float       # b_S (less known_S where the test beyond fl(g) is the one failed)
    band: float       # band_S
    ratio: float      # |b_S| / band_S (> 1)
    keep: np.ndarray | float = 1.0  # the elements judged (``Bands.keep``)
    known: float = 0.0  # the bias of the format's known rounding, taken out of ``bias``

    def reason(self, name) -> str:
        sign = "+" if self.bias >= 0 else "-"
        return (f"{self.label} of {name} is scaled by 1 {sign} {abs(self.bias):.2g} along "
                f"autodiff's gradient: bias {self.ratio:.3g}x its band {self.band:.2g}")


def worst(e, g, b: Bands, axes=None, rounded=True):
    """The set whose bias |b_S| / band_S is largest: (ratio, Outside or None when every set is
    within its band).  rounded: the hand is in the format whose rounding ``Bands.known`` knows,
    so each set is also judged beyond that rounding, |b_S - known_S| against ``Bands.beyond``,
    and fails either test (a false alarm of the pair is at most the sum of the two tests'
    rates; an error is seen by whichever band is the closer to its side)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        bias = slice_sums(np.asarray(e, np.float64) * g * b.keep) / b.norms
        tests = [(bias, b.band, np.zeros_like(bias))]
        if rounded and b.known is not None:
            tests.append((bias - b.known, b.beyond, b.known))
        ratios = [np.where(np.isfinite(band), np.abs(x) / band, 0.0) for x, band, _ in tests]
    if bias.size == 0:
        return 0.0, None
    ratios = np.stack([np.where(np.isnan(r), np.inf, r) for r in ratios])  # a NaN bias fails
    which = np.argmax(ratios, axis=0)                                    # (sets,) the test
    ratio = np.max(ratios, axis=0)
    k = int(np.argmax(ratio))
    top = float(ratio[k])
    if top <= 1:
        return top, None
    x, band, known = tests[int(which[k])]
    return top, Outside(k, slice_labels(np.shape(g), axes)[k], float(x[k]), float(band[k]),
                        top, b.keep, float(known[k]))


def examine(fd, key, x, h, g, out: Outside) -> Element:
    """The three legs along the failing set's direction v = g on S (unit norm): the hand's
    <h, v>, autodiff's <g, v> and FD's derivative with its tolerance at the scale |g| |v|,
    and the hand's allowance (band_S + |known_S|) sum_S g^2 / |g_S| (``checks.evidence.along``:
    the hand's <h, v> may sit off <g, v> by the format's known rounding as well)."""
    v = np.zeros(np.shape(g))
    where = slice_mask(np.shape(g), out.k)
    v[where] = (g * out.keep)[where]
    norm = float(np.linalg.norm(v))
    v = v / norm
    return along(fd, key, x, v, float(np.linalg.norm(g)) or 1.0, float(np.sum(h * v)),
                 float(np.sum(g * v)), (out.band + abs(out.known)) * norm, f"along {out.label}")


def verdict(fd, key, x, h, g, out: Outside, name, caveats, autodiff_fd_ok, kink) -> Verdict:
    """Blame for a set outside its band (``checks.evidence.blame`` on the set's own
    direction), the reason first."""
    found = blame([examine(fd, key, x, h, g, out)], caveats, autodiff_fd_ok, kink,
                  what="directions")
    return with_reason(found, out, name)


def with_reason(found: Verdict, out: Outside, name) -> Verdict:
    detail = out.reason(name) + (f"; {found.detail}" if found.detail else "")
    return Verdict(found.kind, detail)
