"""The checker's tolerance policy: one object, derived from first principles, calibrated.

Notation: u is the unit roundoff of a format (2^-53 float64, 2^-24 float32, 2^-11 float16,
2^-8 bfloat16); the oracle and the finite differences always run in float64.

1. Hand vs autodiff, element by element.  ``checks.rounding`` runs the oracle's forward and VJP
   with every rounding operation perturbed (Monte Carlo arithmetic) and returns, for every
   gradient element, the spread s_i that rounding at roundoff u gives a correct implementation of
   the same maths.  The spread follows the element's own conditioning: the magnitudes of the terms
   that sum into it, the number of those terms, cancellation, exponents that amplify their
   arguments' errors.  An element passes when

        |hand_i - autodiff_i| <= tol_i = LAMBDA * s_i + ULPS * u * |autodiff_i| + tiny,

   LAMBDA = 8.0: s_i is an estimate from SAMPLES = 64 perturbed runs of each part of the
   program.  Were the model's spread exact, a correct kernel's error over the estimate,
   e_i / s_i, would be Student's t with 64 degrees of freedom, and LAMBDA is the quantile
   P(|t_64| > LAMBDA) = ELEMENT_ODDS = 3e-11 per element (``student``), so a million elements
   checked give a false alarm with probability 3e-5.  The degrees of freedom set the price of
   that certainty: with 16 samples the same odds asked LAMBDA = 16, twice as wide a tolerance
   for a quarter of the runs.  The model is in
   practice pessimistic (its noise has the rms of the rounding bound u, while round-to-nearest's
   relative error is spread within it), which is further margin, not a licence to tighten: the
   calibration (``docs/tolerances.md``) shows how much room correct kernels leave.
   ULPS = 4 allows the final rounding of a result the oracle obtains exactly (a kernel may
   compute an element the oracle copies); tiny = ULPS x the format's smallest subnormal number
   (the spacing of the subnormals, in float16 6e-8: a result below the normal range, 6.1e-5,
   rounds to that absolute error, not to a relative one).
   The error reported is max_i |hand_i - autodiff_i| / tol_i: 1 is the edge.

   Neither the tensor's largest element nor its size enters: a gradient that cancels to a small
   value gets the error of its large terms (no false alarm at cancellation), a small element of a
   large tensor is judged at its own scale (no bug hides below the largest element's tolerance),
   and a long reduction adds the growth of its partial sums to its own elements only.

   Half precision (float16, bfloat16; ``docs/half-precision.md``): a kernel's compute format
   (``kernels.precision.computes_in``) says how it rounds inside.  The lab's kernels declare
   "float32 inside": they compute in float32 and round once what they return, so the operations
   inside run at float32's u (``Policy.compute``) and the ULPS term, at the format's u, is the
   final rounding.  A kernel that declares nothing is judged as plain NumPy computes
   (``Policy.plain``): every result and every sum rounded in the format, term by term, and only
   a matrix product's accumulation in float32; that model rounds more than "float32 inside",
   never less, so a correct kernel of either kind passes.  A composition's layer outputs and the
   steps between its layers round at the format's u (the rounding model's ``format`` part).

2. The forward against the oracle: the same rule on the output elements.  A float64 forward whose
   errors exceed float64's spread but lie within float32's is recognised as computing in lower
   precision: a finding, judged at float32's roundoff for the forward part and the inputs only
   (the backward part keeps float64's: ``Spread.at``), and finite differences take float32's step.

3. Central finite differences (float64, step h = u^(1/3) times the tensor's scale):

        fd_tol = FD_SAFETY * u64^(2/3) + 4 * u * sum|f * dout| / (h * scale),  FD_SAFETY = 1e4,

   truncation h^2 |L'''| / 6 against rounding u |L| / h, relative to scale = |g| |v|.  The hand
   leg agrees with FD when |<hand, v> - D_v| <= fd_tol * scale + sum_i |v_i| tol_i (FD's error
   plus the hand leg's own rounding).  Richardson extrapolation (4 D(h) - D(2h)) / 3 and the
   complex step as options: see ``richardson_tol`` and ``complex_step_tol``.

4. The aggregate test (``checks.aggregate``): beside the element-wise rule, the bias of the
   hand error along autodiff's gradient, b_S = sum_S (h_i - g_i) g_i / sum_S g_i^2, over the
   whole tensor and over every slice S (one index of one axis: a row, a head, a token), judged
   against the same rounding model's samples projected the same way:

        |b_S| <= BIAS_LAMBDA sigma_S + BIAS_ULPS u_c + round_S + kink_S,

   BIAS_LAMBDA = 3.36 (the model's rounding noise has rms u where rounding to nearest has at
   most u / sqrt(3): 3.36 model spreads are 5.8 real ones, P(|t_64| > 5.8) = SET_ODDS = 2e-7
   per set with 64 samples per part; 5.8 model spreads in a float64 check, whose reference is
   a float64 run with roundings and library functions of its own: ``Policy.bias_lambda``), BIAS_ULPS = 2 (up to two rounded constants along a
   path scale a tensor by up to u each of the format they are held in, and the model perturbs
   no constant the oracle folds), round_S the final rounding of what the kernel returns (the ULPS term's share,
   at most u; a second test takes the bias beyond fl(g), g rounded to the format, which is
   known, with round_S the bound of the few elements whose value crosses elsewhere), kink_S
   the kinks' bound.  A set carried by fewer than BIAS_MIN_ELEMENTS = 3
   elements ((sum g^2)^2 / sum g^4: a one-element slice, a dominant class, a peaked attention
   row) pools nothing and is left to the element-wise rule.  A uniform error is averaged over
   the whole tensor, so the test sees 10-100x smaller uniform or one-slice errors than the
   element-wise rule, whose spread per element is several u.

A registry row may override any field (``Row.tolerance``), as JAX's test specs carry a per-dtype
tolerance; ``python -m checks calibrate`` measures the margins (docs/tolerances.md).
"""
from __future__ import annotations

