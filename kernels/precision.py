"""Half precision (float16, bfloat16): half-precision arrays in, float32 inside, the input's format out.

The policy is the one accelerators apply to a fused kernel with float32 accumulation, and it is
the same for every kernel of the lab (``docs/half-precision.md`` lists what it means for each):

1. Inputs and parameters of a half-precision format are upcast to float32.  This is exact:
   every float16 and bfloat16 value is a float32 value.
2. The kernel's own float32 code runs unchanged.  A matrix product of two upcast operands is one
   float32 BLAS product: each product of two half-precision values is exact in float32 (11 + 11
   and 8 + 8 significand bits fit in 24), and the sums accumulate in float32, as tensor cores
   do.  Softmax (exp, the row sums, the division), log-sum-exp, the statistics of a norm
   (mean of squares, mean, variance) and every element-wise step also run in float32, so exp
   cannot overflow where a float16 exp would (above 11.09) and no running sum stalls at 2048.
3. What the kernel returns is rounded once to the input's format (round to nearest, ties to
   even): the forward's output, and every gradient of the backward.  The cache keeps the
   float32 intermediates, so the backward reads what the forward computed, not a rounded copy
   (memory: twice a half-precision cache, a choice for accuracy over footprint).

So a half-precision kernel's error against exact arithmetic is float32 rounding inside plus one
rounding to the format per returned element: ``checks.tolerances.Policy.compute`` models it that
way.  Rounding is emulated with ``astype``: what hardware does when a float32 accumulator is
written to a half-precision register.  A composition of kernels (the whole model) rounds at every
kernel boundary and its own residual sums run in the half format (NumPy float16; ml_dtypes'
bfloat16), as the activations of a mixed-precision model do.

bfloat16 comes from ml_dtypes (installed with JAX); NumPy arithmetic on it is slow, which the
float32 compute avoids.  CuPy has float16 but no bfloat16.

A kernel's compute format is what the checker models its rounding with (``computes_in``):

* ``FLOAT32_INSIDE`` ("float32"), the policy above: the two decorators declare it;
* ``PLAIN`` ("plain"), what NumPy itself does on half-precision arrays, the default for a kernel
  that declares nothing: a matrix product (``@``, ``dot``, ``tensordot``) accumulates in float32
  and is rounded once to the format (ml_dtypes' bfloat16 ``@`` even returns float32, which the
  kernel must round back itself), every element-wise operation (exp, tanh, *, /) rounds its
  result to the format, and a sum (``sum``, ``mean``, ``cumsum``) rounds in the format at every
  step, one term after the other (bfloat16 always, float16 along a non-contiguous axis: a sum of
  ones stalls at 256 in bfloat16, at 2048 in float16).
"""
from __future__ import annotations

import functools

import numpy

try:  # bfloat16 comes with JAX
    import ml_dtypes
    BFLOAT16 = numpy.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    ml_dtypes, BFLOAT16 = None, None

FLOAT16 = numpy.dtype(numpy.float16)
COMPUTE = numpy.dtype(numpy.float32)  # what a half-precision kernel computes in
HALF = tuple(d for d in (FLOAT16, BFLOAT16) if d is not None)
FLOAT32_INSIDE = "float32"  # compute formats a kernel may declare (module docstring)
PLAIN = "plain"
COMPUTE_FORMATS = (FLOAT32_INSIDE, PLAIN)
FORMATS = ("float64", "float32", "float16", "bfloat16")  # the formats every kernel accepts


def is_half(dtype) -> bool:
    """float16 or bfloat16."""
    return dtype is not None and numpy.dtype(dtype) in HALF


def is_float_dtype(dtype) -> bool:
    """A real floating format: NumPy's own (kind 'f') or ml_dtypes' bfloat16 (kind 'V')."""
    dtype = numpy.dtype(dtype)
    return dtype.kind == "f" or (BFLOAT16 is not None and dtype == BFLOAT16)


