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
  float32, while noise added to float64 results is no float32 number.

A tensor of fewer than 8 elements (a scalar loss) cannot show a pattern: it is recognised by its
error alone, above the dtype's tolerance and within the lower precision's.
"""
from __future__ import annotations

import numpy as np

SPREAD = 0.5           # fraction of elements that must exceed the checked dtype's tolerance
REPRESENTABLE = 0.9    # fraction of a low-precision backward's values that are low's numbers
FEW = 8                # below this many elements no pattern can be told


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