import dataclasses
import math

import numpy

# a floating format (bfloat16 included) and its numpy.finfo: one definition, the kernels'
from kernels.precision import finfo, is_float_dtype as is_float  # noqa: F401
from kernels.precision import COMPUTE_FORMATS, FLOAT32_INSIDE

U64 = float(numpy.finfo(numpy.float64).eps) / 2

SAMPLES = 64          # perturbed runs per part of the rounding model (checks.rounding)
SAMPLE_WORK = 2 ** 32  # samples x recorded elements beyond which a program runs fewer samples:
#                        13 runs of the whole model at the bench's size, 0.93 s each on 2 cores
MIN_SAMPLES = 16      # ... but never fewer than this (LAMBDA 16, BIAS_LAMBDA 5.0 at 16)
ELEMENT_ODDS = 3e-11  # a correct element's chance to fall outside LAMBDA estimated spreads
SET_ODDS = 2e-7       # a correct set's chance to fall outside the aggregate test's band
REAL_PER_MODEL = math.sqrt(3)  # model spreads per real one: the model draws each rounding with
#                                rms u, round-to-nearest errs uniformly within u (rms u / sqrt 3)


def student(odds: float, samples: int = SAMPLES) -> float:
    """t with P(|t_samples| > t) = odds: the multiple of a spread estimated from ``samples``
    draws (mean known to be zero) that a draw of the spread's own distribution exceeds with
    those odds."""
    from scipy.special import stdtrit
    return -float(stdtrit(samples, odds / 2))  # the lower tail: odds / 2 kept to full precision


