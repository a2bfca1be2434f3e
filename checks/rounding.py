"""How large a correct kernel's rounding errors are, element by element: a Monte Carlo
rounding-error model run on the oracle's own program.

Every floating-point operation returns its exact result times (1 + delta) with |delta| <= u, the
unit roundoff of the format (IEEE 754; Higham, "Accuracy and Stability of Numerical Algorithms",
ch. 2).  How those deltas reach a gradient element depends on the whole computation: a gradient
that is a small difference of large terms (cancellation) carries errors as large as the terms, a
sum of k terms carries errors that grow with k, an exponent amplifies the error of its argument.
A bound from the result's size, or from the tensor's largest element, misses all of that.

The model: trace the oracle's forward and its VJP (``jax.vjp`` driven by the check's upstream
gradient) as one program, then re-run that program with every rounding operation perturbed,

    every operation with a floating result (add, mul, exp, rsqrt, dot ...)
                                    + u_e xi |out|                        (the result's rounding)
    matrix products of k terms (dot_general)
                                    + u_s xi A                            (the accumulation)
    sums of k terms (reduce_sum, cumsum, scatter-add)
                                    + u_e xi max(A, sqrt(sum_i S_i^2))
    A = sqrt((k + 1) (sum_i t_i^2 + 2 S^2) / 6)
    exact operations (reshape, select, max, neg, convert ...)   unchanged
    array constants of the program (a table the oracle computes in NumPy)
                                    + u_e xi |value|             (the kernel holds them rounded)

with xi ~ N(0, 1) independent for every operation and element (Monte Carlo arithmetic, Parker
1997).  A sum taken one term after the other rounds every partial sum S_i = t_1 + ... + t_i
(Higham 4.2): its error is sum_i delta_i S_i, of rms u sqrt(sum_i S_i^2).  A is that rms for the
same k terms taken in a uniformly random order (``_random_order``; S the total): about
k rms|t| / sqrt(2) for terms of random sign, k^(3/2) |t| / sqrt(3) for terms of one sign.  It
bounds what a pairwise or blocked sum (BLAS, NumPy along a contiguous axis) makes of the same
terms, whose partial sums are smaller, and it does not depend on an order the kernel may not
share; a sum whose order is known to be the index order (NumPy along a non-contiguous axis,
ml_dtypes' bfloat16 always) is charged at least that order's own sqrt(sum_i S_i^2).  An earlier
model charged sqrt(1 + log2 k) sum|terms| (a worst case of the pairwise sum's growth, Higham &
Mary 2019): for terms of random sign about sqrt(2 (1 + log2 k)) times A (3.9 at k = 2048).
A matrix product's accumulation is its own part (``forward_sums``, ``backward_sums``), at the
roundoff of the format it accumulates in; a sum's accumulation rounds with the sum's results, at
the roundoff of its results: plain NumPy on half-precision arrays accumulates a product in
float32 but a sum in the format itself (``kernels.precision.PLAIN``, ``Policy.plain``).
The root-mean-square deviation of the perturbed results from the exact one, element by element, is
the rounding error that a correct implementation of the same maths shows at that element; the
same deviations projected on the exact result over the whole tensor and each slice
(``Spread.bias``) are the null distribution of the aggregate test (``checks.aggregate``).

A composition of layers (the whole model) marks each layer as a call named ``layer:NAME``
(``reference.layers.BOUNDARY``).  There the model follows what a half-precision composition does
(``kernels.precision``): inside a layer the operations round at the compute format (float32), the
layer's outputs are rounded to the checked format (the seventh part, ``returns``), and so is
every operation between layers (the residual sums: the sixth part, ``format``).  What a layer
returns was rounded already by its last operation, at the compute format: a second rounding
happens only where the checked format is coarser (float16 or bfloat16 computed in float32), so
``returns`` is charged the format's u there and nothing where the two are one format (a float32
or float64 composition, whose layers' last roundings the forward part holds).  A program
without layer calls is one kernel.

Errors are linear in u to first order, so the program runs once at a simulation roundoff U_SIM
(far above float64's own rounding, small enough to stay linear) and the spread is scaled to any
format.  Perturbations are drawn separately for the parts of the program — the forward's results
and its sums (operations that do not depend on the upstream gradient), the backward's results and
its sums, and the inputs — so a kernel that rounds its results to float16 but accumulates in
float32, or whose forward runs in a lower precision than its backward, is modelled part by part
(``Spread.at``).

A small program's samples run under ``jax.vmap`` in one program, compiled once per oracle and
shape and called once per part and chunk of samples: the chunk is sized from the memory the
machine has (``memory_budget``: a quarter of what is available, or $GRADLAB_MEMORY_BUDGET); its
draws are made on the host, once per chunk for every part, and every amplitude comes from one
exact run; the program returns the runs' deviations side by side and the host sums their
squares and projections (a reduction per output in the program is a kernel per output for XLA
to compile).  A large program (beyond LARGE_ELEMENTS recorded elements: the whole model at the
bench's size) runs one sample per call of one compiled program, in which every part's noise
scale is an argument: where the check's roundoffs are known (they are, before any finding), all
parts are perturbed at once at those roundoffs, errors of independent parts adding in variance,
so each sample is one run instead of six (``Spread``'s combined form, which computes the spread
part by part only if other roundoffs are asked for).  Its noise is sliced from one pool of
normal draws at random offsets with random signs (``_pool_noise``: the same expected squared
deviations as independent draws, where a random-number call per operation costs more than the
run); only the amplitudes of sums' accumulations (A, a second product, of the squares, for a
matrix product) come from the exact run, every other amplitude is the result's own |value|, taken in
the perturbed run itself (equal to first order in u).  The kink runs take the same draws as the
spreads.

Kinks: every comparison of the program (``PREDICATES``, max and min) has a margin (the
difference of its operands); its spread under the check's own roundoffs comes from the same
perturbed runs (``RoundingModel.kinks``); where the margin is within KINK_SIGMAS spreads of zero,
a correct kernel may take either branch, and the exact program rerun with it flipped says how far
each output moves.  Non-finite results (an oracle's -inf mask) are exact; ``lax.scan`` is unrolled.
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from checks import program_cache
from checks.aggregate import slice_count, slice_sums
from checks.tolerances import samples_for  # perturbed runs per part of the program (its LAMBDA)
from reference.layers import BOUNDARY

U_SIM = 2.0 ** -30   # the simulation's roundoff; spreads are scaled by u / U_SIM
MEMORY_ENV = "GRADLAB_MEMORY_BUDGET"  # bytes one chunk of samples may take (4G, 512M, 2**31)
MEMORY_FRACTION = 4              # by default a chunk takes at most 1/4 of the available memory
MEMORY_UNKNOWN = 2 ** 31         # the budget where the available memory cannot be read
BYTES_PER_SAMPLE_ELEMENT = 16    # per sample and recorded element: its float64 value and the
#                                  values the program keeps beside it (broadcasts, transposes)
LARGE_ELEMENTS = 2 ** 22         # recorded elements beyond which a program runs a sample at a time
POOL = 2 ** 24                   # normal draws a large program's noise is sliced from (_pool_noise)
PARTS = ("forward", "forward_sums", "backward", "backward_sums", "inputs", "format", "returns")

EXACT = {"neg", "abs", "sign", "max", "min", "select_n", "reshape", "transpose",
         "broadcast_in_dim", "squeeze", "expand_dims", "slice", "dynamic_slice",
         "dynamic_update_slice", "gather", "concatenate", "pad", "rev", "copy", "copy_p",
         "stop_gradient", "reduce_max", "reduce_min", "argmax", "argmin", "iota", "floor",
         "ceil", "round", "clamp", "sort", "convert_element_type", "real", "imag", "conj",
         "optimization_barrier", "sharding_constraint", "cummax", "cummin", "scatter",
         "device_put", "split", "tile"}
SUMS = {"dot_general", "reduce_sum", "cumsum", "scatter-add", "scatter_add"}
# the small programs' compilation, which dominates their check's first call: XLA's optimisation
# passes off, and its element-wise loops emitted the older way (without the fusion emitters the
# whole model's amplitude and spread programs at the registry's size compiled in 5.6 s and 6.7 s
# against 9.2 s and 7.6 s with them, on a 2-core machine without AVX-512)
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
                "xla_cpu_use_fusion_emitters": False}
# comparisons: a kink where the branch taken changes (checks.engine judges either branch there)
PREDICATES = {"gt", "ge", "lt", "le", "eq", "ne"}
BRANCHES = PREDICATES | {"max", "min"}
ONE_BY_ONE_WORK = 2 ** 28  # flips x recorded elements moved one at a time (their sum bounds any
#                            subset: about a second at 1e3 flips of a 1e5-element program); beyond:
#                            the move of all flips plus the spread of random halves (``_moves``)
ONE_BY_ONE_BATCH = (16, 128)  # flips per compiled batch: as many as 2**25 recorded elements allow
SUBSETS = 16         # beyond ONE_BY_ONE_WORK: runs with a random half of the flips flipped, whose
#                      spread around half the all-flipped move measures sum_j m_j^2 (``_moves``)
SUBSET_SIGMAS = 6.0  # rms of a kernel's random subset the bound allows: 6 sigmas of a Gaussian
#                      sum (2e-9), with sum_j m_j^2 read from SUBSETS runs (P(chi2_16 / 16 < 1/4),
#                      a bound at half its sigmas, is 1e-4)
KINK_SIGMAS = 8.0    # a predicate within this many spreads of its margin (the rms of the
#                      comparison's operand difference under the model's noise, each operation at
#                      its full roundoff) may flip in a kernel: beyond it a Gaussian error has odds
#                      of 1e-15, and the model charges a sum the growth of one taken term by term
CALLS = {"jit", "pjit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call",
         "custom_vjp_call", "custom_vjp_call_jaxpr"}


class Unsupported(Exception):
    """The program uses a construct the model does not perturb (while, cond)."""


class Spread(NamedTuple):
    """Root-mean-square deviation per element and part of the program, at roundoff U_SIM.

    A large program's spread is measured with every part perturbed at once, at the roundoffs
    of the check (``roundoffs``, one per part): then ``forward`` holds that combined spread at
    U_SIM times the largest of them, the other parts are zero, and ``at`` answers other
    roundoffs in proportion, or from the part-by-part spread that ``refine`` computes (once,
    on demand: a check that changes its roundoffs, a precision finding)."""
    forward: np.ndarray
    forward_sums: np.ndarray
    backward: np.ndarray
    backward_sums: np.ndarray
    inputs: np.ndarray
    format: np.ndarray
    returns: np.ndarray
    # the same seven parts for the deviations projected on the exact result, per set of
    # ``checks.aggregate.slice_sums`` (the whole tensor, then every slice): the rms of
    # sum_S d_i e_i, the null distribution of the aggregate test's bias (None: not computed)
    bias: "Spread | None" = None
    roundoffs: tuple | None = None   # combined at these roundoffs (PARTS order); None: by part
    used: tuple = ()                 # the parts the program perturbs (combined form)
    refine: object = None            # () -> this leaf's Spread part by part (combined form)

    def at(self, forward, backward=None, inputs=0.0, format=None):
        """The rounding-error scale of every element, each part at its own roundoff.

        ``forward`` and ``backward`` are u or a pair (u of results, u of sums); ``inputs`` is the
        relative rounding of the inputs (0: the kernel receives them exactly); ``format`` the
        roundoff of the checked format, which the operations between the layers of a
        composition round to, and what its layers return where it is coarser than the
        forward's results (default: the forward's results)."""
        us = roundoffs(forward, backward, inputs, format)
        if self.roundoffs is None:
            return np.sqrt(sum((u / U_SIM * s) ** 2 for u, s in zip(us, self[:len(PARTS)])))
        ratio = _common_ratio(us, self.roundoffs, self.used)
        if ratio is not None:
            return ratio * max(self.roundoffs) / U_SIM * self.forward
        return self.refine().at(forward, backward, inputs, format)


def roundoffs(forward, backward=None, inputs=0.0, format=None) -> tuple:
    """The seven roundoffs of ``Spread.at``'s arguments, in PARTS order: what a layer returns
    rounds a second time only to a format coarser than its results' (module docstring)."""
    backward = forward if backward is None else backward
    (fe, fs), (be, bs) = _pair(forward), _pair(backward)
    format = fe if format is None else format
    return (fe, fs, be, bs, inputs, format, format if format > fe else 0.0)


