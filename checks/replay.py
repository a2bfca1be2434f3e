"""Replays of the hand backward with two fields of its cache exchanged.

A backward that reads two of its cache's tensors in each other's place (``inv_std, xhat = cache``
for ``xhat, inv_std = cache``, ``cache.k`` wherever ``cache.q`` is meant and the other way round)
computes the right maths on the wrong operands, and its error has no shape of its own: it is
whatever the formula makes of the two.  But it has an exact test.  Called with those two fields
exchanged, the same backward reads each where it is meant and returns the right gradients, every
one of them, within the check's tolerances.  The test runs the user's own backward, so it holds
for any layer whose forward returns its cache as a NamedTuple, a tuple, a list or a dict (nested
ones too: the pairs are taken within each level, where a helper's cache sits inside its
layer's); it knows nothing of the layer.

Every pair of floating-point arrays of one level is tried (a pair whose shapes the backward
cannot take raises, and is not the one), at most MAX_PAIRS, on a copy of the cache (a backward
may write into what it is given).  A low-precision check replays its float64 run
(``checks.explain.float64_rerun``) against the float64 tolerances: the bug without the format's
rounding.
"""
from __future__ import annotations

import copy
import itertools
import warnings

import numpy as np

from kernels.backend import to_numpy
from kernels.precision import is_float_dtype

MAX_PAIRS = 64            # pairs replayed at most (each one call of the hand backward)
MAX_CACHE_BYTES = 2 ** 28  # a larger cache is not copied for replays (256 MiB)


def _items(node):
    """(key, label, child) of a cache level: a NamedTuple's fields, a tuple's or list's items,
    a dict's entries; [] for anything else."""
    if hasattr(node, "_fields"):
        return [(f, f".{f}", getattr(node, f)) for f in node._fields]
    if isinstance(node, (tuple, list)):
        return [(i, f"[{i}]", x) for i, x in enumerate(node)]
    if isinstance(node, dict):
        return [(k, f"[{k!r}]", x) for k, x in node.items()]
    return []


def _is_float_array(x) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and getattr(x, "ndim", 0) > 0 and is_float_dtype(dtype)


def pairs(cache, label="cache"):
    """(path, key a, key b, label a, label b) for every two floating arrays of one level of the
    cache, the levels in order from the top."""
    items = _items(cache)
    arrays = [(k, label + text) for k, text, x in items if _is_float_array(x)]
    for (ka, la), (kb, lb) in itertools.combinations(arrays, 2):
        yield (), ka, kb, la, lb
    for key, text, child in items:
        if _items(child):
            for path, ka, kb, la, lb in pairs(child, label + text):
                yield (key,) + path, ka, kb, la, lb


def _set(node, key, value):
    if hasattr(node, "_fields"):
        return node._replace(**{key: value})
    if isinstance(node, dict):
        return {**node, key: value}
    items = list(node)
    items[key] = value
    return type(node)(items) if isinstance(node, list) else tuple(items)


def _get(node, key):
    return getattr(node, key) if hasattr(node, "_fields") else node[key]


def exchanged(cache, path, a, b):
    """The cache with fields a and b of the level at path exchanged (the rest shared)."""
    if path:
        return _set(cache, path[0], exchanged(_get(cache, path[0]), path[1:], a, b))
    first, second = _get(cache, a), _get(cache, b)
    return _set(_set(cache, a, second), b, first)


def _nbytes(cache) -> int:
    items = _items(cache)
    if not items:
        return int(getattr(cache, "nbytes", 0) or 0)
    return sum(_nbytes(child) for _, _, child in items)


def find_exchange(backward, cache, dout, names, targets):
    """The first pair of cache fields whose exchange makes the hand backward agree with every
    target: (label a, label b), or None.  targets: name -> (trusted gradient, element-wise
    tolerance); names: the inputs' names in the order the backward returns their gradients."""
    if cache is None or _nbytes(cache) > MAX_CACHE_BYTES:
        return None
    for path, a, b, label_a, label_b in itertools.islice(pairs(cache), MAX_PAIRS):
        try:  # a wrong pair may overflow or divide by zero: the user hears of the verdict only
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                dinputs, dparams = backward(dout, copy.deepcopy(exchanged(cache, path, a, b)))
        except Exception:  # shapes the backward cannot take: not this pair
            continue
        if not isinstance(dinputs, (tuple, list)):
            dinputs = (dinputs,)
        grads = {**dict(zip(names, dinputs)), **(dparams if isinstance(dparams, dict) else {})}
        if all(_agrees(grads.get(name), g, tol) for name, (g, tol) in targets.items()):
            return label_a, label_b
    return None


def _agrees(hand, trusted, tol) -> bool:
    if hand is None:
        return False
    hand = np.asarray(to_numpy(hand)).astype(np.float64)
    return hand.shape == trusted.shape and bool(np.all(np.abs(hand - trusted) <= tol))
