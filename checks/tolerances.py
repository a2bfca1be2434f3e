"""Every tolerance of the checker, derived once from the dtype and the reduction length.

Notation: u is the unit roundoff of the dtype (2^-24 for float32, 2^-53 for float64); k is the
reduction length, the number of terms that can be summed into one output or gradient element.

1. Hand vs autodiff, and the forward vs the oracle.  A sum of k rounded products has an error
   of about sqrt(k) * u relative to the sum of its terms' magnitudes when rounding errors behave
   like independent random variables (Higham & Mary 2019; the worst case is k * u).  A layer
   chains a handful of such operations and the softmax and the normalisation pass their relative
   errors on with a factor of order one, so we allow

        tol(dtype, k) = SAFETY * sqrt(k) * u(dtype),     SAFETY = 64,

   measured normwise: max |hand - autodiff| / max |autodiff|.  Normwise, because an element that
   cancels to nearly zero carries an absolute, not a relative, error.  The oracle always runs in
   float64, so in a float32 check u is float32's: it is the hand kernel's rounding we bound.
   SAFETY was calibrated with ``python -m checks calibrate`` (many seeds and random shapes):
   correct kernels stay well inside it (see docs/tolerances.md for the observed margins), while
   every classic bug of the zoo is off by a factor of order one.

2. Central finite differences, always in float64.  With step h the error of
   (L(x + h v) - L(x - h v)) / 2h is  h^2 |L'''| / 6  (truncation)  +  u |L| / h  (rounding).
   The step that balances them is h = u^(1/3) times the scale of x, leaving an error of order
   u^(2/3) ~ 4e-11 in float64.  Third derivatives of the softmax and of the normalisation are of
   order ten at our input scales, and the rounding term is measured from the actual values
   (sum |f * dout|), so the finite-difference tolerance is

        fd_tol = FD_SAFETY * u64^(2/3) + 4 * u64 * sum|f * dout| / (h * scale),   FD_SAFETY = 1e4,

   about 2e-7 relative to scale = |g| |v|, the natural size of a directional derivative.
   A leg pair is said to agree when its error is within the larger of the tolerances involved.

3. Richardson extrapolation (option): (4 D(h) - D(2h)) / 3 cancels the h^2 term, leaving
   h^4 L^(5) truncation against (4 + 1/2)/3 * u |L| / h rounding: the step u^(1/5) balances them
   and the error falls to order u^(4/5) ~ 2e-13.  Same FD_SAFETY on the truncation constant.

4. The complex step (option, analytic layers, on the oracle): Im L(x + i h v) / h with h = 1e-20
   has no subtraction, so no cancellation: its error is rounding only, a few u times the scale of
   the terms, as for autodiff.  We allow COMPLEX_STEP_ULPS * u64 ~ 1e-13 (it was 1e-11 until
   calibration measured at most ~25 u).

5. A forward that quietly computes in float32 although its inputs are float64 (its outputs are
   all float32 numbers and its error against the oracle is above float64's tolerance but within
   float32's) is judged with u = u32: the hand tolerance at float32, the finite differences with
   float32's step and tolerance, and a note.  A float64 forward off by a float32-sized amount
   for another reason still fails.

Measured (``python -m checks calibrate``, 200 seeds x 13 layers x 2 dtypes at random shapes,
docs/tolerances.md): the worst hand-vs-autodiff error is under a tenth of tol and the worst
finite-difference error under a fiftieth of fd_tol, with zero false alarms.  The margins are
wide on purpose: every bug of the zoo is off by a factor of order one, so tightening SAFETY
would buy nothing against real bugs while adding flakiness at shapes not yet drawn.
"""
import numpy

SAFETY = 64.0
FD_SAFETY = 1e4
COMPLEX_STEP_ULPS = 1e3
U64 = float(numpy.finfo(numpy.float64).eps) / 2


def unit_roundoff(dtype):
    """u = eps / 2 of a floating dtype."""
    return float(numpy.finfo(dtype).eps) / 2


def grad_tol(dtype, k):
    """Normwise relative tolerance of a hand result (gradient or forward) of the given dtype."""
    return SAFETY * numpy.sqrt(max(int(k), 1)) * unit_roundoff(dtype)


def fd_step(scale, u=U64):
    """Central-difference step for a tensor of typical magnitude scale: the u^(1/3) rule."""
    return u ** (1 / 3) * max(1.0, float(scale))


def fd_tol(rounding_abs, h, scale, u=U64):
    """Relative tolerance of a central difference (see the module docstring)."""
    scale = max(scale, numpy.finfo(numpy.float64).tiny)
    return FD_SAFETY * u ** (2 / 3) + 4 * u * rounding_abs / (h * scale)


def richardson_step(scale, u=U64):
    """Step of Richardson's (4 D(h) - D(2h)) / 3: truncation h^4 against rounding u / h."""
    return u ** (1 / 5) * max(1.0, float(scale))


def richardson_tol(rounding_abs, h, scale, u=U64):
    """The truncation error falls to order u^(4/5); the rounding term grows by (4 + 1/2) / 3."""
    scale = max(scale, numpy.finfo(numpy.float64).tiny)
    return FD_SAFETY * u ** (4 / 5) + 6 * u * rounding_abs / (h * scale)


def complex_step_tol():
    """Im L(x + i h v) / h has no subtraction: rounding only.  Calibration (1100 checks, 50 seeds,
    docs/tolerances.md) measured at most ~25 u relative to |g| |v|; 1000 u leaves 40x."""
    return COMPLEX_STEP_ULPS * U64
