"""The two trusted legs of a check: autodiff of the JAX oracle and finite differences.

Both differentiate L(x) = <f(x), dout> for a random upstream gradient ``dout``.

* autodiff: ``jax.vjp`` of the oracle in float64, compiled once per (oracle, static arguments,
  shapes) with ``jax.jit``; an oracle that cannot be traced (NumPy calls on its arguments) runs
  eagerly instead, and then has no rounding model (``checks.rounding`` needs its program).
* finite differences in float64: central differences of the hand forward with the u^(1/3) step
  (default), Richardson extrapolation of two of them, or the complex step — on the hand forward
  when it takes complex inputs, otherwise on the oracle, where it is only an oracle self-check.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from checks import program_cache, tolerances
from checks.rounding import RoundingModel, Unsupported
from kernels.backend import to_numpy

FD_DIRECTIONS = 3         # random directions per tensor, always
FD_JOINT_TENSORS = 16     # a large program's check with more tensors than this (the whole
#                           model) takes FD along joint directions first (``measure_joint``)
FD_SCHEMES = ("central", "richardson", "complex", "none")
KINK_FACTOR = 10          # a kink: second differences off by 10 x the FD tolerance
KINKED = "the function is not smooth within the step (a kink?)"
CURVED = ("FD's own step dependence D(2h) - D(h) explains its error (the function curves on a "
          "scale below the step)")


# --- autodiff ------------------------------------------------------------------------------

def _split_static(static):
    """Hashable static arguments (compiled in) and array-valued ones (traced, e.g. a mask)."""
    arrays = {k: v for k, v in static.items() if hasattr(v, "shape")}
    rest = tuple(sorted((k, v) for k, v in static.items() if k not in arrays))
    hash(rest)  # TypeError for an unhashable static value: the caller falls back to eager
    return rest, arrays


def _program(call):
    """(out, (d_inputs, d_params)) of call(diff_values, others, params, arrays) for dout."""
    def program(diff_values, others, params, arrays, dout):
        out, vjp = jax.vjp(lambda d, p: call(d, others, p, arrays), diff_values, params)
        return out, vjp(dout.astype(out.dtype))
    return program


def _runs(call):
    """(vjp_run, loss_run, out_run), all taking (diff_values, others, params, arrays, dout)."""
    def loss_run(diff_values, others, params, arrays, dout):
        return jnp.sum(call(diff_values, others, params, arrays) * dout)

    def out_run(diff_values, others, params, arrays, dout):
        return call(diff_values, others, params, arrays)

    return _program(call), loss_run, out_run


def _caller(oracle, diff_idx, static):
    def call(diff_values, others, params, arrays):
        full = list(others)
        for i, value in zip(diff_idx, diff_values):
            full[i] = value
        return oracle(*full, params, **static, **arrays)
    return call


@functools.lru_cache(maxsize=512)
def _oracle_functions(oracle, diff_idx, static_items):
    """Jitted and eager (vjp_run, loss_run, out_run).  Cached, so a second check of the same
    oracle at the same shapes compiles nothing."""
    runs = _runs(_caller(oracle, diff_idx, dict(static_items)))
    return tuple(jax.jit(f) for f in runs), runs


_ROUNDING_MODELS = {}  # (oracle, diff_idx, static, shapes) -> RoundingModel


def _group_of(oracle, diff_idx, static_items, arrays) -> str:
    """A name for the programs of this oracle's rounding model, known before any trace: the
    function's module, name and bytecode, the differentiated inputs, the static arguments, and
    every array's shape and dtype.  Only a guess of which executables to load ahead: two
    oracles that share it load each other's in vain, and every program is still found by its
    own trace (``checks.program_cache``)."""
    shapes = [(tuple(np.shape(x)), str(getattr(x, "dtype", type(x).__name__)))
              for x in jax.tree_util.tree_leaves(arrays)]
    code = getattr(getattr(oracle, "__code__", None), "co_code", b"")
    name = f"{getattr(oracle, '__module__', '')}." + getattr(
        oracle, "__qualname__", type(oracle).__qualname__)
    structure = str(jax.tree_util.tree_structure(arrays))  # the params' and arrays' names
    return program_cache.fingerprint(name, code, repr((diff_idx, static_items, shapes)), structure)


def _one_output(out):
    """The oracle's output, which must be one array (the layer's output, not (out, cache))."""
    if isinstance(out, (tuple, list, dict)):
        what = f"a {type(out).__name__} of {len(out)}"
        raise TypeError(f"the oracle returned {what}; expected one array, the layer's output "
                        f"(an oracle is the forward only: no cache, no gradient)")
    return out


class Oracle:
    """The oracle of one check, at fixed inputs: its forward, VJPs, rounding model, complex step."""

    def __init__(self, oracle, inputs64, params64, static, diff_idx):
        self.oracle, self.diff_idx = oracle, tuple(diff_idx)
        self.inputs = list(inputs64)
        # jax.device_put, not jnp.asarray: a transfer, where jnp.asarray compiles a small
        # program per shape (tens of milliseconds each in a check's first call)
        self.others = tuple(None if i in self.diff_idx else jax.device_put(x)
                            for i, x in enumerate(inputs64))
        self.params = {k: jax.device_put(v) for k, v in params64.items()}
        self.static_items = None
        self._flips = None  # (dout, seed, roundoffs, flips) of the last spread, for kinks
        self._modelled = False  # whether _model built (or found) the rounding model
        self._unmodelled = None  # why it could not: raised again, not built twice
        self.program_read = False  # whether ``caveats`` read the program (its answer is known)
        self._exact = None  # (dout, the model's exact run) of a check's vjp, for its spread
        # of the rounding model's program, once ``spread`` ran it
        self.samples, self.elements, self.large = tolerances.SAMPLES, 0, False
        try:
            self.static_items, self.arrays = _split_static(static)
            self._fns = list(_oracle_functions(oracle, self.diff_idx, self.static_items))
        except TypeError:  # an unhashable static argument: op by op only
            self.arrays = {}
            self._fns = [_runs(_caller(oracle, self.diff_idx, static))]
        # the rounding model's executables an earlier process loaded start loading now, beside
        # the oracle's tracing (checks.program_cache.read_ahead)
        self._group = _group_of(oracle, self.diff_idx, self.static_items,
                                (inputs64, params64, self.arrays)) if self.traceable else None
        program_cache.read_ahead(self._group)

    @property
    def traceable(self) -> bool:
        return len(self._fns) > 1

    def _diff_values(self):
        return [jax.device_put(self.inputs[i]) for i in self.diff_idx]

    def _run(self, which, diff_values, params, dout):
        error = None
        for fns in list(self._fns):
            try:
                return fns[which](diff_values, self.others, params, self.arrays, dout)
            except Exception as exc:  # not traceable under jit: fall back to eager, once
                error = exc
                if len(self._fns) > 1:
                    self._fns.pop(0)
        raise error

    def out_shape(self):
        """The shape of the oracle's output: from a cached trace, or an eager run when the
        oracle cannot be traced."""
        if self.traceable:
            try:
                fn = self._fns[0][2]
                out = jax.eval_shape(fn, self._diff_values(), self.others, self.params,
                                     self.arrays, None)
            except Exception:
                self._fns.pop(0)
            else:
                return tuple(_one_output(out).shape)
        return tuple(np.shape(_one_output(self._run(2, self._diff_values(), self.params, None))))

    def forward_at(self, inputs64, params64):
        """The oracle's output at other values of its differentiable inputs and parameters
        (its other inputs as the check's)."""
        values = [jax.device_put(np.asarray(inputs64[i])) for i in self.diff_idx]
        params = {k: jax.device_put(np.asarray(v)) for k, v in params64.items()}
        return np.asarray(self._run(2, values, params, None))

    def program(self):
        """The oracle's forward program (a closed jaxpr), or None when it cannot be read."""
        if not self.traceable:
            return None
        try:
            return jax.make_jaxpr(self._fns[-1][2])(self._diff_values(), self.others,
                                                    self.params, self.arrays, None)
        except Exception:
            return None

    def caveats(self):
        """Why this oracle's autodiff may differ from its forward's derivative
        (``checks.evidence.autodiff_caveats``); [] when its program cannot be read."""
        from checks.evidence import autodiff_caveats
        closed = self.program()
        if closed is None:
            return []
        self.program_read = True  # the caveats are known: none found means none there
        return autodiff_caveats(closed.jaxpr)

    def vjp(self, dout, through_model=False):
        """(out, {input index: gradient}, {param: gradient}) for the upstream gradient dout.
        through_model (a check, which builds the rounding model anyway): the run compiled from
        the model's own trace of the program (``RoundingModel.oracle_run``), so the oracle is
        traced once, and a later process loads the compiled run (checks.program_cache); where
        the model cannot follow the program, the oracle's own jitted (or eager) run.  Once the
        model is built, every later run goes through it (one compiled program, not two).
        A check's own run (through_model) is the model's exact run, kept for ``spread`` at the
        same dout: the amplitudes' program gives the oracle's values too, and the check compiles
        (or loads) and runs no separate program of the oracle."""
        result = None
        if (through_model or self._modelled) and self.traceable:
            try:
                model, args = self._model(dout)
                if through_model:
                    exact = model.exact(args)
                    self._exact = (np.array(dout), exact)
                    result = model.outputs(exact[0])
                else:
                    result = model.oracle_run(args)
            except Exception:  # noqa: BLE001  (the model cannot follow or run the program:
                result = None  # the spreads say why; the oracle's own run below)
        if result is None:
            result = self._run(0, self._diff_values(), self.params, jax.device_put(dout))
        out, (d_in, d_params) = result
        return (np.asarray(out), {i: np.asarray(g) for i, g in zip(self.diff_idx, d_in)},
                {k: np.asarray(v) for k, v in d_params.items()})

    def branch_signs(self, key, x, dout):
        """The sign of every comparison's margin in the oracle's program with tensor key (an
        input index or a param name) at x: [] when the program compares nothing."""
        model, (values, others, params, arrays, d) = self._model(dout)
        if not model.has_branches:
            return []
        here = self.inputs[key] if isinstance(key, int) else self.params[key]
        if np.array_equal(np.asarray(x), np.asarray(here)):  # the case's own point: the same
            memo = getattr(self, "_signs_here", None)        # signs for every tensor
            if memo is None or not np.array_equal(memo[0], dout):
                flat = jax.tree_util.tree_leaves((values, others, params, arrays, d))
                memo = self._signs_here = (np.array(dout), [np.sign(np.asarray(m))
                                                            for m in model.margins(flat)])
            return memo[1]
        if isinstance(key, int):
            values = list(values)
            values[self.diff_idx.index(key)] = jnp.asarray(x)
        else:
            params = {**params, key: jnp.asarray(x)}
        flat = jax.tree_util.tree_leaves((values, others, params, arrays, d))
        return [np.sign(np.asarray(m)) for m in model.margins(flat)]

    def _model(self, dout):
        """(the rounding model of this oracle at these shapes, cached; its arguments)."""
        if not self.traceable:
            raise Unsupported("the oracle runs eagerly only (NumPy calls on its arguments)")
        args = (self._diff_values(), self.others, self.params, self.arrays, jax.device_put(dout))
        shapes = tuple((tuple(np.shape(x)), str(np.asarray(x).dtype))
                       for x in jax.tree_util.tree_leaves(args))
        key = (self.oracle, self.diff_idx, self.static_items, shapes)
        model = _ROUNDING_MODELS.get(key)
        if model is None:
            if self._unmodelled is not None:
                raise self._unmodelled
            program = _program(_caller(self.oracle, self.diff_idx, dict(self.static_items)))
            try:
                model = _ROUNDING_MODELS[key] = RoundingModel(program, args, dout_index=4,
                                                              group=self._group)
            except Exception as exc:  # noqa: BLE001  (spread reports it as Unsupported)
                self._unmodelled = exc
                raise
        self._modelled = True
        return model, args

    def spread(self, dout, seed=0, kink_us=None):
        """The rounding model's spreads: (output Spread, {index: Spread}, {param: Spread}).
        Raises Unsupported when the oracle cannot be traced.  kink_us: the roundoffs a later
        ``kinks`` call will ask for; its flips then come from the spread's own draws."""
        kept, self._exact = self._exact, None  # held from vjp until here only (its memory)
        exact = kept[1] if kept is not None and np.array_equal(kept[0], dout) else None
        try:
            model, args = self._model(dout)
            (out, (d_in, d_params)), flips = model.spread_and_flips(args, seed, kink_us, exact)
            # the spreads' runs per part (Policy.for_samples) and the program's size
            self.samples, self.elements, self.large = model.samples, model.elements, model.large
        except Unsupported:
            raise
        except Exception as exc:  # a trace the model cannot follow
            raise Unsupported(f"{type(exc).__name__}: {exc}") from exc
        self._flips = None if flips is None else (np.array(dout), seed, tuple(kink_us), flips)
        return out, dict(zip(self.diff_idx, d_in)), dict(d_params)

    def kinks(self, dout, us, seed=0):
        """How far each output and gradient element moves with the branches of the oracle's
        comparisons flipped where rounding at the roundoffs us flips them (``RoundingModel.
        kinks``): (output, {index: moved}, {param: moved}, predicates flipped), or None."""
        model, args = self._model(dout)
        flips, self._flips = self._spread_flips(dout, us, seed), None
        found = model.kinks(args, us, seed, flips)
        if found is None:
            return None
        (out, (d_in, d_params)), n = found
        return out, dict(zip(self.diff_idx, d_in)), dict(d_params), n

    def flip_count(self, dout, us, seed=0):
        """How many predicate elements the spreads' own draws found within rounding of their
        kink at the roundoffs us (what ``kinks`` would move), or None if they were not looked
        for at those roundoffs."""
        flips = self._spread_flips(dout, us, seed)
        return None if flips is None else int(sum(np.sum(f) for f in flips))

    def _spread_flips(self, dout, us, seed):
        """The flips ``spread`` found for this dout, seed and roundoffs, or None."""
        memo = self._flips
        if memo is None or memo[1:3] != (seed, tuple(us)) or not np.array_equal(memo[0], dout):
            return None
        return memo[3]

    def loss(self, key, replacement, dout):
        """<oracle(...), dout> with one tensor replaced (complex values allowed)."""
        diff_values = [jnp.asarray(replacement if i == key else self.inputs[i])
                       for i in self.diff_idx]
        params = dict(self.params)
        if not isinstance(key, int):
            params[key] = jnp.asarray(replacement)
        return complex(self._run(1, diff_values, params, jnp.asarray(dout)))


# --- finite differences --------------------------------------------------------------------

class Joint(NamedTuple):
    """FD along joint directions (``FiniteDifferences.measure_joint``): each direction moves
    every tensor of ``keys`` at once by w_k; D = <g, w> to FD's accuracy for a correct
    autodiff gradient g.  Errors are relative to ``scale`` = sum_k s_k (each tensor's
    |g_k| |w_k|, equal shares), as a single tensor's are to its |g| |v|."""
    keys: tuple
    moves: list       # per direction, key -> w_k
    values: list      # per direction, D
    tols: list        # per direction, FD's relative tolerance at ``scale``
    autos: list       # per direction, sum_k <g_k, w_k> of autodiff
    scale: float

    @property
    def autodiff_error(self) -> float:
        return max(abs(a - d) / self.scale for a, d in zip(self.autos, self.values))

    @property
    def autodiff_agrees(self) -> bool:
        return all(abs(a - d) <= t * self.scale
                   for a, d, t in zip(self.autos, self.values, self.tols))

    def hand(self, key, h, g, tol):
        """(hand vs FD, agrees): autodiff's sum with tensor key's term taken from the hand h,
        allowed FD's error plus the hand's own rounding along w_k (sum |w_k| tol)."""
        err, ok = 0.0, True
        for w, d, t, a in zip(self.moves, self.values, self.tols, self.autos):
            e = abs(a + float(np.sum((h - g) * w[key])) - d)
            ok &= e <= t * self.scale + float(np.sum(np.abs(w[key]) * tol))
            err = max(err, e / self.scale)
        return err, bool(ok)


class Measured(NamedTuple):
    """Finite-difference derivatives of one tensor: along random directions, and element-wise."""
    directions: list       # unit-rms directions v
    values: list           # D_v L
    tols: list             # tolerance of each, as a function of scale
    elements: np.ndarray | None  # element-wise derivatives (small tensors), else None
    element_tols: list     # their tolerances, functions of scale


class FiniteDifferences:
    """Numerical derivatives of L(x) = <forward(x), dout>, one tensor at a time.

    ``u`` is the unit roundoff the forward effectively computes in (float64's, unless the
    forward was recognised as computing in a lower precision); steps and tolerances follow it.
    The complex step runs on the hand forward when it takes complex inputs, otherwise on the
    oracle (``on_oracle`` is then True: a self-check of the oracle, not an independent leg).
    """

    def __init__(self, forward, inputs, params, static, dout64, *, scheme="central",
                 oracle: Oracle | None = None, u=tolerances.U64, policy=tolerances.DEFAULT):
        if scheme not in FD_SCHEMES:
            raise ValueError(f"fd: expected one of {FD_SCHEMES}, got {scheme!r}")
        if scheme == "complex" and oracle is None:
            raise ValueError("fd='complex' needs the oracle")
        self.forward, self.static, self.dout = forward, static, dout64
        self.inputs, self.params = list(inputs), dict(params)
        self.scheme, self.oracle, self.u, self.policy = scheme, oracle, u, policy
        self.on_oracle = scheme == "complex" and not self._hand_takes_complex()
        self.skipped = scheme == "none"  # autodiff only (large models): no triage

    def _hand_takes_complex(self):
        try:
            key = next(iter(self.params), None)
            key = key if key is not None else next(i for i, x in enumerate(self.inputs)
                                                   if x.dtype.kind == "f")
            x = self.inputs[key] if isinstance(key, int) else self.params[key]
            value = self._value(key, x + 1e-20j * np.ones_like(x), complex_ok=True)
            return isinstance(value, complex) and value.imag != 0.0
        except Exception:
            return False

    def _value(self, key, replacement, complex_ok=False):
        return self._value_at({key: replacement}, complex_ok)

    def _value_at(self, replacements, complex_ok=False):
        inputs, params = list(self.inputs), dict(self.params)
        for key, replacement in replacements.items():
            original = inputs[key] if isinstance(key, int) else params[key]
            replacement = np.asarray(replacement)
            if not complex_ok:
                replacement = replacement.astype(original.dtype)
            if isinstance(key, int):
                inputs[key] = replacement
            else:
                params[key] = replacement
        out, _ = self.forward(*inputs, params, **self.static)
        out = np.asarray(to_numpy(out))
        if complex_ok:
            return complex(np.sum(out.astype(np.complex128) * self.dout))
        prod = out.astype(np.float64) * self.dout
        return float(np.sum(prod)), float(np.sum(np.abs(prod)))

    def value(self, key, replacement):
        """(L, sum |f * dout|) of the hand forward with one tensor replaced."""
        return self._value(key, replacement)

    def central(self, key, x, v, h):
        """(L(x + h v) - L(x - h v)) / 2h and the largest sum |f * dout| seen."""
        (lp, ap), (lm, am) = self.value(key, x + h * v), self.value(key, x - h * v)
        return (lp - lm) / (2 * h), max(ap, am)

    def forward_difference(self, key, x, v, h):
        (lp, ap), (l0, a0) = self.value(key, x + h * v), self.value(key, x)
        return (lp - l0) / h, max(ap, a0)

    def complex_step(self, key, x, v, h):
        """Im L(x + i h v) / h: no subtraction, so no cancellation."""
        if self.on_oracle:
            return self.oracle.loss(key, x + 1j * h * v, self.dout).imag / h, 0.0
        return self._value(key, x + 1j * h * v, complex_ok=True).imag / h, 0.0

    def derivative(self, key, x, v, size, scheme=None):
        """Directional derivative along v by the chosen scheme (or ``scheme``, a finer one
        asked for at one element): (value, tolerance of scale)."""
        p, scheme = self.policy, scheme or self.scheme
        if scheme == "complex":
            h = 1e-20 * size
            d, _ = self.complex_step(key, x, v, h)
            return d, (lambda scale: p.complex_step_tol())
        if scheme == "richardson":
            h = tolerances.richardson_step(size, self.u)
            d1, a1 = self.central(key, x, v, h)
            d2, a2 = self.central(key, x, v, 2 * h)
            rounding = max(a1, a2)
            return ((4 * d1 - d2) / 3, lambda scale: p.richardson_tol(rounding, h, scale, self.u))
        h = tolerances.fd_step(size, self.u)
        d1, a1 = self.central(key, x, v, h)
        return d1, (lambda scale: p.fd_tol(a1, h, scale, self.u))

    def measure(self, key, x, rng) -> Measured:
        """FD derivatives of tensor x along FD_DIRECTIONS random directions, and element by
        element when x has at most the policy's FD_ELEMENTWISE_MAX elements."""
        size = rms_size(x)
        directions, values, tols = [], [], []
        if self.skipped:
            return Measured([], [], [], None, [])
        for _ in range(FD_DIRECTIONS):
            v = unit_rms_direction(rng, x.shape)
            d, tol_of = self.derivative(key, x, v, size)
            directions.append(v)
            values.append(d)
            tols.append(tol_of)
        elements, element_tols = None, []
        if x.size <= self.policy.FD_ELEMENTWISE_MAX:
            elements = np.empty(x.shape)
            for i, e in enumerate(_unit_vectors(x.shape)):
                d, tol_of = self.derivative(key, x, e, size)
                elements.reshape(-1)[i] = d
                element_tols.append(tol_of)
        return Measured(directions, values, tols, elements, element_tols)

    def measure_joint(self, tensors, rng) -> "Joint | None":
        """FD along FD_DIRECTIONS joint directions that move every tensor at once: tensors maps
        key -> (x, autodiff's gradient g).  Tensor k moves by w_k = c_k h_k v_k (v_k unit rms,
        h_k its own u^(1/3) step) with c_k = min(1, s_min / s_k), s_k = h_k |g_k| |v_k|: every
        tensor's expected share of D = (L(x + w) - L(x - w)) / 2 is the same, so an error
        in a tensor of small gradient is not drowned by the large ones, and no tensor moves
        further than its own step.  A tensor whose share would put FD's rounding above its
        truncation (4 u sum |f dout| > FD_SAFETY u^(2/3) x the joint scale) is left out with
        those of zero gradient: it takes its own directions.  None: central differences are not
        the scheme, or fewer than two tensors join."""
        if self.scheme != "central" or self.skipped:
            return None
        p = self.policy
        steps, shares = {}, {}
        for key, (x, g) in tensors.items():
            size = rms_size(x)
            steps[key] = tolerances.fd_step(size, self.u)
            # |g| |v| with |v| = sqrt(size) for a unit-rms v
            shares[key] = steps[key] * float(np.linalg.norm(g)) * math.sqrt(x.size)
        _, rounding = self._value_at({})
        order = sorted((k for k in shares if shares[k] > 0), key=lambda k: -shares[k])
        truncation = p.FD_SAFETY * self.u ** (2 / 3)
        # the most tensors, largest shares first, whose joint scale m s_(m) keeps rounding
        # below truncation
        fits = [m for m in range(1, len(order) + 1)
                if 4 * self.u * rounding <= truncation * m * shares[order[m - 1]]]
        joined = order[:max(fits)] if fits else []
        if len(joined) < 2:
            return None
        s_min = shares[joined[-1]]
        moves, values, tols, autos = [], [], [], []
        for _ in range(FD_DIRECTIONS):
            w = {}
            for k in joined:
                x = tensors[k][0]
                v = unit_rms_direction(rng, x.shape)
                w[k] = (steps[k] * s_min / shares[k]) * v
            (lp, ap) = self._value_at({k: tensors[k][0] + w[k] for k in joined})
            (lm, am) = self._value_at({k: tensors[k][0] - w[k] for k in joined})
            moves.append(w)
            values.append((lp - lm) / 2)
            tols.append(p.fd_tol(max(ap, am), 1.0, len(joined) * s_min, self.u))
            autos.append(sum(float(np.sum(tensors[k][1] * w[k])) for k in joined))
        if not all(math.isfinite(d) for d in values):
            return None
        return Joint(tuple(joined), moves, values, tols, autos, len(joined) * s_min)

    def kinked(self, key, x, measured, g_auto, tol) -> str:
        """Why FD cannot be trusted here, or "": L non-smooth within the step along a direction
        measured, by more than KINK_FACTOR x the FD tolerance tol (KINKED), or FD's error
        explained by its own step dependence (CURVED).  Run only to explain a disagreement."""
        if self.scheme == "complex":
            return ""
        size = rms_size(x)
        along = [(v, float(np.linalg.norm(g_auto) * np.linalg.norm(v)))
                 for v in measured.directions]
        if measured.elements is not None:
            along += [(e, float(np.max(np.abs(g_auto)))) for e in _unit_vectors(x.shape)]
        # the program's comparisons first: a branch crossed within the step is decisive, and
        # reading it costs a forward run of the oracle per step, where second differences
        # cost seven runs of the hand forward per direction
        if self._branches_within_step(key, x, measured, size):
            return KINKED
        if any(self._kinked(key, x, v, size, KINK_FACTOR * tol * scale) for v, scale in along):
            return KINKED
        return CURVED if self._truncation_explains(key, x, measured, g_auto, size) else ""

    def _truncation_explains(self, key, x, measured, g_auto, size):
        """Does FD's own step dependence explain its disagreement with autodiff?  A function
        that curves on a scale far below the step (a row of near-equal values under
        normalisation) has a truncation error h^2 |L3| / 6 (L3 the third derivative) far above the tolerance, which
        assumes derivatives of order one.  D(2h) - D(h) = 3 T(h) measures it: the disagreement
        is FD's when |D(h) - <g, v>| <= |D(2h) - D(h)| along every direction that disagrees."""
        if self.scheme != "central":
            return False
        h = tolerances.fd_step(size, self.u)
        along = list(zip(measured.directions, measured.values))
        if measured.elements is not None:
            along += list(zip(_unit_vectors(x.shape), measured.elements.reshape(-1)))
        for v, d in along:
            err = abs(d - float(np.sum(g_auto * v)))
            if err <= 64 * tolerances.U64 * abs(d):  # a few ulps need no explaining
                continue
            d2, _ = self.central(key, x, v, 2 * h)
            if err > abs(d2 - d):
                return False
        return True

    def _branches_within_step(self, key, x, measured, size):
        """Does a comparison of the oracle's program (leaky ReLU's x > 0, a max) change sign
        between x and x +- H v along a measured direction, H the scheme's largest step?  Then
        the step crosses a kink, however small its share of L: read from the program, not from
        second differences, which a few kinks among millions of elements stay under."""
        if self.oracle is None or self.scheme == "complex":
            return False
        H = self._largest_step(size)
        try:
            at_x = self.oracle.branch_signs(key, x, self.dout)
            if not at_x:
                return False
            for v in measured.directions:
                for t in (H, -H):
                    moved = self.oracle.branch_signs(key, x + t * v, self.dout)
                    if any(np.any(a != b) for a, b in zip(at_x, moved)):
                        return True
        except Exception:  # a program the rounding model cannot follow: second differences only
            return False
        return False

    def _largest_step(self, size, scheme=None):
        return tolerances.fd_step(size, self.u) if (scheme or self.scheme) == "central" else \
            2 * tolerances.richardson_step(size, self.u)

    def _kinked(self, key, x, v, size, threshold, scheme=None):
        """With the signed second difference s(t) = (L(x + tv) - 2 L(x) + L(x - tv)) / t, a
        smooth L has s(t) = t v'Hv + O(t^3), so s(H) - 4 s(H/4) and s(H) - 2 s(H/2) vanish to
        O(H^3) at the scheme's largest step H; across a kink each is a fraction of the jump in
        slope (two tests, so that no distance of the kink from x hides it from both)."""
        H = self._largest_step(size, scheme)
        l0 = self.value(key, x)[0]
        s = lambda t: (self.value(key, x + t * v)[0] - 2 * l0 + self.value(key, x - t * v)[0]) / t
        s1 = s(H)
        jumps = (abs(s1 - 4 * s(H / 4)), abs(s1 - 2 * s(H / 2)))
        return max(jumps) > threshold


def rms_size(x) -> float:
    """The typical magnitude of a tensor (its rms; 1 when empty): what FD steps scale with."""
    return float(np.sqrt(np.mean(x * x))) if x.size else 1.0


def unit_rms_direction(rng, shape):
    """A random direction of unit rms (|v| = sqrt(its size))."""
    v = rng.standard_normal(shape)
    return v / max(np.sqrt(np.mean(v * v)), 1e-300)


def _unit_vectors(shape):
    """The element-wise directions e_i, one at a time."""
    n = int(np.prod(shape))
    for i in range(n):
        e = np.zeros(n)
        e[i] = 1.0
        yield e.reshape(shape)


def relative(err, scale):
    """err relative to scale; where the scale is 0 (a reference identically zero) the error
    itself: a relative error there is undefined, and an infinite one would read as a
    non-finite value that no leg computed."""
    if not math.isfinite(err):
        return math.inf
    return err / scale if scale > 0.0 else err


def normwise(a, b):
    """max |a - b| / max |b| (b the trusted reference; ``relative``); inf when non-finite."""
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return math.inf
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    return relative(diff, scale)