def finfo(dtype):
    """numpy.finfo, also for bfloat16 (which numpy.finfo does not know)."""
    dtype = numpy.dtype(dtype)
    return numpy.finfo(dtype) if dtype.kind == "f" else ml_dtypes.finfo(dtype)


def format_of(*arrays, where="arrays"):
    """The half-precision format of the floating arrays given, or None when there is none.
    Mixed formats beside a half-precision one are a TypeError naming ``where`` (the kernels
    never promote)."""
    # the common case first: no array of two-byte elements, so no half-precision one (one
    # attribute read per array: this runs on every kernel call)
    if all(getattr(getattr(a, "dtype", None), "itemsize", 0) != 2 for a in arrays):
        return None
    floats = [a for a in arrays if hasattr(a, "dtype") and is_float_dtype(a.dtype)]
    half = [a.dtype for a in floats if is_half(a.dtype)]
    if not half:
        return None
    other = sorted({str(a.dtype) for a in floats if a.dtype != half[0]})
    if other:
        raise TypeError(f"{where}: expected every floating input and parameter in {half[0]} "
                        f"(the input's), got also {', '.join(other)}")
    return half[0]


def computes_in(compute):
    """Decorator: declare the compute format of a kernel's forward or backward for the checker
    (``FLOAT32_INSIDE`` or ``PLAIN``, module docstring); the function itself is unchanged."""
    if compute not in COMPUTE_FORMATS:
        raise ValueError(f"compute: expected one of {COMPUTE_FORMATS}, got {compute!r}")

    def declare(fn):
        fn.compute_format = compute
        return fn
    return declare


def compute_format_of(*fns) -> str:
    """The compute format the first of fns that declares one declares; PLAIN when none does
    (plain NumPy's rounding covers float32 inside: it rounds more, never less)."""
    for fn in fns:
        compute = getattr(fn, "compute_format", None)
        if compute is not None:
            return compute
    return PLAIN


def upcast(value, dtype):
    """value in float32 when it is an array of the half-precision format dtype; else unchanged."""
    if hasattr(value, "dtype") and value.dtype == dtype:
        return value.astype(COMPUTE)
    return value


def round_to(value, dtype):
    """Floating arrays (also inside tuples, lists and dicts) rounded to dtype; None, ids and
    other values unchanged."""
    if isinstance(value, dict):
        return {k: round_to(v, dtype) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(round_to(v, dtype) for v in value)
    if hasattr(value, "dtype") and value.dtype.kind == "f":
        return value.astype(dtype)
    return value


def half_precision(forward):
    """A forward ``(*inputs, params, **static) -> (out, cache)`` under the policy above;
    float32 and float64 calls pass through untouched."""
    @functools.wraps(forward)
    def wrapped(*args, **static):
        params = args[-1] if args and isinstance(args[-1], dict) else {}
        fmt = format_of(*args[:-1], *params.values(), where=forward.__name__)
        if fmt is None:
            return forward(*args, **static)
        inputs = [upcast(a, fmt) for a in args[:-1]]
        out, cache = forward(*inputs, {k: upcast(v, fmt) for k, v in params.items()}, **static)
        return round_to(out, fmt), cache
    wrapped.half_precision = True  # the discovery test reads it
    wrapped.compute_format = FLOAT32_INSIDE
    return wrapped


def half_precision_backward(backward):
    """A backward ``(dout, cache) -> (dinputs, grads)`` under the policy above: a
    half-precision dout is upcast, every gradient returned rounded to its format."""
    @functools.wraps(backward)
    def wrapped(dout, cache, **options):
        fmt = format_of(dout, where=backward.__name__)
        if fmt is None:
            return backward(dout, cache, **options)
        return round_to(backward(upcast(dout, fmt), cache, **options), fmt)
    wrapped.half_precision = True
    wrapped.compute_format = FLOAT32_INSIDE
    return wrapped