def _common_ratio(us, measured, used):
    """c where us = c x measured on every part the program perturbs (``used``), else None."""
    ratios = set()
    for k in used:
        if measured[k] == 0:
            if us[k] != 0:
                return None
            continue
        ratios.add(us[k] / measured[k])
    if not ratios:
        return 0.0
    lo, hi = min(ratios), max(ratios)
    return lo if hi - lo <= 1e-12 * hi else None


def _pair(u):
    return tuple(u) if isinstance(u, (tuple, list)) else (u, u)


class RoundingModel:
    """The perturbed program of one oracle at fixed shapes; ``spread`` runs it on values.

    One exact run records the noise amplitude of every sum's accumulation (A, module
    docstring); one compiled program, called once per part of the program and chunk of
    samples, then runs that part's perturbed runs under ``jax.vmap``, which add amplitude x
    noise and nothing else (to first order in u the amplitude of the exact run is the amplitude
    of the perturbed one, so the perturbed runs never recompute A; a result's own
    |value| they take as they go), and hands their deviations to the host, which sums the
    spreads.  The spreads and the kink runs take the
    same draws (``_sampler``).  The programs are compiled without XLA's costly passes: a
    model, not a result."""

    def __init__(self, program, args, dout_index, samples=None, group=None):
        self.closed, self.shapes = jax.make_jaxpr(program, return_shape=True)(*args)
        flat, _ = jax.tree_util.tree_flatten(args)
        counts = [len(jax.tree_util.tree_leaves(a)) for a in args]
        start = sum(counts[:dout_index])
        self.backward_in = [start <= i < start + counts[dout_index] for i in range(len(flat))]
        self.record = []  # (shape, part) of every perturbation, in program order
        kept = []         # whether its amplitude is kept from the exact run (a sum's)
        self.layered = _has_layers(self.closed.jaxpr)
        counter = _Noise("record", self.record, kept=kept)
        jax.eval_shape(lambda f: self._eval(f, counter), flat)
        self.has_branches = counter.branches > 0
        self.sizes = [math.prod(shape) for shape, _ in self.record]
        self.elements = sum(self.sizes)
        # SAMPLES runs per part, fewer for a program whose runs would dominate its check's time
        self.samples = samples or samples_for(self.elements)
        # beyond LARGE_ELEMENTS a program runs one sample at a time, its noise sliced from a
        # pool (``_pool_noise``), every part at once where the roundoffs are known (``_large``);
        # below, a chunk's draws are made on the host and feed every part
        self.large = self.elements > LARGE_ELEMENTS
        # the exact runs of a large program are compiled with XLA's passes: its sums' amplitudes
        # (a second product per product, partial sums) then run in 2.6 s instead of 7 s at the
        # bench's size, for 0.6 s more of compilation (measured on the whole model)
        exact_options = {} if self.large else FAST_COMPILE
        # every program traced once per oracle, shapes and code, then read from disk
        key = program_cache.fingerprint(str(self.closed.jaxpr), *self.closed.consts,
                                        repr((self.backward_in, self.large, self.samples)))
        # group: the name the caller knew these programs by before tracing (the oracle's,
        # ``checks.legs``), under which an earlier process noted the executables it loaded
        group = group or key
        jit = lambda fn, options, **kw: program_cache.jit(fn, f"{key}:{fn.__name__}",
                                                          compiler_options=options, group=group,
                                                          **kw)
        program_cache.read_ahead(group)  # what an earlier process loaded, on a thread of its own
        self._amplitudes_run = jit(self._amplitudes, exact_options)
        self._margins_run = jit(self._margins, exact_options)
        self._run = jit(self._spreads, FAST_COMPILE)
        self._sample_run = jit(self._one_sample, exact_options)
        self._flips_run = jit(self._flips, FAST_COMPILE)
        self._moves_run = jit(self._moves, exact_options, static_argnums=(2,))
        self._one_by_one_run = jit(self._one_by_one, FAST_COMPILE)
        # the oracle's program itself, as XLA compiles it by default: the autodiff leg's run
        self._oracle_run = jit(self._oracle, None)
        self.used = tuple(sorted({p for _, p in self.record}))
        # operation -> index of its amplitude kept from the exact run: every operation's in a
        # small program (the perturbed runs then trace no |value|), only the sums' beyond
        # LARGE_ELEMENTS (every amplitude kept would take as much memory as a sample)
        keep = [not self.large or k for k in kept]
        self.kept = {k: i for i, k in enumerate(k for k, kk in enumerate(keep) if kk)}

    def _oracle(self, *flat):
        return jcore.jaxpr_as_fun(self.closed)(*flat)

    def oracle_run(self, args):
        """The program's outputs at args (its pytree, as traced): the oracle's run itself, from
        the same trace as the model's (checks.legs.Oracle.vjp)."""
        return self.outputs(self._oracle_run(*jax.tree_util.tree_leaves(args)))

    def exact(self, args):
        """The exact run at args, as ``spread_and_flips`` takes it back (``_amplitudes``): a
        check takes the oracle's values from it (``outputs``), so one run and one compiled
        program give both the autodiff leg and the spreads' amplitudes."""
        return self._amplitudes_run(jax.tree_util.tree_leaves(args))

    def outputs(self, flat_outputs):
        """Flat outputs (an exact run's first item) as the program's pytree."""
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(self.shapes),
                                            list(flat_outputs))

    def _eval(self, flat, noise):
        return _eval(self.closed.jaxpr, self.closed.consts, flat, self.backward_in, noise,
                     where="between" if self.layered else "inside")

    def margins(self, flat):
        """Every comparison's margin at the arguments flat, in program order: where its sign
        changes, the program takes another branch.  A small program reuses the exact run that
        ``spread`` compiled (one program less to compile); a large one runs only the
        operations its comparisons read (no amplitudes, no backward: XLA drops what no margin
        needs)."""
        return self._margins_run(flat) if self.large else self._amplitudes_run(flat)[2]

    def _margins(self, flat):
        preds = []
        self._eval(flat, _Noise("exact", None, preds=preds))
        return preds

    def _amplitudes(self, flat):
        """(the exact run's outputs, the kept amplitudes (``self.kept``) in program order, every
        comparison's margin): one exact run, made once per ``spread`` or ``kinks`` and not
        once per part and chunk of samples."""
        amplitudes, preds = [], []
        exact = self._eval(flat, _Noise("amplitude", amplitudes, preds=preds, kept=self.kept))
        if self.large:  # kept in float32, half the memory: a noise scale needs no precision
            amplitudes = [a.astype(jnp.float32) for a in amplitudes]
        return exact, amplitudes, preds

    def _perturbed(self, flat, amplitudes, samples, scale, preds=None):
        """The program's outputs (and predicates, into ``preds``) under each sample's noise,
        batched over the chunk: ``samples`` are the draws (``_sampler``); ``scale(k)`` is the
        noise scale of operation k, or None where it adds none."""
        def one(f, sample):
            noise = _Noise("perturb", amplitudes, kept=self.kept, scale=scale,
                           preds=None if preds is None else [], noises=sample)
            return self._eval(f, noise), noise.preds
        outs, p = jax.vmap(one, in_axes=(None, 0))(flat, samples)
        if preds is not None:
            preds.extend(p)
        return outs

    def _pool_noise(self, pool, offsets, signs):
        """One sample's noise of every operation: operation k reads signs[k] x pool[offsets[k]:
        offsets[k] + its size].  Distinct elements of one operation read distinct entries, and
        two operations' noises are uncorrelated (independent random signs), so the expected
        squared deviation of every output is that of independent draws.  A slice costs a copy;
        a random-number call per part took longer than the perturbed run itself (37 s against
        1.2 s per sample of the whole model at the bench's size)."""
        return [signs[k] * jax.lax.dynamic_slice(pool, (offsets[k],), (n,)).reshape(shape)
                for k, (n, (shape, _)) in enumerate(zip(self.sizes, self.record))]

    def _one_sample(self, flat, exact, pool, offsets, signs, weights):
        """A large program's perturbed run for one sample (``_pool_noise``), operation k of part
        p at noise scale weights[p] (zero: unperturbed): per output, its squared deviation and
        the deviation's projections (``_projected``); per comparison, its margin's squared
        deviation."""
        outputs, amplitudes, exact_margins = exact
        noise = _Noise("perturb", amplitudes, kept=self.kept,
                       scale=lambda k: weights[self.record[k][1]],
                       preds=[] if self.has_branches else None,
                       noises=self._pool_noise(pool, offsets, signs))
        outs, margins = self._eval(flat, noise), noise.preds or []
        # a non-finite result the perturbations leave unchanged (a -inf mask) deviates by 0
        deviations = [jnp.where(p == e, 0.0, p - e) for p, e in zip(outs, outputs)]
        return ([d ** 2 for d in deviations], _projected([d[None] for d in deviations], outputs),
                [jnp.where(p == e, 0.0, p - e) ** 2 for p, e in zip(margins, exact_margins)])

    def _large(self, flat, exact, seed, weights, stream=0x40D):
        """Sums over the samples of ``_one_sample``'s three lists at these part weights, one
        sample at a time (the draws of sample i depend on the seed and i alone)."""
        rng = np.random.default_rng([seed, stream])
        pool = jax.device_put(rng.standard_normal(POOL + max(self.sizes), np.float32))
        weights = jnp.asarray(weights, jnp.float64)
        total = None
        for _ in range(self.samples):
            offsets = rng.integers(0, POOL, len(self.record), dtype=np.int32)
            signs = rng.choice(np.array([-1.0, 1.0], np.float32), len(self.record))
            got = self._sample_run(flat, exact, pool, offsets, signs, weights)
            if total is None:  # the host's sums, added to in place (no array per sample)
                total = [[np.array(a, np.float64) for a in group] for group in got]
                continue
            for sums, group in zip(total, got):
                for a, b in zip(sums, group):
                    a += np.asarray(b)
        return total

    def _spreads(self, flat, exact, amplitudes, samples, part):
        """Every output's deviations under the noise of one part only (traced: one program for
        all parts), side by side (``_side_by_side``): the host sums their squares and
        projections (``_host_sums``)."""
        parts = [p for _, p in self.record]
        scale = lambda k: jnp.where(parts[k] == part, U_SIM, 0.0)
        perturbed = self._perturbed(flat, amplitudes, samples, scale)
        # a non-finite result the perturbations leave unchanged (a -inf mask) deviates by 0
        return _side_by_side([jnp.where(p == e, 0.0, p - e) for p, e in zip(perturbed, exact)])

    def _flips(self, flat, amplitudes, exact_margins, samples, scales):
        """Every comparison's margin deviations in the perturbed runs of the chunk (noise: the
        standard draws times the roundoff of each operation's part), side by side
        (``_side_by_side``)."""
        margins = []
        self._perturbed(flat, amplitudes, samples, lambda k: scales[self.record[k][1]], margins)
        # a non-finite margin the perturbations leave unchanged (a -inf mask) deviates by 0
        return _side_by_side([jnp.where(p == e, 0.0, p - e)
                              for p, e in zip(margins, exact_margins)])

    def _sampler(self, seed, stream):
        """n -> the noise of the next n samples of a small program: every operation's draws,
        made once on the host and taken by every part (float32: the noise needs no
        precision)."""
        rng = np.random.default_rng([seed, stream])
        return lambda n: jax.device_put([rng.standard_normal((n,) + shape, np.float32)
                                         for shape, _ in self.record])  # (n, ...) each

    def _moves(self, flat, flips, subsets):
        """Per output, how far it may move with a subset of the flipping predicates flipped in
        the exact run, and how many flip.  To first order the moves of single flips m_j add
        (a branch of leaky ReLU changes its slope at one element, and the backward is linear
        in the slopes), so the subset c a kernel takes moves an output by sum_j c_j m_j.  The
        run with every predicate flipped gives M = sum_j m_j; SUBSETS runs with a random half
        flipped give D_r = M(half_r) - M / 2 = sum_j s_j m_j / 2, s_j = +-1 at random, whose
        mean square is sum_j m_j^2 / 4.  A kernel's branches are not chosen by the signs of
        the moves they cause, so for c_j of any probabilities p_j independent of those signs,
        sum_j c_j m_j = p M + sum_j (p_j - p) m_j + sum_j (c_j - p_j) m_j has a mean within |M|
        and random parts of rms at most sqrt(sum_j m_j^2 / 2): the move is bounded by
        |M| + SUBSET_SIGMAS sqrt(2) rms_r D_r.  (``_each_flip``'s sum of |m_j| bounds any
        subset, and is taken where it is affordable, with subsets = 0: then |M| alone, for the
        flips' interactions.)"""
        exact = self._eval(flat, _Noise("exact", None))
        moved = lambda subset: [jnp.where(f == e, 0.0, f - e) for f, e in zip(
            self._eval(flat, _Noise("exact", None, flips=subset)), exact)]
        every = moved(flips)
        count = sum(jnp.sum(f) for f in flips)
        if not subsets:
            return [jnp.abs(a) for a in every], count

        def half(squares, r):
            key = jax.random.fold_in(jax.random.PRNGKey(0x5B5), r)
            keep = [jax.random.bernoulli(jax.random.fold_in(key, k), 0.5, jnp.shape(f))
                    for k, f in enumerate(flips)]
            d = [m - 0.5 * a for m, a in zip(moved([f & h for f, h in zip(flips, keep)]),
                                               every)]
            return [q + x * x for q, x in zip(squares, d)], None

        squares, _ = jax.lax.scan(half, [jnp.zeros(jnp.shape(e)) for e in exact],
                                  jnp.arange(subsets))
        return [jnp.abs(a) + SUBSET_SIGMAS * jnp.sqrt(2.0 * q / subsets)
                for a, q in zip(every, squares)], count

    def _one_by_one(self, flat, masks):
        """Per output, sum_k |how far it moves with predicate element k alone flipped| over a
        batch of one-hot masks (K, ...) per predicate."""
        exact = self._eval(flat, _Noise("exact", None))
        flipped = jax.vmap(lambda m: self._eval(flat, _Noise("exact", None, flips=m)))(masks)
        return [jnp.sum(jnp.where(f == e, 0.0, jnp.abs(f - e)), axis=0)
                for f, e in zip(flipped, exact)]

    def _each_flip(self, flat, flips):
        """sum_k |move of flip k alone| per output: to first order a bound on the move of any
        subset of the flips a kernel may take (None beyond ONE_BY_ONE_WORK)."""
        where = [(p, i) for p, f in enumerate(flips) for i in np.flatnonzero(f)]
        if not where or len(where) * max(self.elements, 1) > ONE_BY_ONE_WORK:
            return None
        low, high = ONE_BY_ONE_BATCH  # one compiled batch size per model, a power of two
        size = 1 << int(np.clip(np.log2(2 ** 25 / max(self.elements, 1)),
                                np.log2(low), np.log2(high)))
        total = None
        for start in range(0, len(where), size):
            batch = where[start:start + size]
            # a short last batch is padded with empty masks, which move nothing
            masks = [np.zeros((size, f.size), bool) for f in flips]
            for k, (p, i) in enumerate(batch):
                masks[p][k, i] = True
            masks = [m.reshape((size,) + f.shape) for m, f in zip(masks, flips)]
            sums = [np.asarray(s, np.float64) for s in self._one_by_one_run(flat, masks)]
            total = sums if total is None else [a + b for a, b in zip(total, sums)]
        return total

    def kinks(self, args, us, seed=0, flips=None):
        """(a pytree like the program's output of how far each element moves with its kinks'
        branches flipped, the number of predicate elements that flip), with noise at the
        roundoffs us (one per part, ``PARTS``) times KINK_SIGMAS; None without comparisons.
        flips: where the predicates flip, when ``spread_and_flips`` found them already."""
        if not self.has_branches:
            return None
        flat, _ = jax.tree_util.tree_flatten(args)
        if flips is None and self.large:
            exact = self._amplitudes_run(flat)
            margins = self._large(flat, exact, seed, self._weights(us), stream=0x4B1)[2]
            flips = self._flipping(exact, self._at_roundoffs(margins, us))
        elif flips is None:
            draw, exact, sums = self._sampler(seed, 0x4B1), self._amplitudes_run(flat), None
            for n in _chunks(self.samples, self.elements):
                sums = self._add_margins(sums, flat, exact, draw(n), us)
            flips = self._flipping(exact, sums)
        tree = jax.tree_util.tree_structure(self.shapes)
        if not any(f.any() for f in flips):  # nothing flips: no program to trace and run
            return (jax.tree_util.tree_unflatten(tree, [np.zeros(s.shape) for s in
                                                        jax.tree_util.tree_leaves(self.shapes)]),
                    0)
        each = self._each_flip(flat, flips)
        moved, n = self._moves_run(flat, flips, 0 if each is not None else SUBSETS)
        moved = [np.asarray(m, np.float64) for m in moved]
        if each is not None:
            moved = [np.maximum(m, e) for m, e in zip(moved, each)]
        return jax.tree_util.tree_unflatten(tree, moved), int(n)

    def _add_margins(self, sums, flat, exact, samples, us):
        """sums plus each comparison's squared margin deviations under the standard normal
        draws of ``samples`` (``_sampler``) scaled to each part's roundoff in ``us`` (exact:
        ``_amplitudes``'s run)."""
        _, amplitudes, margins = exact
        scales = np.asarray(us, np.float32)  # (parts,)
        deviations = _split(self._flips_run(flat, amplitudes, margins, samples, scales),
                            [np.shape(m) for m in margins])
        found = _summed_squares(deviations)
        return found if sums is None else [a + b for a, b in zip(sums, found)]

    def _flipping(self, exact, sums):
        """Per comparison, where its exact margin is within KINK_SIGMAS of its spread: a
        kernel's rounding may take the other branch there (a margin the noise leaves unchanged,
        exact or non-finite, never flips)."""
        return [np.abs(np.asarray(m, np.float64)) < KINK_SIGMAS * np.sqrt(s / self.samples)
                for m, s in zip(exact[2], sums)]

    def spread(self, args, seed=0):
        """A pytree like the program's output with one Spread per leaf."""
        return self.spread_and_flips(args, seed)[0]

    def spread_and_flips(self, args, seed=0, kink_us=None, exact=None):
        """(``spread``, where the predicates flip with the same draws at the roundoffs kink_us,
        for ``kinks``: None without kink_us or comparisons).  One exact run gives every
        operation's amplitude; each chunk of normal draws then feeds every part's perturbed
        runs and the flip runs (the same draws, ``_samples``).  A large program with kink_us
        runs every part at once at those roundoffs (``Spread``'s combined form).  exact: this
        model's ``exact`` run at the same args, when the caller made it already."""
        flat, _ = jax.tree_util.tree_flatten(args)
        exact = self._amplitudes_run(flat) if exact is None else exact
        if self.large and kink_us is not None:
            return self._combined(flat, exact, seed, tuple(kink_us))
        if self.large:
            return self._tree(self._by_part_large(flat, exact, seed)), None
        draw, outputs = self._sampler(seed, 0x40D), [np.asarray(e) for e in exact[0]]
        # one compiled program, run once per part and chunk of samples: memory holds one
        # chunk's runs (``_chunks``); a part with no perturbation, such as the format of a
        # single layer, spreads nothing
        sums, margins = {}, None
        for n in _chunks(self.samples, self.elements):
            samples = draw(n)  # once for every part and the flip runs
            for part in self.used:
                sq = _host_sums(self._run(flat, *exact[:2], samples, part), outputs)
                sums[part] = sq if part not in sums else [a + b for a, b in zip(sums[part], sq)]
            if kink_us is not None and self.has_branches:
                try:
                    margins = self._add_margins(margins, flat, exact, samples, kink_us)
                except Exception:  # a program the flip runs cannot follow: ``kinks`` says why
                    kink_us = margins = None
        flips = None if margins is None else self._flipping(exact, margins)
        return self._tree(self._by_part(sums)), flips

    def _by_part(self, sums):
        """Per output, its Spread part by part from each part's summed squares (outputs, then
        projections)."""
        shapes = [s.shape for s in jax.tree_util.tree_leaves(self.shapes)]
        zeros = [np.zeros(shape) for shape in shapes] + [np.zeros(slice_count(shape))
                                                          for shape in shapes]
        per_part = [[np.sqrt(a / self.samples) for a in sums[part]] if part in sums else zeros
                    for part in range(len(PARTS))]
        leaves = list(zip(*per_part))  # per output: its seven parts; then per output, its bias's
        return [Spread(*(np.asarray(rms, np.float64) for rms in leaf),
                       bias=Spread(*(np.asarray(rms, np.float64) for rms in bias)))
                for leaf, bias in zip(leaves[:len(shapes)], leaves[len(shapes):])]

    def _tree(self, leaves):
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(self.shapes), leaves)

    def _weights(self, us):
        """Noise scale of each part for runs at the roundoffs us: U_SIM at the largest."""
        top = max(us)
        return [U_SIM * u / top if top else 0.0 for u in us]

    @staticmethod
    def _at_roundoffs(squares, us):
        """Squared deviations of runs at ``_weights(us)`` scaled to the roundoffs us."""
        return [a * (max(us) / U_SIM) ** 2 for a in squares]

    def _by_part_large(self, flat, exact, seed):
        """A large program's spreads part by part: a run per part and sample."""
        sums = {}
        for part in self.used:
            sq, pj, _ = self._large(flat, exact, seed, [U_SIM * (p == part)
                                                        for p in range(len(PARTS))])
            sums[part] = list(sq) + list(pj)
        return self._by_part(sums)

    def _combined(self, flat, exact, seed, us):
        """A large program's spreads at the roundoffs us, every part perturbed at once (one run
        per sample instead of one per part and sample: errors add in variance, parts being
        independent), with the flips of the same runs; each Spread refines itself part by
        part when asked for other roundoffs (``Spread.at``)."""
        sq, pj, margins = self._large(flat, exact, seed, self._weights(us))
        memo = []

        def by_part():
            if not memo:
                memo.append(self._by_part_large(flat, exact, seed))
            return memo[0]

        def combined(rms, refine):
            rms = np.sqrt(np.asarray(rms, np.float64) / self.samples)
            zero = np.zeros_like(rms)
            return Spread(rms, *[zero] * (len(PARTS) - 1), roundoffs=us, used=self.used,
                          refine=refine)
        leaves = [combined(a, lambda i=i: by_part()[i])._replace(
                      bias=combined(b, lambda i=i: by_part()[i].bias))
                  for i, (a, b) in enumerate(zip(sq, pj))]
        flips = self._flipping(exact, self._at_roundoffs(margins, us)) if self.has_branches \
            else None
        return self._tree(leaves), flips


