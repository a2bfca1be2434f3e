"""Replays of the hand backward with two things exchanged: two fields of its cache, or two
arguments of one call its code makes.

A backward that reads two of its cache's tensors in each other's place (``inv_std, xhat = cache``
for ``xhat, inv_std = cache``, ``cache.k`` wherever ``cache.q`` is meant and the other way round)
computes the right maths on the wrong operands, and its error has no shape of its own: it is
whatever the formula makes of the two.  But it has an exact test.  Called with those two fields
exchanged, the same backward reads each where it is meant and returns the right gradients, every
one of them, within the check's tolerances.  The test runs the user's own backward, so it holds
for any layer whose forward returns its cache as a NamedTuple, a tuple, a list or a dict (nested
ones too: the pairs are taken within each level, where a helper's cache sits inside its
layer's); it knows nothing of the layer.

The same holds for a helper called with two arguments in each other's place
(``softmax_backward(y, dy)`` for ``softmax_backward(dy, y)``): one run under ``sys.setprofile``
records the calls the user's code makes of the user's own functions (not the libraries', not
this package's) with at least two array arguments, and each pair of those arguments is
exchanged in that call only (a wrapper, put where the caller finds the function for the length
of the replay, exchanges them when called from that line).  A profiler the user has set is
suspended for that one run.

Every pair of floating-point arrays of one level of the cache is tried first, then the calls'
pairs, at most MAX_PAIRS of each (a pair the backward cannot take raises, and is not the one),
each on a copy of the cache (a backward may write into what it is given), with NumPy's
floating-point warnings off.  A low-precision check replays its float64 run
(``checks.explain.float64_rerun``) against the float64 tolerances: the bug without the format's
rounding.
"""
from __future__ import annotations

import copy
import functools
import inspect
import itertools
import linecache
import os
import sys
import sysconfig
import threading
import types
import warnings
from typing import NamedTuple

import numpy as np

from checks.attribution import relative
from kernels.backend import to_numpy
from kernels.precision import is_float_dtype

MAX_PAIRS = 64            # pairs replayed at most (each one call of the hand backward)
MAX_CACHE_BYTES = 2 ** 28  # a larger cache is not copied for replays (256 MiB)
MAX_SITES = 256            # calls recorded at most for a call's arguments exchanged


def fields(node):
    """(key, label, child) of a cache level (its items, one level down): a NamedTuple's fields, a tuple's or list's items,
    a dict's entries; [] for anything else."""
    if hasattr(node, "_fields"):
        return [(f, f".{f}", getattr(node, f)) for f in node._fields]
    if isinstance(node, (tuple, list)):
        return [(i, f"[{i}]", x) for i, x in enumerate(node)]
    if isinstance(node, dict):
        return [(k, f"[{k!r}]", x) for k, x in node.items()]
    return []


def _is_float_array(x) -> bool:
    """An array of floating point with at least one axis (a module passed as an argument, with
    its ``dtype`` class and ``ndim`` function, is not one)."""
    ndim, dtype = getattr(x, "ndim", None), getattr(x, "dtype", None)
    return isinstance(ndim, int) and ndim > 0 and dtype is not None and is_float_dtype(dtype)


def pairs(cache, label="cache"):
    """(path, key a, key b, label a, label b) for every two floating arrays of one level of the
    cache, the levels in order from the top."""
    items = fields(cache)
    arrays = [(k, label + text) for k, text, x in items if _is_float_array(x)]
    for (ka, la), (kb, lb) in itertools.combinations(arrays, 2):
        yield (), ka, kb, la, lb
    for key, text, child in items:
        if fields(child):
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
    items = fields(cache)
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
        if _replay(backward, dout, exchanged(cache, path, a, b), names, targets):
            return label_a, label_b
    return None


