"""Where a wrong gradient is wrong, axis by axis, for any tensor.

An element is wrong when it differs from the trusted gradient by more than the fit tolerance.
Along each axis, an index is exact when no element of its slice is wrong; the description says
which indices are exact or which are wrong, in the simplest words that fit:

    exact at token 0 and at even features
    wrong only in head 2
    wrong only above the diagonal of (query, key)

Axes are named by the caller's axis names when given (``token``, ``head``), by their number
otherwise (``axis 2``); positions are multi-indices, never flat ones.
"""
from __future__ import annotations

import itertools

import numpy as np


def axis_labels(shape, names=None):
    """A label per axis: the given names, or 'axis 0', 'axis 1' ..."""
    if names and len(names) == len(shape):
        return [str(n) for n in names]
    return [f"axis {i}" for i in range(len(shape))]


def _plural(label):
    if label == "index":
        return "indices"
    if label.endswith(("s", "x", "ch", "sh")):
        return label + "es"
    return label[:-1] + "ies" if label.endswith("y") and label[-2:-1] not in "aeiou" else label + "s"


def position(index, shape, names=None) -> str:
    """'batch 3, head 1, query 7, key 2' with names, '(3, 1, 7, 2)' without; '' for None."""
    if index is None:
        return ""
    if names and len(names) == len(shape):
        return ", ".join(f"{a} {i}" for a, i in zip(names, index))
    return "index (" + ", ".join(str(int(i)) for i in index) + ")"


def describe_indices(which, n, label) -> str:
    """Words for a set of indices (a boolean array of length n) along one axis."""
    if label.startswith("axis "):  # unnamed: 'index 3 of axis 2', 'even indices of axis 2'
        words = describe_indices(which, n, "index")
        return f"{words} of {label}"
    idx = np.flatnonzero(which)
    if len(idx) == 1:
        i = int(idx[0])
        last = " (the last)" if i == n - 1 and n > 2 else ""
        return f"{label} {i}{last}"
    if n >= 4 and len(idx) == (n + 1) // 2 and np.array_equal(idx, np.arange(0, n, 2)):
        return f"even {_plural(label)}"
    if n >= 4 and len(idx) == n // 2 and np.array_equal(idx, np.arange(1, n, 2)):
        return f"odd {_plural(label)}"
    if len(idx) > 1 and np.all(np.diff(idx) == 1):
        return f"{_plural(label)} {idx[0]}-{idx[-1]}"
    if len(idx) <= 4:
        return f"{_plural(label)} " + ", ".join(str(int(i)) for i in idx)
    return f"{len(idx)} of {n} {_plural(label)}"


def wrong_mask(g, ref, fit_abs):
    return np.abs(g - ref) > fit_abs


def structure(wrong, names=None) -> str:
    """The axis-by-axis description of a boolean 'wrong' array, or '' when it has none
    (everything wrong, or nothing)."""
    if wrong.ndim == 0 or not wrong.any() or wrong.all():
        return ""
    labels = axis_labels(wrong.shape, names)
    triangle = _triangle(wrong, labels)
    if triangle:
        return triangle
    only, exact = [], []
    for axis, label in enumerate(labels):
        n = wrong.shape[axis]
        if n < 2:
            continue
        per = wrong.any(axis=tuple(a for a in range(wrong.ndim) if a != axis))
        if per.all():
            continue
        if per.sum() < n - per.sum():  # fewer wrong than exact; a tie reads "exact at"
            only.append(describe_indices(per, n, label))
        else:
            exact.append(describe_indices(~per, n, label))
    parts = []
    if only:
        parts.append("wrong only in " + " and ".join(only))
    if exact:
        parts.append("exact at " + " and at ".join(exact))
    return "; ".join(parts)


def _triangle(wrong, labels):
    """Wrong only above (or below, or off) the diagonal of some pair of equal-length axes."""
    for a, b in itertools.combinations(range(wrong.ndim), 2):
        n = wrong.shape[a]
        if n < 2 or wrong.shape[b] != n:
            continue
        i = np.arange(n).reshape([-1 if k == a else 1 for k in range(wrong.ndim)])
        j = np.arange(n).reshape([-1 if k == b else 1 for k in range(wrong.ndim)])
        pair = f"({labels[a]}, {labels[b]})"
        for region, words in ((j > i, "above"), (j < i, "below"), (j != i, "off"),
                              (j == i, "on")):
            region = np.broadcast_to(region, wrong.shape)
            if not wrong[~region].any():
                return f"wrong only {words} the diagonal of {pair}"
    return ""


def locate(index, shape, axis_names) -> str:
    """The worst element as a multi-index, with axis names when given."""
    return position(index, shape, axis_names)