def _side_by_side(arrays):
    """Per-sample arrays (N, ...), at least one, side by side in one (N, total) float64 array:
    a program hands the host one array, which sums it (``_host_sums``), instead of reducing
    every output itself.  Every reduction is a kernel of its own for XLA to compile: the
    registry's whole model's spreads program compiled in 4.0-4.6 s this way against 7.1 s with
    its reductions, and its cold float64 check took 17.3-22.5 s against 21.2-24.1 s (the 2-core
    machine without AVX-512)."""
    n = jnp.shape(arrays[0])[0]
    return jnp.concatenate([jnp.reshape(a, (n, -1)).astype(jnp.float64) for a in arrays], axis=1)


def _split(side_by_side, shapes):
    """``_side_by_side``'s array back into (N, *shape) arrays, on the host."""
    flat = np.asarray(side_by_side, np.float64)
    ends = np.cumsum([math.prod(shape) for shape in shapes])[:-1]
    return [part.reshape((len(flat),) + tuple(shape))
            for part, shape in zip(np.split(flat, ends, axis=1), shapes)]


def _host_sums(side_by_side, outputs):
    """Per output, its deviations' squares summed over the samples, then per output the same of
    their projections (``_projected``): the lists ``_one_sample`` returns, from ``_spreads``."""
    deviations = _split(side_by_side, [np.shape(e) for e in outputs])
    return _summed_squares(deviations) + _projected(deviations, outputs, np)


