"""The few things that differ between NumPy and CuPy, and input validation helpers."""
from __future__ import annotations

import functools

import numpy

from kernels.precision import is_float_dtype

try:  # CuPy is optional: the lab runs on NumPy alone.
    import cupy as _cupy
except Exception:  # ImportError, or a CUDA runtime that fails to load
    _cupy = None


def array_module(*arrays):
    """NumPy or CuPy, whichever module owns the given arrays."""
    if _cupy is not None:
        return _cupy.get_array_module(*arrays)
    return numpy


@functools.lru_cache(maxsize=256)
def _numpy_ones(shape, dtype):
    ones = numpy.ones(shape, dtype=dtype)
    ones.setflags(write=False)
    return ones


def ones(xp, shape, dtype):
    """An array of ones for a product that sums (row_sum, column_sum): NumPy's are made once
    per shape and dtype and read-only (the kernels call this about 25 times a training step);
    other modules' are made per call."""
    if xp is numpy:
        return _numpy_ones(tuple(shape), numpy.dtype(dtype))
    return xp.ones(shape, dtype=dtype)


def scatter_add(table, ids, values):
    """table[ids] += values, accumulating repeated ids (np.add.at / cupyx.scatter_add)."""
    if array_module(table) is numpy:
        numpy.add.at(table, ids, values)
    else:
        import cupyx
        cupyx.scatter_add(table, ids, values)
    return table


def to_numpy(array):
    """A host (NumPy) copy of a NumPy or CuPy array; other values pass through."""
    if _cupy is not None and isinstance(array, _cupy.ndarray):
        return _cupy.asnumpy(array)
    return array


# --- validation at the public edge -------------------------------------------------------

# the arrays the kernels run on; another library's array with a dtype and a shape (a JAX array)
# would run the kernels' arithmetic through that library, not NumPy's or CuPy's
ARRAY_TYPES = (numpy.ndarray, numpy.generic) + ((_cupy.ndarray,) if _cupy is not None else ())


def check_array(name, x):
    """x must be a NumPy or CuPy array."""
    if not isinstance(x, ARRAY_TYPES):
        kind = type(x).__module__.split(".")[0]
        hint = " (convert with numpy.asarray)" if hasattr(x, "__array__") else ""
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got {kind}'s "
                        f"{type(x).__name__}{hint}")


def check_float(name, x, ndim=None):
    """x must be a floating-point NumPy or CuPy array (of rank ndim when given)."""
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{name}: expected a floating-point array, got {type(x).__name__}")
    check_array(name, x)
    if not is_float_dtype(x.dtype):
        raise TypeError(f"{name}: expected a floating-point array, got dtype {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name}: expected rank {ndim}, got shape {tuple(x.shape)}")
    if x.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {tuple(x.shape)}")


def check_ids(name, ids, vocab):
    """ids must be an integer array with every value in [0, vocab)."""
    if not hasattr(ids, "dtype") or ids.dtype.kind not in "iu":
        got = getattr(ids, "dtype", type(ids).__name__)
        raise TypeError(f"{name}: expected an integer array of token ids, got {got}")
    if ids.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {tuple(ids.shape)}")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"{name}: token ids must lie in [0, {vocab}), got values in [{lo}, {hi}]")


def check_params(layer, params, shapes, dtype):
    """params must have exactly the keys of shapes, each with that shape and the given dtype."""
    if not isinstance(params, dict):
        raise TypeError(f"{layer} params: expected a dict, got {type(params).__name__}")
    if params.keys() != shapes.keys():   # (compared as sets)
        missing, extra = sorted(set(shapes) - set(params)), sorted(set(params) - set(shapes))
        raise ValueError(f"{layer} params: expected keys {sorted(shapes)}, "
                         f"missing {missing}, extra {extra}")
    floating = is_float_dtype(dtype)
    for key, shape in shapes.items():
        value = params[key]
        # the common case in one test (every kernel call validates its parameters): an array of
        # the expected floating dtype and shape, not empty
        if floating and isinstance(value, ARRAY_TYPES) and value.dtype == dtype and \
                value.shape == tuple(shape) and value.size:
            continue
        check_float(f"{layer} params[{key!r}]", value)
        if tuple(value.shape) != tuple(shape):
            raise ValueError(f"{layer} params[{key!r}]: expected shape {tuple(shape)}, "
                             f"got {tuple(value.shape)}")
        if value.dtype != dtype:
            raise TypeError(f"{layer} params[{key!r}]: expected dtype {dtype} (the input's), "
                            f"got {value.dtype}")
