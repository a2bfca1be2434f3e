"""The three-legged gradient check: hand backward, autodiff of the oracle, finite differences.

All three legs are driven by the same random upstream gradient ``dout`` (never the gradient of
``out.sum()``, which is identically zero through a softmax), rounded to the checked dtype so the
hand kernel and the trusted legs differentiate exactly the same function of exactly the same
numbers.  ``check_layer`` is a pipeline of named stages:

    prepare     validate the arguments, move the inputs to the host, draw dout
    oracle      the oracle's output and its VJP (float64)
    hand        the kernel's forward and backward in the checked dtype
    forward     the kernel's output against the oracle's; precision findings
    rounding    the rounding model's spread for every output and gradient element
    legs        per tensor: finite differences, then ``judge`` (hand vs autodiff, both vs FD)
    diagnose    for a failure: the bug shape that fits and where it is worst

``LayerCheck`` keeps what the stages computed, so ``judge`` can rule on another hand gradient
for the same case without running any leg again (``checks.sensitivity`` injects errors that way).
A broken kernel or oracle (raising, misshapen or missing gradients, non-finite values) gives a
failing report, never an exception.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import time
import traceback
from typing import Callable, NamedTuple, Sequence

import numpy as np

from checks import aggregate, arrangements, contract, tolerances
from checks.diagnosis import Context, constants_from, diagnose, locate, of_autodiff
from checks.evidence import blame, examine, pick
from checks.legs import (FD_JOINT_TENSORS, FiniteDifferences, Joint, Measured, Oracle, normwise,
                         relative)
from checks.report import Report, TensorResult, format_table, reports_to_json  # noqa: F401
from checks.rounding import Unsupported, roundoffs
from checks.signature import in_format, moved, precision_change, smooth
from checks.verdict import BLAMES_ORACLE, Finding, Kind, Note, Verdict
from kernels.backend import to_numpy
from kernels.precision import compute_format_of

CHECKER_STREAM = 0x6C6162  # mixed into the seed of the checker's random stream
# why FD is set aside where it alone disagrees and nothing lets autodiff differ from the
# derivative of its forward (a shared bug of hand and oracle needs a custom rule, a
# stop_gradient or a forward that disagrees, and FD fails the kernel there)
FD_ALONE = ("FD alone disagrees, and autodiff is the derivative of the oracle's forward (no "
            "custom derivative rule, stop_gradient or non-differentiable operation in its "
            "program; the forwards agree): FD's own error, its step across curvature")
SMOOTH_STREAM = 1          # ... and this, for the moved inputs of a forward's precision finding
FALLBACK_SAFETY = 64.0     # normwise fallback when the oracle has no rounding model


class _Failed(Exception):
    """A stage could not run: the report says which part and why."""

    def __init__(self, part, message):
        super().__init__(message)
        self.part, self.message = part, message


def _raised(part, exc):
    return (f"the {part} raised {type(exc).__name__}: {exc}".strip() + "\n"
            + traceback.format_exc(limit=-2))


def _nonfinite(label, a):
    a = np.asarray(a, dtype=np.float64)
    n_nan, n_inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
    return f"non-finite values in the {label}: {n_nan} NaN, {n_inf} Inf"


def _as_tuple(dinputs, n):
    """Backward returns a bare gradient for one input, a tuple for several."""
    if n == 1 and not isinstance(dinputs, (tuple, list)):
        return (dinputs,)
    if not isinstance(dinputs, (tuple, list)) or len(dinputs) != n:
        got = f"{len(dinputs)} values" if isinstance(dinputs, (tuple, list)) else \
            type(dinputs).__name__
        raise ValueError(f"backward returned {got} for the input gradients, expected a tuple of "
                         f"{n} (one per input, None for non-differentiable)")
    return tuple(dinputs)


def _like(array, inputs):
    """dout on the same backend as the inputs (CuPy inputs get a CuPy dout)."""
    for x in inputs:
        if type(x).__module__.startswith("cupy"):
            import cupy
            return cupy.asarray(array)
    return array


def _f64(a):
    return np.asarray(a).astype(np.float64)


def check_layer(forward: Callable, backward: Callable, oracle: Callable, inputs: Sequence,
                params: dict, *, static: dict | None = None, nondiff: Sequence[int] = (),
                seed: int = 0, name: str = "layer", input_names: Sequence[str] | None = None,
                axes: dict | None = None, sizes: dict | None = None, fd: str = "central",
                policy: tolerances.Policy = tolerances.DEFAULT, dout=None) -> Report:
    """Check a hand forward/backward pair against its JAX oracle and finite differences.

    forward(*inputs, params, **static) -> (out, cache); backward(dout, cache) -> (dinputs,
    dparams) with dinputs aligned with inputs (a bare array for a single input, None for
    non-differentiable ones) and dparams a dict with the keys of params; oracle(*inputs,
    params, **static) -> out in jax.numpy.  The hand pair runs in the dtype of the given inputs
    (NumPy or CuPy; float64, float32, float16 or bfloat16); the oracle and the finite
    differences run in float64 on the host.  Integer inputs (token ids, targets) are never
    differentiated; ``nondiff`` adds more.

    name: the layer's name in the report.  input_names: a name per input (default input0, ...).
    static: keyword arguments of both forward and oracle (causal=True, a dropout mask).
    axes: tensor name -> axis names, to report the worst element as ``batch 3, head 1, ...``
    (and label the heat maps of ``Report.plot``); a key naming no tensor is a ValueError.
    sizes: the layer's named sizes (B, T, H, P ...: name -> positive int), to name a wrong scale
    factor; a size that is the length of no axis of the case's tensors names nothing, and "H"
    is the number of heads a grouped reduction is looked for over.
    fd: "central" (u^(1/3) step), "richardson", "complex", or "none" (hand vs autodiff only,
    for large models: a failure then cannot say which of the two is wrong).
    policy: the tolerance policy (``checks.tolerances.Policy``), e.g. a registry row's override.
    dout: the upstream gradient (the output's shape), rounded to the checked dtype; by default a
    random one from the checker's seeded stream (``checks.bisection`` passes a composition's own).
    seed: seeds that stream (dout, the finite-difference directions, the rounding model).
    """
    return LayerCheck(forward, backward, oracle, inputs, params, static=static, nondiff=nondiff,
                      seed=seed, name=name, input_names=input_names, axes=axes, sizes=sizes,
                      fd=fd, policy=policy, dout=dout).run()


class LayerCheck:
    """One check's stages and everything they computed (see the module docstring)."""

    def __init__(self, forward, backward, oracle, inputs, params, *, static=None, nondiff=(),
                 seed=0, name="layer", input_names=None, axes=None, sizes=None, fd="central",
                 policy=tolerances.DEFAULT, dout=None, tape=None):
        self.forward_fn, self.backward_fn, self.oracle_fn = forward, backward, oracle
        # a composition's tape factory (checks.bisection): its failure is bisected to a stage
        self.tape = tape
        self.inputs, self.params = contract.inputs_list(inputs), params
        self.static, self.nondiff, self.seed, self.name = dict(static or {}), set(nondiff), seed, name
        self.input_names, self.axes, self.sizes = input_names, dict(axes or {}), sizes
        # half precision is judged by the compute format the kernel declares (plain NumPy's
        # rounding when it declares none: kernels.precision.computes_in)
        self.fd_scheme, self.given_dout = fd, dout
        if not isinstance(policy, tolerances.Policy):
            raise TypeError(f"policy: expected a checks.tolerances.Policy (tolerances.DEFAULT, "
                            f"or one made from it), got {policy!r} ({type(policy).__name__})")
        self.policy = policy.for_compute(compute_format_of(forward, backward))
        self.notes, self.forward_error, self.forward_score = [], math.nan, math.nan
        self.forward_ok, self.judges, self.kink_moved = False, {}, {}
        self.seconds = {}  # stage -> seconds it took in ``run`` (``_timed``)
        self._inner = 0.0  # seconds of the stages run inside the one being timed
        self.flipped = 0   # predicate elements within rounding of a kink (``_find_kinks``)
        # the kinks' moves only widen tolerances: they are run when an element needs them
        # (``settle_kinks``); False runs them with the spreads, whatever the result
        self.defer_kinks = True
        self.kinks_deferred = False  # the moves are not run yet (``settle_kinks`` runs them)
        self.failed = None  # the report of a run that stopped where a part raised
        # key -> the allowance of another arrangement of the oracle's maths (``_arrangement``)
        self.arranged, self._arranged_where = {}, ""

    @contextlib.contextmanager
    def _timed(self, stage):
        """Adds the seconds of the block to ``self.seconds[stage]`` (experiments.checker_cost
        prints where a check's time goes).  A stage run inside another (the kinks' moves that
        a failing leg asks for) counts as its own, not the enclosing one's."""
        start, inner = time.perf_counter(), self._inner
        self._inner = 0.0
        try:
            yield
        finally:
            took = time.perf_counter() - start
            self.seconds[stage] = self.seconds.get(stage, 0.0) + took - self._inner
            self._inner = inner + took

    # --- stages ----------------------------------------------------------------------------

    def prepare(self):
        n = len(self.inputs)
        self.names = list(self.input_names) if self.input_names else [f"input{i}" for i in range(n)]
        if len(self.names) != n:
            raise ValueError(f"input_names: expected {n} names (one per input), got "
                             f"{len(self.names)}")
        wrong = [i for i in self.nondiff if not isinstance(i, (int, np.integer)) or not 0 <= i < n]
        if wrong:
            raise ValueError(f"nondiff: expected indices of the inputs, 0 to {n - 1}, got "
                             f"{sorted(wrong, key=repr)}")
        if not isinstance(self.params, dict):
            raise TypeError(f"params: expected a dict of the layer's parameters (name -> array, "
                            f"{{}} for none), got {type(self.params).__name__}")
        contract.hand_arrays(self.names, self.inputs, self.params)
        contract.named_sizes(self.sizes)
        lengths = contract.axis_lengths([*self.inputs, *self.params.values()])
        unmatched = [f"{k} = {v}" for k, v in (self.sizes or {}).items() if v not in lengths]
        if unmatched:  # most likely a size given for another case: it names nothing here
            self.notes.append(Note(Finding.SIZES_UNMATCHED, (("sizes", ", ".join(unmatched)),)))
        self.host_inputs = [np.asarray(to_numpy(x)) for x in self.inputs]
        self.host_params = {k: np.asarray(to_numpy(v)) for k, v in self.params.items()}
        known = set(self.names) | set(self.host_params)
        unknown = sorted(set(self.axes) - known)
        if unknown:
            raise ValueError(f"axes: no tensor named {', '.join(map(repr, unknown))}; the "
                             f"tensors are {', '.join(self.names + list(self.host_params))}")
        floats = [x for x in self.host_inputs if tolerances.is_float(x.dtype)] \
            + list(self.host_params.values())
        self.floats = floats
        self.dtype = floats[0].dtype if floats else np.dtype(np.float64)
        named = [(n, x) for n, x in zip(self.names, self.host_inputs)
                 if tolerances.is_float(x.dtype)] \
            + [(f"params[{k!r}]", v) for k, v in self.host_params.items()]
        mixed = [f"{n} is {x.dtype}" for n, x in named if x.dtype != self.dtype]
        if mixed:  # the check is of the first float tensor's format
            self.notes.append(Note(Finding.MIXED_FORMATS, (
                ("dtype", str(self.dtype)), ("first", named[0][0]), ("mixed", ", ".join(mixed)))))
        self.u = tolerances.unit_roundoff(self.dtype)
        self.diff_idx = [i for i, x in enumerate(self.host_inputs)
                         if tolerances.is_float(x.dtype) and i not in self.nondiff]
        self.inputs64 = [_f64(x) if tolerances.is_float(x.dtype) else x for x in self.host_inputs]
        self.params64 = {k: _f64(v) for k, v in self.host_params.items()}
        # the checker's own stream, distinct from a caller's default_rng(seed) that may have
        # drawn the inputs (dout equal to x would make e.g. RMS-norm's gradient vanish)
        self.rng = np.random.default_rng([self.seed, CHECKER_STREAM])

    def oracle(self):
        try:
            self.ref = Oracle(self.oracle_fn, self.inputs64, self.params64, self.static,
                              self.diff_idx)
            out_shape = self.ref.out_shape()
        except Exception as exc:
            raise _Failed("oracle", _raised("oracle", exc))
        # dout as the kernel will see it: rounded to the checked dtype, exactly the same numbers
        dout = self.rng.standard_normal(out_shape)
        if self.given_dout is not None:
            dout = np.asarray(to_numpy(self.given_dout), dtype=np.float64)
            if dout.shape != tuple(out_shape):
                raise ValueError(f"dout: expected the output's shape {tuple(out_shape)}, got "
                                 f"{dout.shape}")
        self.dout = dout.astype(self.dtype)
        self.dout64 = _f64(self.dout)
        try:
            self.ref_out, self.auto_in, self.auto_params = self.ref.vjp(self.dout64,
                                                                        through_model=True)
        except Exception as exc:
            raise _Failed("oracle", _raised("oracle", exc))

    def hand(self):
        try:
            out, cache = contract.forward_result(
                self.forward_fn(*self.inputs, self.params, **self.static))
        except Exception as exc:  # a broken kernel is a failing report, never a crashed suite
            raise _Failed("forward", _raised("hand forward", exc))
        wrong_oracle = contract.oracle_output(self.ref_out.shape, self.ref_out.dtype,
                                              np.shape(out))
        if wrong_oracle:  # before the backward, which would get a dout of the oracle's shape
            if np.shape(out) != self.ref_out.shape and not contract.backward_takes(
                    self.backward_fn, cache, out):
                raise _Failed("forward", f"the hand forward returned shape {np.shape(out)}, "
                                         f"the oracle {self.ref_out.shape}, and the hand "
                                         f"backward does not take a gradient of the forward's "
                                         f"shape: the forward's output looks wrong")
            raise _Failed("oracle", wrong_oracle)
        try:
            dinputs, dparams = contract.backward_result(
                self.backward_fn(_like(self.dout, self.inputs), cache))
            dinputs = _as_tuple(dinputs, len(self.inputs))
            if not isinstance(dparams, dict):
                raise TypeError(f"backward returned {type(dparams).__name__} for the parameter "
                                f"gradients, expected a dict with keys {sorted(self.params)}")
        except Exception as exc:
            raise _Failed("backward", _raised("hand backward", exc))
        self.out, self.dinputs, self.dparams = np.asarray(to_numpy(out)), dinputs, dparams
        self.cache = cache

    def compare_forward(self):
        out = self.out
        if out.shape != self.ref_out.shape:
            raise _Failed("forward", f"the hand forward returned shape {out.shape}, the oracle "
                                     f"{self.ref_out.shape}")
        if not tolerances.is_float(out.dtype):
            raise _Failed("forward", f"the forward returned dtype {out.dtype} for {self.dtype} "
                                     f"inputs")
        if out.dtype.itemsize < self.dtype.itemsize:
            raise _Failed("forward", f"the forward returned dtype {out.dtype} for {self.dtype} "
                                     f"inputs (a lower precision than its inputs)")
        if out.dtype != self.dtype:
            self.notes.append(Note(Finding.PROMOTES, (("dtype", str(self.dtype)),
                                                      ("got", str(out.dtype)))))
        for label, a, part in (("hand forward", out, "forward"), ("oracle", self.ref_out, "oracle")):
            if not np.all(np.isfinite(_f64(a))):
                raise _Failed(part, _nonfinite(label, a))
        self.forward_error = normwise(_f64(out), self.ref_out)

    def rounding(self):
        """Element-wise tolerances of the output and of every trusted gradient."""
        self.u_forward = self.u_backward = self.policy.u(self.dtype)
        # backward stability: a correct forward's results (and so its cache) are the exact
        # results of inputs perturbed by about u, which the backward then differentiates at;
        # where x - mean(x) cancels (near-constant rows under layer norm), that moves the
        # gradient far more than the oracle program's own roundings do
        self.u_inputs = self.u_forward[0]
        self.fd_u = tolerances.U64  # finite differences run the hand forward in float64
        try:
            with self._timed("rounding model: spreads"):
                self.spread_out, self.spread_in, self.spread_params = self.ref.spread(
                    self.dout64, self.seed, kink_us=self._kink_us())
            # a large program's spreads come from fewer runs: wider multiples of them
            if self.ref.samples != tolerances.SAMPLES:
                self.policy = self.policy.for_samples(self.ref.samples)
                self.notes.append(Note(Finding.FEW_SAMPLES, (
                    ("samples", self.ref.samples), ("elements", self.ref.elements),
                    ("lam", self.policy.LAMBDA), ("bias", self.policy.BIAS_LAMBDA))))
        except Unsupported as exc:
            self.spread_out = None
            self.notes.append(Note(Finding.NO_ROUNDING_MODEL, (("why", str(exc).splitlines()[0]),
                                                               ("slack", self._fallback_slack()))))
        self.kink_moved = {}
        self.kinks_deferred = self.defer_kinks and self.spread_out is not None
        if self.kinks_deferred:
            self.flipped = self.ref.flip_count(self.dout64, self._kink_us(), self.seed) or 0
            self.seconds.setdefault("rounding model: kinks", 0.0)
        else:
            self._run_kinks()
        self._judge_forward()

    def _judge_forward(self):
        """The output's tolerance and score (a forward in a lower precision recognised)."""
        self.forward_tol = self._tol(self.spread_out, self.ref_out) + self._moved("out")
        out = _f64(self.out)
        score = _score(out, self.ref_out, self.forward_tol)
        if score > 1 and self.kinks_deferred:  # the output needs the kinks' moves
            self.settle_kinks()
            score = self.forward_score
        low = self._low_precision()
        if score > 1 and low is not None and precision_change(out - self.ref_out, self.ref_out,
                                                             self.forward_tol) \
                and not self._smooth_forward_error(out - self.ref_out):
            # a forward computing in lower precision: judged at that precision's roundoff for
            # the forward part and the inputs it rounds, never for the backward part
            u_low = self.policy.u(low)
            tol_low = self._tol(self.spread_out, self.ref_out, u_forward=u_low,
                                u_inputs=u_low[0])
            if _score(out, self.ref_out, tol_low) <= 1:
                self.notes.append(Note(Finding.LOW_PRECISION_FORWARD,
                                       (("dtype", str(self.dtype)), ("low", low.name),
                                        ("ratio", score))))
                self.u_forward, self.u_inputs, self.forward_tol = u_low, u_low[0], tol_low
                self.fd_u = u_low[0]  # ... which then rounds to the lower precision
                score = _score(out, self.ref_out, tol_low)
        self.forward_score = score
        self.forward_ok = score <= 1

    def _smooth_forward_error(self, error) -> bool:
        """Is the forward's error a bug's, the same function at moved inputs
        (``checks.signature.smooth``)?  The hand forward and the oracle run again with every
        differentiated input and every parameter moved by a random relative 2^-10 (the others
        as they are: the oracle holds them fixed), on the host in float64 as finite
        differences run them.  A forward that cannot run there gives no evidence."""
        rng = np.random.default_rng([self.seed, CHECKER_STREAM, SMOOTH_STREAM])
        inputs, params = list(self.inputs64), moved(self.params64, rng)
        for i, x in zip(self.diff_idx, moved([inputs[i] for i in self.diff_idx], rng)):
            inputs[i] = x
        try:
            out, _ = contract.forward_result(self.forward_fn(*inputs, params, **self.static))
            ref = self.ref.forward_at(inputs, params)
        except Exception:  # noqa: BLE001  (either side failing there decides nothing)
            return False
        return smooth(error, _f64(np.asarray(to_numpy(out))) - _f64(ref))

    def _fallback_slack(self):
        """The normwise fallback's tolerance in units of u x the largest element: what every
        element may err by without a rounding model (the sensitivity lost)."""
        k = 1 + int(self.ref_out.size) + max([int(x.size) for x in self.floats] or [1])
        return FALLBACK_SAFETY * math.sqrt(k)

    def _low_precision(self):
        """The lower precision a kernel of this dtype may be recognised in, or None."""
        low = np.dtype(self.policy.LOW_PRECISION)
        if self.spread_out is None or self.u >= tolerances.unit_roundoff(low):
            return None
        return low

    def _tol(self, spread, reference, u_forward=None, u_inputs=None):
        """tol_i of one tensor from its spread; a normwise fallback without a rounding model."""
        if spread is None:
            scale = float(np.max(np.abs(reference))) if reference.size else 0.0
            return np.full(np.shape(reference), self._fallback_slack() * self.u * scale
                           + float(tolerances.finfo(self.dtype).tiny))
        u_forward = u_forward or self.u_forward
        # a composition's layers return, and its steps between layers run, in the checked
        # format (or the lower precision its forward was recognised in)
        s = spread.at(u_forward, self.u_backward, self.u_inputs if u_inputs is None else u_inputs,
                      format=max(self.u, u_forward[0]))
        return self.policy.elementwise(s, reference, self.dtype)

    def _bands(self, key, g_auto):
        """The aggregate test's bands of one tensor (``checks.aggregate``) at the roundoffs
        ``_tol`` uses; None without a rounding model."""
        spread = self._spread_of(key)
        if spread is None or spread.bias is None:
            return None
        fmt = max(self.u, self.u_forward[0])
        us = (self.u_forward, self.u_backward, self.u_inputs)
        floor_u = max(self.u_forward + self.u_backward + (self.u_inputs,))
        return aggregate.bands(spread.bias.at(*us, format=fmt),
                               spread.at(*us, format=fmt), g_auto, self._moved(key),
                               floor_u=floor_u, final_u=self.u, policy=self.policy,
                               tiny=self.policy.tiny(self.dtype), dtype=self.dtype)

    def legs(self):
        self.fd = FiniteDifferences(self.forward_fn, self.inputs64, self.params64, self.static,
                                    self.dout64, scheme=self.fd_scheme, oracle=self.ref,
                                    u=self.fd_u, policy=self.policy)
        if self.fd.on_oracle:
            self.notes.append(Note(Finding.COMPLEX_STEP_ON_ORACLE))
        if self.fd.skipped:
            self.notes.append(Note(Finding.NO_FINITE_DIFFERENCES))
        self.results = []
        hands = {}
        for key, tname in self._tensor_keys():
            x = self.inputs64[key] if isinstance(key, int) else self.params64[key]
            g_auto = self.auto_in[key] if isinstance(key, int) else self.auto_params[key]
            spread = self._spread_of(key)
            hands[tname] = self.dinputs[key] if isinstance(key, int) else self.dparams.get(key)
            judge = Judge(tname, key, x, g_auto, self._tol(spread, g_auto) + self._moved(key),
                          self.dtype, self.fd, self.rng, self.policy, self._caveats,
                          self._exact_autodiff)
            judge.bands = self._bands(key, g_auto)
            self.judges[tname] = judge
        self._settle_kinks_if_needed(hands)
        self._joint_fd(hands)
        for tname, judge in self.judges.items():
            self.results.append(judge.judge(hands[tname]))
        self._gradient_dtypes()
        self._recognise_low_precision_backward()
        self._bug_shaped_under_a_finding()
        for key in sorted(set(self.dparams) - set(self.params)):
            self.results.append(TensorResult(key, (), verdict=Verdict(
                Kind.EXTRA_GRADIENT, f"'{key}' is not a parameter")))
        for i, name_i in enumerate(self.names):
            if not tolerances.is_float(self.host_inputs[i].dtype) and self.dinputs[i] is not None:
                self.results.append(TensorResult(name_i, (), verdict=Verdict(
                    Kind.EXTRA_GRADIENT, "an integer input; expected None")))

    def _legs_with_kinks(self):
        """The legs; where every gradient agreed with autodiff without the deferred kinks' moves
        but the check fails all the same (finite differences, a finding), the legs again with
        them: the verdict is then the one the kinks' tolerances give, as if run with the
        spreads (the same finite-difference directions: the stream is rewound).  A check that
        passes without them says how many predicates it left unmoved.  Where a gradient still
        fails and the oracle differentiates through a max its maths does not depend on, the
        legs once more against either arrangement of that maths (``_arrangement``)."""
        start = self._snapshot()
        self.legs()
        if self.kinks_deferred and not (self.forward_ok and all(r.ok for r in self.results)):
            self._rewind(start)
            self.settle_kinks()
            start = self._snapshot()
            self.legs()
        if not all(r.ok for r in self.results) and self._arrangement():
            self._rewind(start)  # judged again, each element against either arrangement
            self.legs()
            self.notes.append(Note(Finding.ARRANGEMENT, (("where", self._arranged_where),)))
        if self.kinks_deferred and self.flipped:
            self.notes.append(Note(Finding.KINKS_UNNEEDED, (("flipped", self.flipped),)))

    def _joint_fd(self, hands):
        """A large program's check of many tensors (the whole model at the bench's size): FD
        along joint directions over the tensors whose hand agrees with autodiff, six forward
        runs in place of six per tensor (``FiniteDifferences.measure_joint``).  Where autodiff
        agrees with them, those tensors are settled; otherwise, and for every tensor that
        fails, each tensor takes its own directions as in any check."""
        if len(self.judges) <= FD_JOINT_TENSORS or not self.ref.large:
            return
        passing = {j.key: (j.x, j.g_auto) for name, j in self.judges.items()
                   if j.passes(hands[name])}
        try:
            joint = self.fd.measure_joint(passing, self.rng)
        except Exception:  # the forward raised at a joint point: each tensor's own directions
            return
        if joint is None or not joint.autodiff_agrees:
            return
        for judge in self.judges.values():
            judge.joint = joint
        self.notes.append(Note(Finding.FD_JOINT, (("tensors", len(joint.keys)),
                                                  ("directions", len(joint.values)),
                                                  ("error", joint.autodiff_error))))

    def _gradient_dtypes(self):
        """A gradient returned in another dtype than the inputs' is a finding of the check (as
        the forward's is), so ``assert_layer`` fails on it unless allowed by name."""
        got = [self.dinputs[j.key] if isinstance(j.key, int) else self.dparams.get(j.key)
               for j in self.judges.values()]
        changed = {str(g.dtype) for g in got if getattr(g, "dtype", self.dtype) != self.dtype
                   and tolerances.is_float(g.dtype)}
        known = {dict(n.values).get("got") for n in self.notes if n.finding is Finding.PROMOTES}
        for name in sorted(changed - known):
            self.notes.append(Note(Finding.PROMOTES, (("dtype", str(self.dtype)), ("got", name))))

    def _caveats(self):
        """Why the oracle's autodiff may differ from the derivative of its forward (computed
        on first use, once): its forward disagrees with the kernel's, or its program holds a
        custom derivative rule, stop_gradient, an integer or non-differentiable operation."""
        if not hasattr(self, "_caveat_list"):
            found = self.ref.caveats()
            if not self.forward_ok:
                found = ["a forward that disagrees with the kernel's"] + found
            self._caveat_list = found
        return self._caveat_list

    def _exact_autodiff(self) -> bool:
        """Is the oracle's autodiff the derivative of its forward, which agrees with the
        kernel's: its program read, and no caveat in it (``_caveats``)?"""
        caveats = self._caveats()
        return not caveats and self.ref.program_read

    def _recognise_low_precision_backward(self):
        """The whole backward rounding to a lower precision: every gradient off by more than
        this dtype's rounding model allows (with exact inputs) with the signature of a precision
        change (``checks.signature``: most elements off, no pattern, the values the lower
        precision's numbers), all within the lower precision's tolerances: a finding, and judged
        there.  A single wrong tensor beside exact ones is a bug, whatever its size."""
        low = self._low_precision()
        judges = list(self.judges.values())
        if low is None or not judges or any(j.last_hand is None for j in judges) \
                or all(r.ok for r in self.results[:len(judges)]):
            return
        spreads = {j.name: self._spread_of(j.key) for j in judges}
        exact_inputs = [self._tol(spreads[j.name], j.g_auto, u_inputs=0.0) + self._moved(j.key)
                        for j in judges]
        if not all(precision_change(j.last_hand - j.g_auto, j.g_auto, t, shifts=False)
                   and in_format(j.last_hand, low) for j, t in zip(judges, exact_inputs)):
            return
        u_low, u_dtype = self.policy.u(low), self.u_backward
        self.u_backward = u_low
        u_in = max(self.u_inputs, u_low[0])
        tols = [self._tol(spreads[j.name], j.g_auto, u_inputs=u_in) + self._moved(j.key)
                for j in judges]
        if any(_score(j.last_hand, j.g_auto, t) > 1 for j, t in zip(judges, tols)):
            self.u_backward = u_dtype
            return
        self.notes.append(Note(Finding.LOW_PRECISION_BACKWARD, (("dtype", str(self.dtype)),
                                                                ("low", low.name))))
        self.u_inputs = u_in
        for i, (j, t) in enumerate(zip(judges, tols)):
            j.tol, j.bands = t, self._bands(j.key, j.g_auto)
            self.results[i] = j.judge(self.dinputs[j.key] if isinstance(j.key, int)
                                      else self.dparams.get(j.key))

    def _bug_shaped_under_a_finding(self):
        """A finding relaxes the tolerances of the precision it names, never a bug: a gradient
        that passes only under the finding's tolerances, while its error against the checked
        dtype's own is no precision change (a scaled copy, an offset, a few elements), fails."""
        relaxed = not (self.u_forward == self.u_backward == self.policy.u(self.dtype)
                       and self.u_inputs == self.u_forward[0])
        if not relaxed or self.spread_out is None:
            return
        u = self.policy.u(self.dtype)
        for i, j in enumerate(list(self.judges.values())):
            r = self.results[i]
            if not r.ok or j.last_hand is None:
                continue
            own = self.policy.elementwise(self._spread_of(j.key).at(u, u, u[0], format=self.u),
                                          j.g_auto, self.dtype) + self._moved(j.key)
            e = j.last_hand - j.g_auto
            if _score(j.last_hand, j.g_auto, own) > 1 and not precision_change(e, j.g_auto, own):
                r.verdict = Verdict(Kind.HAND_WRONG, "its error against the checked dtype's "
                                    "rounding is a bug's pattern (a scaled copy, an offset or a "
                                    "few elements), which no precision finding excuses")
                r.ok = False
                r.score = max(r.score, _score(j.last_hand, j.g_auto, own))

    def _snapshot(self):
        """What the legs change (notes, roundoffs, the finite differences' stream), before them."""
        return len(self.notes), self.u_backward, self.u_inputs, self.rng.bit_generator.state

    def _rewind(self, start):
        """The state the legs started from (``_snapshot``), to run them again with other
        tolerances: the same directions, the same draws."""
        del self.notes[start[0]:]
        _, self.u_backward, self.u_inputs, self.rng.bit_generator.state = start
        self.judges = {}

    def _fit_tol(self, result):
        """The scalar tolerance a bug pattern is fitted within: the tensor's own, or, where the
        forward rounds to a lower precision, that precision's (the backward then consumes
        values rounded there, so a pattern holds only to that precision)."""
        if self.u_forward == self.policy.u(self.dtype):
            return result.tol
        judge = self.judges[result.name]
        tol = self._tol(self._spread_of(judge.key), judge.g_auto, u_inputs=self.u_forward[0])
        scale = float(np.max(np.abs(judge.g_auto))) if judge.g_auto.size else 0.0
        low = self.u_forward[0] / tolerances.unit_roundoff(self.dtype)
        return max(result.tol, low * float(np.max(tol)) / scale if scale else math.inf)

    def _run_kinks(self):
        with self._timed("rounding model: kinks"):
            self._find_kinks()
        self.kinks_deferred = False

    def settle_kinks(self):
        """Runs the kinks' moves a check deferred (it passed without them) and widens the
        output's and every judge's tolerances by them, as a check that needed them has: for
        callers that judge other gradients with this check's judges (``checks.sensitivity``).
        The check's own results stand: they passed at the narrower tolerances."""
        if not self.kinks_deferred:
            return
        self._run_kinks()
        self.notes = [n for n in self.notes if n.finding is not Finding.KINKS_UNNEEDED]
        self.forward_tol = self.forward_tol + self._moved("out")
        self.forward_score = _score(_f64(self.out), self.ref_out, self.forward_tol)
        self.forward_ok = self.forward_score <= 1
        for judge in self.judges.values():
            judge.widen(self._moved(judge.key), self._bands(judge.key, judge.g_auto))

    def _settle_kinks_if_needed(self, hands):
        """Runs the deferred kinks' moves where some gradient disagrees with autodiff without
        them (element-wise or in the aggregate), before any finite difference is taken."""
        if self.kinks_deferred and not all(j.passes(hands[n]) for n, j in self.judges.items()):
            self.settle_kinks()

    def _find_kinks(self):
        """Elements within rounding of a kink: where a comparison in the oracle's program
        (leaky ReLU's x > 0, a max) flips under the rounding model's noise at this check's
        roundoffs, a correct kernel may take either branch.  Each output and gradient element is
        judged with that branch's difference added to its tolerance (``checks.rounding``
        ``RoundingModel.kinks``), and a finding says how many elements of which tensors sit
        there; every other element is judged as before."""
        self.kink_moved = {}
        if self.spread_out is None:
            return
        try:
            found = self.ref.kinks(self.dout64, self._kink_us(), self.seed)
        except Exception:  # a program the flip run cannot follow: judged without it
            found = None
        if not found or not found[3]:
            return
        out, d_in, d_params, self.flipped = found
        self.kink_moved = {"out": out, **d_in, **d_params}
        counts = []
        for key, moved in self.kink_moved.items():
            ref = self.ref_out if key == "out" else (
                self.auto_in[key] if isinstance(key, int) else self.auto_params[key])
            spread = self.spread_out if key == "out" else self._spread_of(key)
            n = int(np.sum(moved > self._tol(spread, ref)))
            if n:
                name = "the output" if key == "out" else (
                    self.names[key] if isinstance(key, int) else key)
                counts.append(f"{n} of {name}")
        if counts:
            self.notes.append(Note(Finding.KINKS, (("where", ", ".join(counts)),)))

    def _kink_us(self):
        """The roundoffs of the kink runs, one per part of the program (``rounding.PARTS``)."""
        return roundoffs(self.u_forward, self.u_backward, self.u_inputs,
                         format=max(self.u, self.u_forward[0]))

    def _moved(self, key):
        """How far an element of a tensor may move in a correct kernel beyond its rounding: its
        kinks' branches flipped, and another arrangement of the oracle's maths (0 if none)."""
        return self.kink_moved.get(key, 0.0) + self.arranged.get(key, 0.0)

    def _arrangement(self) -> bool:
        """Builds the allowance of another arrangement of the oracle's maths, its max and min
        reductions held constant (``checks.arrangements``), for the tensors where the two
        programs agree within both tolerances at every element; whether any element's
        tolerance grew.  Run where a check fails, once."""
        if self.arranged or self.spread_out is None or self.ref.large:
            return False
        closed = self.ref.program()
        if closed is None or not arrangements.has_shifts(closed.jaxpr):
            return False
        with self._timed("rounding model: arrangement"):
            try:
                other = Oracle(arrangements.constant_shifts(self.oracle_fn), self.inputs64,
                               self.params64, self.static, self.diff_idx)
                _, g_in, g_params = other.vjp(self.dout64, through_model=True)
                _, s_in, s_params = other.spread(self.dout64, self.seed,
                                                 kink_us=self._kink_us())
            except Exception:  # noqa: BLE001  (no second arrangement: judged as before)
                return False
        allowed, counts = {}, []
        for key, name in self._tensor_keys():
            g = self.auto_in[key] if isinstance(key, int) else self.auto_params[key]
            g_other = g_in[key] if isinstance(key, int) else g_params[key]
            tol = self._tol(self._spread_of(key), g) + self._moved(key)
            tol_other = self._tol(s_in[key] if isinstance(key, int) else s_params[key], g_other)
            gap = np.abs(np.asarray(g_other, np.float64) - g)
            if not np.all(gap <= tol + tol_other):  # not the same maths: a max that matters
                continue
            extra = np.maximum(tol_other + gap - tol, 0.0)
            if np.any(extra):
                allowed[key] = extra
            n = int(np.count_nonzero(extra > tol))  # where the tolerance more than doubles
            if n:
                counts.append(f"{n} of {name}")
        self.arranged = allowed
        self._arranged_where = ", ".join(counts) or "none of them more than doubled"
        return bool(allowed)

    def _tensor_keys(self):
        """(key, name) of every differentiated input and parameter, in the legs' order."""
        return [(key, self.names[key] if isinstance(key, int) else key)
                for key in list(self.diff_idx) + list(self.params)]

    def _spread_of(self, key):
        if self.spread_out is None:
            return None
        return self.spread_in[key] if isinstance(key, int) else self.spread_params[key]

    def diagnose(self):
        pairs = {j.name: (j.last_hand, j.g_auto) for j in self.judges.values()}
        ctx = Context(trusted={n: g for n, (_, g) in pairs.items()},
                      constants=constants_from(self.sizes, self.static,
                                               [x.shape for x in self.floats]),
                      axes=self.axes,
                      masks=[(f"the mask '{m}' (its False entries)", ~np.asarray(v))
                             for m, v in self.static.items()
                             if getattr(v, "dtype", None) == bool],
                      ids=[x for x in self.host_inputs if x.dtype.kind in "iu"],
                      dout=self.dout64, slice_vjp=_slice_vjp(self.ref, self.dout64),
                      heads=(self.sizes or {}).get("H"), **self._explain_hooks())
        on_hand = []
        for result in self.results:
            if result.ok or result.name not in pairs or pairs[result.name][0] is None \
                    or result.score <= 1:  # nothing to explain between hand and oracle
                continue
            g_hand, g_auto = pairs[result.name]
            suspect, trusted = (g_auto, g_hand) if result.verdict.kind in BLAMES_ORACLE else \
                (g_hand, g_auto)
            if result.verdict.kind in BLAMES_ORACLE:
                # autodiff is the suspect, the hand's gradients the trusted ones: the tests
                # that read the oracle's own program (its paths, its gradients at another dout
                # or static value) or rerun the hand (replays, float64) speak of the hand only
                own = ctx._replace(trusted={n: h for n, (h, _) in pairs.items()}, paths=None,
                                   slice_vjp=None, float64=None, other_static=None, replay=None)
                result.diagnosis = of_autodiff(diagnose(result.name, suspect, trusted, own,
                                                        self._fit_tol(result)))
            else:
                on_hand.append(result)
                result.diagnosis = diagnose(result.name, suspect, trusted, ctx,
                                            self._fit_tol(result))
            result.difference = suspect - trusted
            result.axes = tuple(self.axes.get(result.name, ()))
            result.location = locate(result.worst, result.shape, self.axes.get(result.name))
            if not self.forward_ok:
                result.note = "moot while the forward disagrees with the oracle"
        if on_hand and self.tape is not None and self.forward_ok:
            self._bisect(on_hand)

    def _bisect(self, results):
        """A composition's wrong stage or glue (checks.bisection), added to the diagnosis of
        every tensor blamed on the hand: a wrong stage smears a different error into every
        gradient below it, which no pattern of one tensor fits, but the stage-by-stage check
        finds it.  Run only on a failure; nothing is added when it finds nothing."""
        from checks.bisection import explain_failure
        found = explain_failure(self, self.tape)
        for result in results if found else ():
            result.diagnosis = f"{result.diagnosis}; {found}" if result.diagnosis else found

    def _explain_hooks(self):
        """What checks.diagnosis needs beyond the gradients: the dtype, the oracle's paths and,
        for a low-precision check, the same kernel run in float64 (checks.explain)."""
        from checks.explain import float64_rerun
        from checks.attribution import for_oracle
        from checks.substitution import cached_arrays
        names = {i: self.names[i] for i in self.diff_idx}
        tol64 = lambda j: self._tol_at(j, np.float64)
        rerun = None if self.dtype == np.float64 else float64_rerun(
            self.forward_fn, self.backward_fn, self.inputs64, self.params64, self.static,
            self.dout64, self.names, self.judges, tol64)
        # copied only if the substitutions are built; a low-precision check's gradients are
        # fitted on its float64 run, so the cached values are that run's
        def cached():
            own = rerun.cache() if rerun is not None else None
            return cached_arrays(self.cache if own is None else own)
        return dict(dtype=str(self.dtype), paths=for_oracle(self.ref, self.dout64, names, cached),
                    other_static=self._other_static(), float64=rerun,
                    replay=self._replay_finding(rerun, tol64))

    def _replay_finding(self, rerun, tol64):
        """() -> what a replay of the hand backward finds (``checks.replay``: two fields of its
        cache, or two arguments of one of its calls, in each other's place), '' for nothing;
        run once on first use: the float64 run's cache against the float64 tolerances for a
        low-precision check whose kernel has a float64 path, else the check's own."""
        from checks.replay import explain
        memo = []

        def found():
            if not memo:
                cache = rerun.cache() if rerun is not None else None
                if cache is not None:
                    targets = {j.name: (j.g_auto, tol64(j)) for j in self.judges.values()}
                    dout = self.dout64
                else:
                    cache, dout = self.cache, _like(self.dout, self.inputs)
                    targets = {j.name: (j.g_auto, j.tol) for j in self.judges.values()}
                memo.append(explain(self.backward_fn, cache, dout, self.names, targets))
            return memo[0]
        return found

    def _other_static(self):
        """() -> [(label, trusted gradients)] with one static argument at another value: a flag
        negated, a number at the oracle's default (computed on first use, once)."""
        memo = []

        def alternatives():
            if not memo:
                memo.append([])
                for key, value in _other_statics(self.oracle_fn, self.static):
                    try:
                        other = Oracle(self.oracle_fn, self.inputs64, self.params64,
                                       {**self.static, key: value}, self.diff_idx)
                        _, g_in, g_params = other.vjp(self.dout64)
                    except Exception:  # no such layer: nothing to compare with
                        continue
                    grads = {**{self.names[i]: g for i, g in g_in.items()}, **g_params}
                    memo[0].append((f"{key} = {value!r} (the case has {key} = "
                                    f"{self.static[key]!r})", grads))
            return memo[0]
        return alternatives

    def _tol_at(self, judge, dtype):
        """The element-wise tolerance of a judge's tensor for a check in another dtype: as that
        check computes it (``_tol``), the inputs rounded at its roundoff included (backward
        stability: a correct kernel differentiates at a forward's rounded results), and the
        kinks' moves."""
        spread = self._spread_of(judge.key)
        if spread is None:
            return judge.tol
        u = self.policy.u(np.dtype(dtype))
        return self.policy.elementwise(spread.at(u, u, u[0], format=u[0]), judge.g_auto,
                                       np.dtype(dtype)) + self._moved(judge.key)

    # --- the pipeline ----------------------------------------------------------------------

    def run(self, diagnose=True) -> Report:
        """The stages in order; diagnose=False leaves failures unexplained (checks.bisection's
        screening, where only the verdict counts)."""
        self.prepare()
        try:
            with self._timed("oracle"):
                self.oracle()
            with self._timed("hand"):
                self.hand()
                self.compare_forward()
            self.rounding()
        except _Failed as failed:
            self.failed = Report(self.name, str(self.dtype), self.forward_error, math.nan,
                                 False, [], error=failed.message, error_in=failed.part,
                                 notes=self.notes)
            return self.failed
        with self._timed("legs"):
            self._legs_with_kinks()
        if diagnose:
            with self._timed("diagnosis"):
                self.diagnose()
        return self.report()

    def report(self, results=None) -> Report:
        """The report of the check as run (the one ``run`` returned where a part raised)."""
        if self.failed is not None and results is None:
            return self.failed
        return Report(self.name, str(self.dtype), self.forward_error, self.forward_score,
                      bool(self.forward_ok), list(results if results is not None
                                                  else self.results), notes=self.notes)


