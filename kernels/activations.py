"""Softmax over the last axis and leaky ReLU."""
from typing import NamedTuple

from kernels.backend import array_module, check_float, check_params, ones
from kernels.precision import half_precision_backward, half_precision


# Softmax is invariant to a per-row shift; the shift only has to keep exp() finite and the
# largest term of each row away from underflow.  When every |logit| < SAFE_LOGIT, exp() of the
# unshifted logits lies in [e^-60, e^60], inside float32's normal range, so no shift is needed
# and one global check replaces a per-row max over a short axis (3-4x slower in NumPy).
SAFE_LOGIT = 60.0
MASK_VALUE = -1e9  # the article's additive mask for keys a query must not see


def row_sum(x):
    """Sum over the last axis, as a matrix-vector product: (..., N) -> (..., 1).

    Measured 4x faster than x.sum(axis=-1) for the short rows of attention in NumPy.  A
    contiguous stack is one (rows, N) product: (..., N) @ (N, 1) is one product per leading
    index (2x slower on attention's (H, B, T, S) weights).
    """
    N = x.shape[-1]
    column = ones(array_module(x), (N, 1), x.dtype)                          # (N, 1)
    if x.ndim > 2 and x.flags.c_contiguous:
        return (x.reshape(-1, N) @ column).reshape(*x.shape[:-1], 1)
    return x @ column  # (..., N) x (N, 1) -> (..., 1)


def row_max(x):
    """Max over the last axis: (..., N) -> (..., 1).  Reduced along the leading axis of the
    transposed copy: NumPy's max over short contiguous rows (the loss's V = 12) measured 10x
    slower than the copy and a reduction across rows."""
    xp = array_module(x)
    N = x.shape[-1]
    columns = xp.ascontiguousarray(x.reshape(-1, N).T)                    # (N, rows)
    return columns.max(axis=0).reshape(*x.shape[:-1], 1)                   # (..., 1)


SHORT_ROW = 32  # rows shorter than this are divided or shifted by a full copy of the per-row value


def per_row(column, n):
    """A per-row value (..., 1) made ready to combine with rows of n: for short rows a full
    (..., n) copy, otherwise the column itself (broadcast).  NumPy's broadcast of a column over
    short rows runs one inner loop per row: on attention's (H, B, T, S) weights (S = 17) the
    copy and a same-shape operation measured 1.8x faster; at 32 features they were even."""
    if n < SHORT_ROW:
        return array_module(column).repeat(column, n, axis=-1)    # (..., n)
    return column                                                  # (..., 1)


def softmax_rows(logits, keep=None, *, overwrite=False):
    """softmax over the last axis; keep (broadcastable 0/1 of the logits' dtype) masks keys out.

    Masked keys get probability exactly 0, as with the article's additive -1e9 (whose exp
    underflows to 0): multiplying exp() by keep is the same maths without the huge logits.
    overwrite: the logits are the caller's own temporary, and exp() is written over them (one
    fresh array fewer: a fresh array's first writes fault its pages in, which measured as much
    as the exp itself at attention's sizes).
    """
    xp = array_module(logits)
    # max |logit| from the largest and the smallest: two reductions, no |logits| array (NaN in
    # both propagates, and NaN < SAFE_LOGIT is False)
    if max(float(logits.max()), -float(logits.min())) < SAFE_LOGIT:
        e = xp.exp(logits, out=logits if overwrite else None)             # (..., N)
    else:  # large logits: the textbook per-row shift, with the mask added before the max
        if keep is not None:
            logits = logits + (1 - keep) * logits.dtype.type(MASK_VALUE)
        e = xp.exp(logits - logits.max(axis=-1, keepdims=True))           # (..., N)
    if keep is not None:
        e *= keep
    e /= per_row(row_sum(e), e.shape[-1])                                 # (..., N)
    return e


class SoftmaxCache(NamedTuple):
    y: object  # (..., N) the probabilities; backward needs nothing else


@half_precision
def softmax_forward(x, params):
    """Softmax over the last axis.  x: (..., N) -> (..., N).  No parameters."""
    check_float("x", x)
    check_params("softmax", params, {}, x.dtype)
    y = softmax_rows(x)  # (..., N)
    return y, SoftmaxCache(y)


@half_precision_backward
def softmax_backward(dy, cache):
    """dx = y * (dy - <dy, y>): the diagonal term minus the outer-product term."""
    return softmax_rows_backward(dy, cache.y), {}


def softmax_rows_backward(dy, y):
    """The softmax Jacobian-vector product, for kernels that keep their own probabilities:
    y * (dy - <dy, y>), in place on one fresh array (dy and y are left as they are)."""
    xp = array_module(dy)
    dx = dy * y                        # (..., N)
    inner = row_sum(dx)                # (..., 1) <dy, y>
    xp.subtract(dy, per_row(inner, dy.shape[-1]), out=dx)  # (..., N) dy - <dy, y>
    dx *= y
    return dx


def leaky_gain(x, slope):
    """(...) 1 where x > 0, slope elsewhere: 0 or 1 first, then scaled in place."""
    one, s = x.dtype.type(1), x.dtype.type(slope)
    gain = (x > 0).astype(x.dtype)    # (...) 1 or 0
    gain *= one - s
    gain += s
    return gain


class LeakyReluCache(NamedTuple):
    gain: object  # (...) 1 where x > 0, slope elsewhere: dy/dx


@half_precision
def leaky_relu_forward(x, params, *, slope=0.1):
    """y = x where x > 0, slope * x elsewhere.  No parameters.

    Written as y = gain * x with gain = 1 or slope: arithmetic on the comparison, because a
    select on a random boolean mask (np.where) measured about 10x slower in NumPy.  The gain is
    scaled in place on its own fresh array: 1.4x faster than (x > 0) * (1 - s) + s (float32,
    (32, 65, 1024)).
    """
    check_float("x", x)
    check_params("leaky_relu", params, {}, x.dtype)
    gain = leaky_gain(x, slope)       # (...)
    return gain * x, LeakyReluCache(gain)


@half_precision_backward
def leaky_relu_backward(dy, cache):
    """dx = gain * dy: dy where x > 0, slope * dy elsewhere."""
    return cache.gain * dy, {}