def _replay(backward, dout, cache, names, targets) -> bool:
    """Whether the backward, run on a copy of cache, agrees with every target.  A wrong
    replay may overflow or divide by zero: the user hears of the verdict only."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            dinputs, dparams = backward(dout, copy.deepcopy(cache))
    except Exception:  # shapes the backward cannot take: not this replay
        return False
    if not isinstance(dinputs, (tuple, list)):
        dinputs = (dinputs,)
    grads = {**dict(zip(names, dinputs)), **(dparams if isinstance(dparams, dict) else {})}
    return all(_agrees(grads.get(name), g, tol) for name, (g, tol) in targets.items())


def _agrees(hand, trusted, tol) -> bool:
    if hand is None:
        return False
    hand = np.asarray(to_numpy(hand)).astype(np.float64)
    return hand.shape == trusted.shape and bool(np.all(np.abs(hand - trusted) <= tol))


# --- a call's two arguments exchanged -------------------------------------------------------

class Site(NamedTuple):
    """A call, made by the user's code, of a function of the user's code with array arguments."""
    caller: object      # the calling function's code object
    line: int           # the line of the call
    callee: object      # the called function's code object
    params: tuple       # the names of its parameters that received an array, in order
    where: tuple        # [(namespace, name)]: where the caller finds the callee (to patch it)


def _library_roots() -> tuple:
    """Folders of the interpreter's own and installed libraries: code there is not the
    user's; nor is this package's, which runs the replays."""
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(sorted(roots)) + (os.path.dirname(os.path.abspath(__file__)),)


def _users(code, roots) -> bool:
    """Code of the user's: anything but the libraries' files and the interpreter's frozen
    modules (a REPL's, a notebook's and exec'd code are the user's)."""
    name = code.co_filename
    if name.startswith("<"):
        return not name.startswith("<frozen")
    return not os.path.abspath(name).startswith(roots)


def _found_in(code, namespace) -> list:
    """[(namespace, name)] where namespace[name] (a module's attribute) is the function whose
    code is ``code``: the caller's globals, and the modules among them, one level down."""
    out = []
    for name, value in list(namespace.items()):
        if getattr(value, "__code__", None) is code:
            out.append((namespace, name))
        elif isinstance(value, types.ModuleType):
            out += [(value.__dict__, n) for n, v in list(vars(value).items())
                    if getattr(v, "__code__", None) is code]
    return out


def call_sites(backward, dout, cache) -> list:
    """Every distinct call that the backward's code (the user's, not a library's) makes of the
    user's own functions with at least two array arguments, recorded in one run under
    ``sys.setprofile``, in the order first made: the sites a replay may exchange two arguments
    at."""
    roots, sites, seen = _library_roots(), [], set()

    def profile(frame, event, arg):
        if event != "call" or len(sites) >= MAX_SITES:
            return
        try:
            record(frame)
        except Exception:  # an exception here would end the profiling for the whole run
            pass

    def record(frame):
        caller = frame.f_back
        if caller is None or not _users(frame.f_code, roots) or not _users(caller.f_code, roots):
            return
        key = (caller.f_code, caller.f_lineno, frame.f_code)
        if key in seen:
            return
        seen.add(key)
        code = frame.f_code
        params = tuple(n for n in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
                       if _is_float_array(frame.f_locals.get(n)))
        where = _found_in(code, caller.f_globals)
        if len(params) >= 2 and where:
            sites.append(Site(caller.f_code, caller.f_lineno, code, params, tuple(where)))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            backward(dout, copy.deepcopy(cache))
    except Exception:
        pass
    finally:
        sys.setprofile(previous)
    return sites


def _swapping(function, site, a, b):
    """function, exchanging its arguments a and b when called from the site's line in this
    thread (another thread of the process that calls it meanwhile gets the function as it is:
    a Dask worker may run several checks at once)."""
    signature = inspect.signature(function)
    thread = threading.get_ident()

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        caller = sys._getframe(1)
        if caller.f_code is not site.caller or caller.f_lineno != site.line \
                or threading.get_ident() != thread:
            return function(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.arguments[a], bound.arguments[b] = bound.arguments[b], bound.arguments[a]
        return function(*bound.args, **bound.kwargs)
    return wrapper


def find_call_swap(backward, cache, dout, names, targets):
    """The first call of the user's code whose two array arguments, exchanged in that call
    only, make the hand backward agree with every target: (site, argument, argument), or
    None."""
    if cache is None or _nbytes(cache) > MAX_CACHE_BYTES:
        return None
    tries = ((site, a, b) for site in call_sites(backward, dout, cache)
             for a, b in itertools.combinations(site.params, 2))
    for site, a, b in itertools.islice(tries, MAX_PAIRS):
        namespace, name = site.where[0]
        original = namespace[name]
        patched = _swapping(original, site, a, b)
        for space, n in site.where:
            space[n] = patched
        try:
            if _replay(backward, dout, cache, names, targets):
                return site, a, b
        finally:
            for space, n in site.where:
                space[n] = original
    return None


def explain(backward, cache, dout, names, targets) -> str:
    """What a replay finds, as a sentence: two cached tensors read in each other's place, else
    a call's two arguments; '' when neither makes every gradient right."""
    found = find_exchange(backward, cache, dout, names, targets)
    if found:
        return (f"the backward reads {found[0]} and {found[1]} in each other's place: called "
                f"with the two exchanged, it returns autodiff's gradients, every tensor within "
                f"its tolerance")
    found = find_call_swap(backward, cache, dout, names, targets)
    if found:
        site, a, b = found
        return (f"the call of {site.callee.co_name} at {_where(site)} passes its arguments "
                f"{a} and {b} in each other's place: with the two exchanged in that call, the "
                f"backward returns autodiff's gradients, every tensor within its tolerance")
    return ""


def _where(site) -> str:
    """'kernels/layernorm.py:64 in layernorm_backward (`dx = ...`)': the call's file relative
    to the working folder, its line, its function and, from a file, the line's text (a
    mutant's source is not its file's: no text)."""
    path = site.caller.co_filename
    mutant = path.startswith("<mutant of ")
    if mutant:
        path = path[len("<mutant of "):-1]
    text = "" if mutant else linecache.getline(path, site.line).strip()
    return f"{relative(path)}:{site.line} in {site.caller.co_name}" + (f" (`{text}`)" if text else "")