def _score(a, ref, tol):
    """max_i |a_i - ref_i| / tol_i: at most 1 passes."""
    if a.size == 0:
        return 0.0
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(ref))):
        return math.inf
    with np.errstate(over="ignore"):  # an error over a tolerance of a few subnormals: inf
        return float(np.max(np.abs(a - ref) / tol))


class Judge:
    """The trusted legs of one tensor, ready to rule on any hand gradient of it."""

    def __init__(self, name, key, x, g_auto, tol, dtype, fd, rng, policy, caveats=list,
                 exact_autodiff=lambda: False):
        self.name, self.key, self.x, self.g_auto, self.tol = name, key, x, g_auto, tol
        self.dtype, self.fd, self.policy = dtype, fd, policy
        self.caveats = caveats  # () -> why the oracle's autodiff may differ from its forward
        self.exact_autodiff = exact_autodiff  # () -> is it that derivative (none, and read)?
        self.measured: Measured | None = None
        self.fd_tols: FdTolerances | None = None
        self.rng = rng
        self.last_hand = None
        self._kinked = None
        self.bands: aggregate.Bands | None = None  # the aggregate test's, set by the check
        self.joint: Joint | None = None  # FD along joint directions that autodiff agreed with
        self._compared = None  # (hand, _compare(hand)) of the last ``passes``

    def _measure(self):
        if self.measured is None:
            self.measured = self.fd.measure(self.key, self.x, self.rng)
            self.fd_tols = _fd_tolerances(self.g_auto, self.measured)
        return self.measured

    def _compare(self, hand):
        """Hand against autodiff: (result, h, |h - g| / tol, passes, the set outside its band);
        h is None when the result is final already (no gradient, misshapen, non-finite)."""
        g = self.g_auto
        result = TensorResult(self.name, tuple(np.shape(self.x)))
        scale = float(np.max(np.abs(g))) if g.size else 0.0
        result.tol = float(np.max(self.tol)) / scale if scale > 0 else math.inf
        self.last_hand = None
        if hand is None:
            result.verdict = Verdict(Kind.NO_GRADIENT, (
                f"if {self.name} takes none (a mask, a float table), declare it: "
                f"nondiff=({self.key},)") if isinstance(self.key, int) else "")
            return result, None, None, False, None
        hand = np.asarray(to_numpy(hand))
        if not tolerances.is_float(hand.dtype):
            result.verdict = Verdict(Kind.NOT_FLOAT, f"dtype {hand.dtype}")
            return result, None, None, False, None
        if hand.shape != result.shape:
            result.verdict = Verdict(Kind.MISSHAPEN, f"{hand.shape}, expected {result.shape}")
            result.diagnosis = diagnose(self.name, _f64(hand), g,
                                        Context({}, [], {}, [], [], np.zeros(0), None),
                                        result.tol)
            return result, None, None, False, None
        if hand.dtype != self.dtype:
            result.note = str(Note(Finding.PROMOTES, (("dtype", str(self.dtype)),
                                                      ("got", str(hand.dtype)))))
        h = _f64(hand)
        self.last_hand = h
        finite_h, finite_g = bool(np.all(np.isfinite(h))), bool(np.all(np.isfinite(g)))
        if not (finite_h and finite_g):
            legs = [leg for leg, ok in (("hand", finite_h), ("autodiff", finite_g)) if not ok]
            result.verdict = Verdict(Kind.NON_FINITE, "in the " + " and ".join(legs) + " leg")
            return result, None, None, False, None
        result.hand_vs_autodiff = normwise(h, g)
        result.score = _score(h, g, self.tol)
        with np.errstate(over="ignore"):  # a huge error over a subnormal tolerance: inf
            ratio = np.abs(h - g) / self.tol
        if h.size:
            result.max_abs = float(np.max(np.abs(h - g)))
            result.worst = tuple(int(i) for i in np.unravel_index(int(ratio.argmax()), g.shape))
        passes = result.score <= 1
        outside = None  # the aggregate test: a set whose bias is outside its band
        if self.bands is not None:
            result.bias_score, outside = aggregate.worst(h - g, g, self.bands,
                                                         rounded=hand.dtype == self.dtype)
            passes = passes and outside is None
        return result, h, ratio, passes, outside

    def widen(self, moved, bands):
        """The tolerance widened by the kinks' moves of this tensor, and the bands with them
        (``LayerCheck.settle_kinks``): a comparison kept by ``passes`` is made again."""
        self.tol, self.bands, self._compared = self.tol + moved, bands, None

    def passes(self, hand) -> bool:
        """Does the hand gradient agree with autodiff (element-wise and in the aggregate)?  The
        comparison is kept for the ``judge`` of the same hand that follows."""
        self._compared = (hand, self._compare(hand))
        return self._compared[1][3]

    def judge(self, hand, evidence=True) -> TensorResult:
        """The verdict on a hand gradient of this tensor (None: the backward returned none).
        evidence=False: where hand and autodiff disagree, no evidence is examined (the verdict is
        unresolved, failing all the same): for callers that ask only whether it passes."""
        g = self.g_auto
        kept, self._compared = self._compared, None
        result, h, ratio, hand_auto_ok, outside = kept[1] if kept is not None \
            and kept[0] is hand else self._compare(hand)
        if h is None:
            return result
        if hand_auto_ok and self.joint is not None and self.key in self.joint.keys:
            # autodiff agreed with FD along the joint directions (set only then, by the check)
            result.autodiff_vs_fd = self.joint.autodiff_error
            result.hand_vs_fd, hand_fd_ok = self.joint.hand(self.key, h, g, self.tol)
            result.tol_fd = max(self.joint.tols)
            result.verdict = _verdict(True, hand_fd_ok, True, "", False)
            return _noted(result)
        try:
            m = self._measure()
        except Exception as exc:  # the forward raised at a perturbed point
            result.verdict = Verdict(Kind.RAISED, _raised("hand forward, at a finite-difference "
                                                          "point,", exc))
            return result
        hand_fd, auto_fd, tol_fd, hand_fd_ok, auto_fd_ok = _against_fd(h, g, self.tol, m,
                                                                         self.fd_tols)
        result.hand_vs_fd, result.autodiff_vs_fd, result.tol_fd = hand_fd, auto_fd, tol_fd
        if not (math.isfinite(hand_fd) and math.isfinite(auto_fd)):
            result.verdict = Verdict(Kind.NON_FINITE, "in the finite differences")
            return result
        kink = ""
        if not auto_fd_ok:
            if self._kinked is None:
                self._kinked = self.fd.kinked(self.key, self.x, m, g, tol_fd)
            kink = self._kinked
        if hand_auto_ok or self.fd.on_oracle or self.fd.skipped:
            result.verdict = _verdict(hand_auto_ok, hand_fd_ok, auto_fd_ok, kink,
                                      self.fd.on_oracle or self.fd.skipped)
            if result.verdict.kind is Kind.FD_DISAGREES and not self.fd.on_oracle \
                    and self.exact_autodiff():
                # hand and autodiff agree, and autodiff is the derivative of a forward that
                # agrees with the kernel's: what FD disagrees with is that derivative itself
                result.verdict = Verdict(Kind.FD_SET_ASIDE, FD_ALONE)
            if outside is not None:
                result.verdict = aggregate.with_reason(result.verdict, outside, self.name)
        elif not evidence:
            result.verdict = Verdict(Kind.UNRESOLVED, "not examined (only whether it passes "
                                                      "was asked)")
        elif result.score <= 1:  # only a bias: blame from FD along its set (checks.aggregate)
            result.verdict = aggregate.verdict(self.fd, self.key, self.x, h, g, outside,
                                               self.name, self.caveats(), auto_fd_ok, kink)
        else:  # blame from the evidence at the disagreeing elements (checks.evidence)
            rng = np.random.default_rng([int(ratio.argmax()), int(ratio.size)])
            elements = examine(self.fd, self.key, self.x, h, g, self.tol,
                               self.fd_tols.element_scale, pick(ratio, rng))
            what = "elements"
            if outside is not None:  # and along the set outside its band: a row x 1.05 in
                # half precision is a few tolerances per element, many bands along its row
                elements.append(aggregate.examine(self.fd, self.key, self.x, h, g, outside))
                what = "elements and sets"
            result.verdict = blame(elements, self.caveats(), auto_fd_ok, kink, what=what)
        return _noted(result)