def _summed_squares(deviations):
    """Per (N, ...) array, its squares summed over the N samples: (...) each."""
    return [np.einsum("n...,n...->...", d, d) for d in deviations]


def _projected(deviations, exact, xp=jnp):
    """Per output, the samples' deviations projected on the exact result over every set of
    ``checks.aggregate.slice_sums``, squared and summed over the samples: (sets,) each."""
    return [xp.sum(slice_sums(d * _finite(e, xp), lead=1, xp=xp) ** 2, axis=0)
            for d, e in zip(deviations, exact)]


def _available_memory() -> int | None:
    """Bytes the machine can still give (MemAvailable), or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def parse_bytes(text) -> int:
    """'4G', '512M', '64k' or a number of bytes -> bytes (powers of 1024)."""
    value = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    if value and value[-1] in "KMGT":
        scale, value = 1024 ** ("KMGT".index(value[-1]) + 1), value[:-1]
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number > 0:
        raise ValueError(f"{MEMORY_ENV}: expected a size such as 4G, 512M or a number of "
                         f"bytes, got {text!r}")
    return int(number * scale)


def memory_budget(environ=None) -> int:
    """Bytes one chunk of samples may take: $GRADLAB_MEMORY_BUDGET when set, else a quarter
    (1 / MEMORY_FRACTION) of the memory the machine has available now, else MEMORY_UNKNOWN."""
    environ = os.environ if environ is None else environ
    if environ.get(MEMORY_ENV, "").strip():
        return parse_bytes(environ[MEMORY_ENV])
    available = _available_memory()
    return MEMORY_UNKNOWN if available is None else available // MEMORY_FRACTION


def _chunks(samples, elements, budget=None):
    """Sample counts that add up to ``samples``, each chunk within ``budget`` bytes (default
    ``memory_budget()``) at BYTES_PER_SAMPLE_ELEMENT per sample and recorded element; a chunk
    is never smaller than one sample."""
    budget = memory_budget() if budget is None else budget
    n = samples
    while n > 1 and n * elements * BYTES_PER_SAMPLE_ELEMENT > budget:
        n //= 2
    return [n] * (samples // n) + ([samples % n] if samples % n else [])


class _Noise:
    """The perturbation of each rounding operation, in program order.

    "record": notes (shape, part) in ``store`` and whether it is a sum's accumulation in
    ``kept``, and adds nothing; "amplitude": the exact run, which keeps the amplitudes of the
    operations in ``kept`` (operation -> index) and adds nothing; "perturb": adds amplitude x
    scale(k) x noises[k], with the kept amplitudes in ``store`` (the others taken as it goes);
    "exact": adds nothing."""

    def __init__(self, mode, store, noises=None, preds=None, flips=None, *, kept=None,
                 scale=None):
        self.mode, self.store, self.noises, self.count = mode, store, noises, 0
        self.preds, self.flips, self.branches = preds, flips, 0
        self.kept, self.scale = kept, scale

    def __call__(self, shape, part, amplitude, accumulation=False):
        """What to add to a result: ``amplitude()`` is its noise scale, evaluated once (in the
        exact run where kept, in the perturbed run otherwise); ``accumulation``: a sum's."""
        k, self.count = self.count, self.count + 1
        if self.mode == "record":
            self.store.append((tuple(shape), PARTS.index(part)))
            self.kept.append(accumulation)
            return 0.0
        if self.mode == "amplitude":
            if k in self.kept:
                self.store.append(amplitude())
            return 0.0
        scale = None if self.mode == "exact" else self.scale(k)
        if scale is None:  # None: another part's operation
            return 0.0
        a = self.store[self.kept[k]] if k in self.kept else amplitude()
        return _times(a, _times(self.noises[k], scale))

    def branch(self, name, ins, out):
        """A comparison's (or max/min's) result: its margin (the difference of its operands,
        whose sign decides the branch) kept in ``preds``, flipped where ``flips`` says (max
        then takes the smaller operand)."""
        k, self.branches = self.branches, self.branches + 1
        if self.preds is not None:
            self.preds.append(jnp.broadcast_to(ins[0] - ins[1], jnp.shape(out)))
        if self.flips is None:
            return out
        if name in PREDICATES:
            return jnp.where(self.flips[k], ~out, out)
        other = jnp.minimum(*ins) if name == "max" else jnp.maximum(*ins)
        return jnp.where(self.flips[k], other, out)