def samples_for(elements: int) -> int:
    """Perturbed runs of a rounding-model program of ``elements`` recorded elements: SAMPLES,
    or as many as SAMPLE_WORK allows (at least MIN_SAMPLES) for a program too large for
    SAMPLES runs in about the time of the rest of its check (the whole model at the bench's
    size: 331 million elements, 16 runs).  Fewer runs estimate the spread less well, and the
    policy's multiples widen to match (``Policy.for_samples``): a sharper check of a large
    program costs more runs, not a narrower quantile."""
    if SAMPLES * elements <= SAMPLE_WORK:
        return SAMPLES
    return max(MIN_SAMPLES, min(SAMPLES, SAMPLE_WORK // max(int(elements), 1)))


def unit_roundoff(dtype) -> float:
    """u = eps / 2 of a floating format."""
    return float(finfo(dtype).eps) / 2


@dataclasses.dataclass(frozen=True)
class Policy:
    """Every constant of the checker's tolerances; a row may replace any of them."""
    LAMBDA: float = student(ELEMENT_ODDS)  # spreads of the rounding model an element may err
    #                                        by: 8.0 at SAMPLES = 64 (16.0 at 16)
    ULPS: float = 4.0               # plus this many units of the element's own last place
    FD_SAFETY: float = 1e4          # FD truncation constant (third derivatives of order ten)
    COMPLEX_STEP_ULPS: float = 1e3  # complex step: rounding only
    FD_ELEMENTWISE_MAX: int = 256   # tensors up to this size also get element-wise FD
    BIAS_LAMBDA: float = student(SET_ODDS) / REAL_PER_MODEL  # the aggregate test: rms of the
    #                                bias's model draws allowed: 3.36 at SAMPLES = 64 (5.0 at 16)
    BIAS_ULPS: float = 2.0          # ... plus this many u of the constants' format (the floor)
    BIAS_MIN_ELEMENTS: float = 3.0  # sets carried by fewer elements ((sum g^2)^2 / sum g^4) are
    #                                 the element-wise rule's: the 5-draw band rests on pooling
    LOW_PRECISION: str = "float32"  # the lower precision a float64 forward is recognised in
    # per half-precision format, the formats of a kernel's (results and sums, products'
    # accumulation) inside: the lab's kernels compute in float32 and round once what they
    # return (kernels.precision), a rounding the ULPS term covers; in a composition the rounding
    # model's format and returns parts cover the roundings between layers and of what each
    # layer returns (checks.rounding)
    compute: tuple = (("float16", ("float32", "float32")), ("bfloat16", ("float32", "float32")))
    # ... and of a kernel that declares no compute format: plain NumPy rounds every result and
    # sum in the format and accumulates a matrix product in float32 (kernels.precision.PLAIN)
    plain: tuple = (("float16", ("float16", "float32")), ("bfloat16", ("bfloat16", "float32")))

    def override(self, changes=None, dtype=None) -> "Policy":
        """This policy with a registry row's overrides (``Row.tolerance``): field -> value for
        every dtype, or dtype name -> {field: value} for one dtype only."""
        changes = dict(changes or {})
        fields = {f.name for f in dataclasses.fields(self)}
        per_dtype = changes.pop(numpy.dtype(dtype).name, {}) if dtype is not None else {}
        mine = {k: v for k, v in {**changes, **per_dtype}.items() if k in fields}
        unknown = set(changes) - fields - {"float64", "float32", "float16", "bfloat16"}
        if unknown:
            raise ValueError(f"tolerance override: no policy field {sorted(unknown)}; the fields "
                             f"are {sorted(fields)}")
        return dataclasses.replace(self, **mine) if mine else self

    def bias_lambda(self, dtype=None) -> float:
        """BIAS_LAMBDA for a kernel returning dtype.  Its cut by REAL_PER_MODEL assumes the
        reference exact and the kernel's roundings correctly rounded; where the reference is
        a run in the kernel's own precision (a float64 check: the oracle's float64 run), the
        difference carries both runs' roundings, and their library functions (tanh, exp) err
        by up to 2 ulp, not u / sqrt(3): XLA's float64 tanh at 60 random points, -2 to +2
        ulp of the exact value.  There the model's spreads are not cut (student(SET_ODDS),
        5.8 at SAMPLES = 64).  A correct float64 GELU MLP (tanh) failed 4 of 100 seeds with
        the cut, its bias up to 1.45 bands, by this test alone."""
        if dtype is not None and unit_roundoff(dtype) <= U64:
            return self.BIAS_LAMBDA * REAL_PER_MODEL
        return self.BIAS_LAMBDA

    def for_samples(self, samples: int) -> "Policy":
        """This policy for spreads estimated from ``samples`` perturbed runs instead of SAMPLES:
        LAMBDA and BIAS_LAMBDA scaled by Student's quantiles at the same odds (``student``), so
        a row's own multiples keep their ratio to the default."""
        if samples == SAMPLES:
            return self
        return dataclasses.replace(
            self, LAMBDA=self.LAMBDA * student(ELEMENT_ODDS, samples) / student(ELEMENT_ODDS),
            BIAS_LAMBDA=self.BIAS_LAMBDA * student(SET_ODDS, samples) / student(SET_ODDS))

    def for_compute(self, compute) -> "Policy":
        """This policy for a kernel of the compute format ``compute`` (``kernels.precision``:
        FLOAT32_INSIDE keeps ``compute``, PLAIN judges half precision by ``plain``)."""
        if compute not in COMPUTE_FORMATS:
            raise ValueError(f"compute: expected one of {COMPUTE_FORMATS}, got {compute!r}")
        return self if compute == FLOAT32_INSIDE else dataclasses.replace(self, compute=self.plain)

    def u(self, dtype) -> tuple:
        """(u of results and sums, u of a product's accumulation) of a format under this
        policy."""
        inside = dict(self.compute).get(numpy.dtype(dtype).name)
        if inside is None:
            return (unit_roundoff(dtype),) * 2
        return tuple(unit_roundoff(f) for f in inside)

    def elementwise(self, spread_scale, reference, dtype):
        """tol_i from the model's error scale s_i (already at the right roundoffs)."""
        u = unit_roundoff(dtype)
        return (self.LAMBDA * spread_scale + self.ULPS * u * numpy.abs(reference)
                + self.tiny(dtype))

    def tiny(self, dtype) -> float:
        """The absolute error allowed an element below the format's normal range, where
        rounding is absolute: ULPS of its smallest subnormals."""
        return self.ULPS * float(finfo(dtype).smallest_subnormal)

    def fd_tol(self, rounding_abs, h, scale, u=U64):
        """Relative tolerance of a central difference (module docstring, 3)."""
        scale = max(scale, numpy.finfo(numpy.float64).tiny)
        return self.FD_SAFETY * u ** (2 / 3) + 4 * u * rounding_abs / (h * scale)

    def richardson_tol(self, rounding_abs, h, scale, u=U64):
        """(4 D(h) - D(2h)) / 3: truncation falls to order u^(4/5); rounding grows by 4.5 / 3."""
        scale = max(scale, numpy.finfo(numpy.float64).tiny)
        return self.FD_SAFETY * u ** (4 / 5) + 6 * u * rounding_abs / (h * scale)

    def complex_step_tol(self):
        """Im L(x + i h v) / h has no subtraction: rounding only, a few u of |g| |v|."""
        return self.COMPLEX_STEP_ULPS * U64


DEFAULT = Policy()


def fd_step(scale, u=U64):
    """Central-difference step for a tensor of typical magnitude scale: the u^(1/3) rule."""
    return u ** (1 / 3) * max(1.0, float(scale))


def richardson_step(scale, u=U64):
    """Step of Richardson's (4 D(h) - D(2h)) / 3: truncation h^4 against rounding u / h."""
    return u ** (1 / 5) * max(1.0, float(scale))


def fd_tol(rounding_abs, h, scale, u=U64):
    return DEFAULT.fd_tol(rounding_abs, h, scale, u)


def richardson_tol(rounding_abs, h, scale, u=U64):
    return DEFAULT.richardson_tol(rounding_abs, h, scale, u)


def complex_step_tol():
    return DEFAULT.complex_step_tol()