def _noted(result: TensorResult) -> TensorResult:
    """The result with its verdict's ok, and FD's note where FD was near or set aside."""
    if result.verdict.kind in (Kind.FD_SET_ASIDE, Kind.FD_BORDERLINE):
        result.note = str(result.verdict)
    result.ok = result.verdict.ok
    return result


class FdTolerances(NamedTuple):
    """The finite-difference tolerances of one tensor's measurements against its autodiff
    gradient g: they depend on g's scale only, so a judge computes them once."""
    scales: list                 # |g| |v| per direction
    directions: list             # relative tolerance per direction
    elements: np.ndarray | None  # relative tolerance per element (element-wise FD), or None
    element_scale: float         # max |g|


def _fd_tolerances(g, m: Measured) -> FdTolerances:
    norm_g = float(np.linalg.norm(g))
    scales = [norm_g * float(np.linalg.norm(v)) for v in m.directions]
    directions = [tol_of(scale) for tol_of, scale in zip(m.tols, scales)]
    element_scale = float(np.max(np.abs(g))) if g.size else 0.0
    elements = None if m.elements is None else np.array(
        [tol_of(element_scale) for tol_of in m.element_tols]).reshape(g.shape)
    return FdTolerances(scales, directions, elements, element_scale)


def _against_fd(h, g, tol, m: Measured, fd_tols: FdTolerances):
    """(hand vs FD, autodiff vs FD, FD tolerance, hand agrees, autodiff agrees): errors relative
    to |g| |v| along directions and to max |g| element-wise.  The hand leg may differ from FD by
    FD's error plus its own rounding (sum |v_i| tol_i)."""
    hand_err = auto_err = worst_tol = 0.0
    hand_ok = auto_ok = True
    for v, d, t, scale in zip(m.directions, m.values, fd_tols.directions, fd_tols.scales):
        own = float(np.sum(np.abs(v) * tol))
        eh, ea = abs(float(np.sum(h * v)) - d), abs(float(np.sum(g * v)) - d)
        hand_ok &= eh <= t * scale + own
        auto_ok &= ea <= t * scale
        hand_err, auto_err = max(hand_err, relative(eh, scale)), max(auto_err, relative(ea, scale))
        worst_tol = max(worst_tol, t)
    if m.elements is not None:
        scale, t = fd_tols.element_scale, fd_tols.elements
        eh, ea = np.abs(h - m.elements), np.abs(g - m.elements)
        if not (np.all(np.isfinite(eh)) and np.all(np.isfinite(ea))):
            return math.inf, math.inf, worst_tol, False, False
        hand_ok &= bool(np.all(eh <= t * scale + tol))
        auto_ok &= bool(np.all(ea <= t * scale))
        hand_err = max(hand_err, relative(float(eh.max()), scale))
        auto_err = max(auto_err, relative(float(ea.max()), scale))
        worst_tol = max(worst_tol, float(t.max()))
    return hand_err, auto_err, worst_tol, bool(hand_ok), bool(auto_ok)