def _is_float(x):
    return jnp.issubdtype(jnp.result_type(x), jnp.floating)


# The interpreter adds a noise term to every operation of the program it traces: with lax's
# primitives directly, not jax.numpy's operators, whose every call is itself a jitted function
# traced anew (about a third of a check's first call at the registry's size went there).

def _as(y, x):
    """y (a Python number or an array, of x's shape or a scalar) as an array like x."""
    y = jax.lax.convert_element_type(y, jax.lax.dtype(x))
    shape = jnp.shape(x)
    return y if jnp.shape(y) == shape else jax.lax.broadcast_in_dim(y, shape, ())


def _plus(x, y):
    """x + y, y a noise term (0.0 where none)."""
    if isinstance(y, (int, float)) and y == 0:
        return x
    return jax.lax.add(x, _as(y, x))


def _times(x, y):
    """x * y, y a Python number, a scalar or an array of x's shape."""
    return jax.lax.mul(x, _as(y, x))


def _size(x):
    """|x| where finite, 0 elsewhere: a rounding's amplitude (``_finite``)."""
    return _finite(jax.lax.abs(x))


def _has_layers(jaxpr):
    """Does the program mark layers (calls named ``layer:NAME``), at any depth?"""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in CALLS:
            if str(eqn.params.get("name", "")).startswith(BOUNDARY):
                return True
            sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            if sub is not None and _has_layers(sub.jaxpr if hasattr(sub, "consts") else sub):
                return True
    return False


