"""The signature of a precision change, which a finding needs before it relaxes anything.

A kernel that computes in a lower precision than its inputs (float32 inside a float64 check)
errs at every element, at that precision's level, without bias: rounding errors are independent
from element to element.  A bug errs in a pattern: a scaled copy of the result, an offset along
an axis, or a few elements.  So a finding is raised only when

* most elements (``SPREAD``) are off by more than the checked dtype's tolerance: one element
  off is a localised bug, never a precision;
* the error is no scaled copy of the result and no offset along its last axis (``systematic``);
* for a backward that returns float64, its values are the lower precision's numbers
  (``REPRESENTABLE`` of them): a backward computing in float32 rounds what it returns to
  float32, while noise added to float64 results is no float32 number;
* for a forward (which may round to float32 inside and return float64 values computed after),
  the error is new at other inputs (``smooth``): every input and parameter is moved by a random
  relative MOVE = 2^-10, 2^14 units of float32's last place, and the error of the moved run
  (hand against oracle there) is compared with the first.  Rounding errors at the moved inputs
  are new ones, as large and unrelated: |e' - e| is about sqrt(2) |e|.  A bug's error is a
  smooth function of the inputs (a stray factor, a wrong constant inside a nonlinearity):
  moved by a thousandth of the inputs it changes by about a thousandth of itself.  An error
  that changes by less than SMOOTH_CHANGE of itself is a bug's, whatever its pattern.

A tensor of fewer than 8 elements (a scalar loss) cannot show a pattern: it is recognised by its
error alone, above the dtype's tolerance and within the lower precision's (two independent
roundings of one element lie within SMOOTH_CHANGE of each other too often to tell: 16 % of
normal pairs, against 5e-4 for 8 elements and none in 4e5 draws for 16).
"""
from __future__ import annotations

import numpy as np

SPREAD = 0.5           # fraction of elements that must exceed the checked dtype's tolerance
REPRESENTABLE = 0.9    # fraction of a low-precision backward's values that are low's numbers
FEW = 8                # below this many elements no pattern can be told
MOVE = 2.0 ** -10      # relative move of every input and parameter for ``smooth``
SMOOTH_CHANGE = 0.5    # a bug's error moves by less than this fraction of itself (rounding's:
#                        about sqrt(2) of it; two independent normal errors of n elements come
#                        this close with probability 5e-4 at n = 8, measured over 4e5 draws)


def systematic(e, ref, shifts=True):
    """Is the error e a bug's pattern rather than rounding?  A scaled copy of the reference
    (c ref) or, with shifts, a constant offset along the last axis (a bias) that explains 90 %
    of |e|^2 is systematic.  Too few elements to tell count as systematic."""
    if e.size < FEW:
        return True
    columns = [ref.reshape(-1)]
    n = ref.shape[-1] if ref.ndim else 1
    if shifts and ref.ndim >= 2 and ref.size >= 4 * n:
        columns += list(np.broadcast_to(np.eye(n), ref.shape + (n,)).reshape(-1, n).T)
    A, e = np.stack(columns, axis=1), e.reshape(-1)
    ee = float(e @ e)
    if ee == 0.0:
        return False
    r = e - A @ np.linalg.lstsq(A, e, rcond=None)[0]
    return float(r @ r) <= 0.1 * ee


def precision_change(e, ref, tol, shifts=True) -> bool:
    """Does the error e (against ref, with the checked dtype's element-wise tolerance tol) look
    like a precision change across the tensor (module docstring)?  The caller checks that it
    lies within the lower precision's tolerance."""
    above = np.abs(e) > tol
    if e.size < FEW:
        return bool(np.all(above))
    return float(np.mean(above)) >= SPREAD and not systematic(e, ref, shifts)


def in_format(values, low) -> bool:
    """Are (most of) the values numbers of the format low (float32 numbers in float64)?"""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        same = v.astype(low).astype(np.float64) == v
    return float(np.mean(same)) >= REPRESENTABLE


def moved(values, rng):
    """Every floating array of values (a list, or a dict's values) times 1 + MOVE r, r uniform
    in [-1, 1) per element: the inputs at which ``smooth`` takes the error again."""
    def move(x):
        x = np.asarray(x)
        if x.dtype.kind != "f":
            return x
        return (x * (1.0 + MOVE * rng.uniform(-1.0, 1.0, x.shape))).astype(x.dtype)
    if isinstance(values, dict):
        return {k: move(v) for k, v in values.items()}
    return [move(v) for v in values]


def smooth(e, e_moved) -> bool:
    """Is the error a smooth function of the inputs, a bug's (module docstring)?  e: the error
    at the check's inputs; e_moved: the error at the ``moved`` inputs.  Fewer than FEW elements
    cannot tell (False)."""
    e, e_moved = np.ravel(e).astype(np.float64), np.ravel(e_moved).astype(np.float64)
    if e.size < FEW or e_moved.shape != e.shape:
        return False
    size = float(np.linalg.norm(e))
    return size > 0.0 and float(np.linalg.norm(e_moved - e)) <= SMOOTH_CHANGE * size