def _verdict(hand_auto_ok, hand_fd_ok, auto_fd_ok, kink, fd_on_oracle) -> Verdict:
    """Which leg disagrees, from the three pairwise agreements."""
    kinked = kink or ""  # why FD is unreliable here (checks.legs.KINKED or CURVED), or ""
    if fd_on_oracle:  # the complex step checked the oracle against itself: no triage
        if hand_auto_ok:
            return Verdict(Kind.OK if auto_fd_ok else Kind.FD_DISAGREES)
        return Verdict(Kind.NO_TRIAGE)
    if hand_auto_ok and hand_fd_ok and auto_fd_ok:
        return Verdict(Kind.OK)
    if not hand_auto_ok and auto_fd_ok:  # FD confirms autodiff within FD's own tolerance
        return Verdict(Kind.HAND_WRONG)
    if not hand_auto_ok and hand_fd_ok:
        return Verdict(Kind.ORACLE_WRONG)
    if hand_auto_ok:
        if kink:
            return Verdict(Kind.FD_SET_ASIDE, kinked)
        return Verdict(Kind.FD_BORDERLINE if auto_fd_ok or hand_fd_ok else Kind.FD_DISAGREES)
    if kink:
        return Verdict(Kind.UNRESOLVED, kinked)
    return Verdict(Kind.ALL_DISAGREE)


def _other_statics(oracle, static):
    """(name, value): every boolean static argument negated, and every number that differs from
    the oracle's own default at that default."""
    try:
        defaults = {k: p.default for k, p in inspect.signature(oracle).parameters.items()
                    if p.default is not inspect.Parameter.empty}
    except (TypeError, ValueError):  # no signature to read
        defaults = {}
    for key, value in static.items():
        if isinstance(value, (bool, np.bool_)):
            yield key, not value
        elif isinstance(value, (int, float)) and isinstance(defaults.get(key), (int, float)) \
                and not isinstance(defaults[key], bool) and defaults[key] != value:
            yield key, defaults[key]


def _slice_vjp(ref, dout64):
    """Trusted gradients with dout kept along one index of one axis (computed on demand)."""
    memo = {}

    def grads(axis, index):
        if (axis, index) not in memo:
            d = np.zeros_like(dout64)
            where = [slice(None)] * d.ndim
            where[axis] = index
            d[tuple(where)] = dout64[tuple(where)]
            _, _, memo[(axis, index)] = ref.vjp(d)
        return memo[(axis, index)]
    return grads