def _read_by_forward(jaxpr, backward_flags):
    """The variables some forward equation (one not depending on dout) reads."""
    flag, read = dict(zip(jaxpr.invars, backward_flags)), set()
    for eqn in jaxpr.eqns:
        ins = [v for v in eqn.invars if not isinstance(v, jcore.Literal)]
        backward = any(flag.get(v, False) for v in ins)
        if not backward:
            read.update(ins)
        flag.update((v, backward) for v in eqn.outvars)
    return read


def _eval(jaxpr, consts, args, backward_flags, noise, top=True, where="inside", out_read=None):
    """Evaluate a jaxpr with every rounding perturbed.  where: "inside" a kernel (parts
    forward/backward and their sums) or "between" the layers of a composition (part format;
    what a layer returns: part returns);
    out_read: per output, whether the caller's forward reads it (not only its backward)."""
    env, flag = {}, {}
    last_use = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not isinstance(v, jcore.Literal):
                last_use[v] = i
    keep = {v for v in jaxpr.outvars if not isinstance(v, jcore.Literal)}
    out_read = [True] * len(jaxpr.outvars) if out_read is None else out_read
    forward_read = _read_by_forward(jaxpr, backward_flags) | {
        v for v, r in zip(jaxpr.outvars, out_read) if r and not isinstance(v, jcore.Literal)}

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for var, value in zip(jaxpr.constvars, consts):
        if _is_float(value) and jnp.ndim(value):  # a kernel holds its constants rounded
            value = _plus(value, noise(jnp.shape(value), "forward", lambda v=value: _size(v)))
        env[var], flag[var] = value, False
    for var, value, b in zip(jaxpr.invars, args, backward_flags):
        if top and not b and _is_float(value):  # the inputs' own rounding
            value = _plus(value, noise(jnp.shape(value), "inputs", lambda v=value: _size(v)))
        env[var], flag[var] = value, b
    for i, eqn in enumerate(jaxpr.eqns):
        ins = [read(v) for v in eqn.invars]
        backward = any(flag.get(v, False) for v in eqn.invars if not isinstance(v, jcore.Literal))
        name = eqn.primitive.name
        if name in CALLS:
            sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            inner = sub.jaxpr if hasattr(sub, "consts") else sub
            flags = [False if isinstance(v, jcore.Literal) else flag[v] for v in eqn.invars]
            layer = str(eqn.params.get("name", "")).startswith(BOUNDARY)
            outs = _eval(inner, getattr(sub, "consts", []), ins, flags, noise, top=False,
                         where="inside" if layer else where,
                         out_read=[backward or v in forward_read for v in eqn.outvars])
            if layer:  # what the layer returns is rounded to the checked format; what it
                # keeps for its backward (JAX's residuals) stays in its cache, unrounded
                outs = [_plus(o, noise(jnp.shape(o), "returns", lambda o=o: _size(o)))
                        if _is_float(o) and (backward or v in forward_read) else o
                        for o, v in zip(outs, eqn.outvars)]
        elif name == "scan":  # a static trip count: unrolled, every step's roundings perturbed
            flags = [False if isinstance(v, jcore.Literal) else flag[v] for v in eqn.invars]
            outs = _scan(eqn, ins, flags, noise, where)
        elif name in ("while", "cond"):
            raise Unsupported(f"control flow ('{name}') in the oracle")
        else:
            out = eqn.primitive.bind(*ins, **eqn.params)
            if name in BRANCHES and all(_is_float(x) for x in ins):
                out = noise.branch(name, ins, out)
            outs = out if eqn.primitive.multiple_results else [out]
            part = ("backward" if backward else "forward") if where == "inside" else "format"
            outs = [_round(name, eqn, ins, o, noise, part) for o in outs]
        for var, value in zip(eqn.outvars, outs):
            env[var], flag[var] = value, backward
        for v in eqn.invars:  # free what no later equation reads (memory at large sizes)
            if not isinstance(v, jcore.Literal) and last_use.get(v) == i and v not in keep:
                env.pop(v, None)
    return [read(v) for v in jaxpr.outvars]


def _scan(eqn, ins, flags, noise, where):
    """A scan's outputs (final carry, stacked ys) with its body evaluated step by step."""
    p = eqn.params
    body, nc, ncar = p["jaxpr"], p["num_consts"], p["num_carry"]
    consts, carry, xs = list(ins[:nc]), list(ins[nc:nc + ncar]), list(ins[nc + ncar:])
    steps = range(p["length"] - 1, -1, -1) if p["reverse"] else range(p["length"])
    ys = []
    for i in steps:
        outs = _eval(body.jaxpr, body.consts, consts + carry + [x[i] for x in xs], flags,
                     noise, top=False, where=where)
        carry, y = outs[:ncar], outs[ncar:]
        ys.append(y)
    if p["reverse"]:
        ys.reverse()
    n_ys = len(body.jaxpr.outvars) - ncar
    return carry + [jnp.stack([y[k] for y in ys]) for k in range(n_ys)]


def _round(name, eqn, ins, out, noise, part):
    """out with the rounding perturbation of its operation (exact operations unchanged)."""
    if name in EXACT or not _is_float(out):
        return out
    exact = out
    out = _plus(out, noise(jnp.shape(out), part, lambda: _size(exact)))
    if name not in SUMS:
        return out
    # a product accumulates in its own part; a sum rounds with its results (module docstring)
    sums = part + "_sums" if name == "dot_general" and part != "format" else part
    return _plus(out, noise(jnp.shape(out), sums,
                            lambda: _finite(_sum_amplitude(name, eqn, ins, exact)),
                            accumulation=True))


def _finite(amplitude, xp=jnp):
    """A non-finite result (an oracle's -inf mask) is exact: no rounding to perturb it by (in a
    traced program, or on the host with xp = np)."""
    if xp is np:
        return np.where(np.isfinite(amplitude), amplitude, 0.0)
    return jax.lax.select(jax.lax.is_finite(amplitude), amplitude, _as(0.0, amplitude))


def _sum_amplitude(name, eqn, ins, out):
    """The rms of the partial sums of a sum of k terms taken one after another in a random order,
    sqrt((k + 1) (sum_i t_i^2 + 2 S^2) / 6) for the total S (module docstring); for reduce_sum
    and cumsum at least sqrt(sum_i S_i^2), the partial sums' in index order."""
    params = eqn.params
    if name == "dot_general":
        (contract, _), _ = params["dimension_numbers"]
        k = math.prod(jnp.shape(ins[0])[d] for d in contract)
        squares = eqn.primitive.bind(ins[0] * ins[0], ins[1] * ins[1], **params)
    elif name in ("reduce_sum", "cumsum"):
        axes = params.get("axes", (params.get("axis", 0),))
        k = math.prod(jnp.shape(ins[0])[d] for d in axes)
        squares = eqn.primitive.bind(ins[0] * ins[0], **params)
        return jnp.maximum(_random_order(k, squares, out),
                           _sequential(name, params, ins[0], out, axes))
    else:  # scatter-add: each output adds the updates whose ids repeat it to its operand
        k = eqn.primitive.bind(jnp.ones_like(ins[0]), ins[1], jnp.ones_like(ins[2]), **params)
        squares = eqn.primitive.bind(ins[0] * ins[0], ins[1], ins[2] * ins[2], **params)
    return _random_order(k, squares, out)


def _random_order(k, squares, total):
    """sqrt(E sum_i S_i^2) over the partial sums S_i = t_1 + ... + t_i of k terms in a uniformly
    random order, from sum_i t_i^2 (``squares``) and S_k (``total``): E S_i^2 is i S / k squared
    plus the variance of a sample of i of the k terms, which sum over i to (k + 1)(Q + 2 S^2) / 6.
    Terms of random sign give about k rms|t| / sqrt(2), terms of one sign k^(3/2) |t| / sqrt(3):
    the error of a sum taken one term after another (Higham 4.2), which bounds the same sum taken
    pairwise or in blocks (BLAS, NumPy's pairwise sum), in any order that does not sort its
    terms; a large term cancelled by another (1e8 - 1e8 + ...) enters through its square."""
    return jnp.sqrt((k + 1) / 6.0 * (squares + 2.0 * total * total))


def _sequential(name, params, x, out, axes):
    """sqrt(sum_i S_i^2) over the partial sums S_i of a sum over ``axes`` taken term by term (in
    index order); for a cumsum, of every partial sum up to each output."""
    if name == "cumsum":
        return jnp.sqrt(jax.lax.cumsum(out * out, axis=params["axis"],
                                       reverse=params["reverse"]))
    lead = tuple(range(len(axes)))
    terms = jnp.moveaxis(x, axes, lead).reshape((-1,) + jnp.shape(out))      # (k, *out)
    partial = jnp.cumsum(terms, axis=0)                                       # (k, *out)
    return jnp.sqrt(jnp.sum(partial * partial, axis=0))
