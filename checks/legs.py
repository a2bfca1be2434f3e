"""The two trusted legs of a check: autodiff of the JAX oracle and finite differences.

Both differentiate L(x) = <f(x), dout> for a random upstream gradient ``dout``.

* autodiff: ``jax.vjp`` of the oracle in float64, compiled once per (oracle, static arguments,
  shapes) with ``jax.jit`` (a new shape costs ~0.8 s instead of ~3 s op by op); an oracle that
  cannot be traced (NumPy calls on its arguments) runs eagerly instead.
* finite differences of the hand forward, in float64: central differences with the u^(1/3) step
  (default), Richardson extrapolation of two central differences (option), or the complex step
  on the oracle (option, analytic layers only: the kernels accept real floats by contract).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from checks import tolerances
from kernels.backend import to_numpy

FD_ELEMENTWISE_MAX = 256  # tensors up to this many elements also get an element-wise check
FD_DIRECTIONS = 3         # random directions per tensor, always
FD_SCHEMES = ("central", "richardson", "complex")
KINK_FACTOR = 10          # a kink: second differences off by 10 x the FD tolerance


# --- autodiff ------------------------------------------------------------------------------

def _split_static(static):
    """Hashable static arguments (compiled in) and array-valued ones (traced, e.g. a mask)."""
    arrays = {k: v for k, v in static.items() if hasattr(v, "shape")}
    rest = tuple(sorted((k, v) for k, v in static.items() if k not in arrays))
    hash(rest)  # TypeError for an unhashable static value: the caller falls back to eager
    return rest, arrays


def _runs(call):
    """(vjp_run, loss_run, out_run) around call(diff_values, others, params, arrays) -> out."""
    def vjp_run(diff_values, others, params, arrays, dout):
        out, vjp = jax.vjp(lambda d, p: call(d, others, p, arrays), diff_values, params)
        return out, vjp(dout.astype(out.dtype))

    def loss_run(diff_values, others, params, arrays, dout):
        return jnp.sum(call(diff_values, others, params, arrays) * dout)

    def out_run(diff_values, others, params, arrays, dout):
        return call(diff_values, others, params, arrays)

    return vjp_run, loss_run, out_run


def _caller(oracle, diff_idx, static):
    def call(diff_values, others, params, arrays):
        full = list(others)
        for i, value in zip(diff_idx, diff_values):
            full[i] = value
        return oracle(*full, params, **static, **arrays)
    return call


@functools.lru_cache(maxsize=512)
def _oracle_functions(oracle, diff_idx, static_items):
    """Jitted and eager (vjp_run, loss_run, out_run); all take (diff_values, others, params,
    arrays, dout).  Cached, so a second check of the same oracle at the same shapes compiles nothing."""
    runs = _runs(_caller(oracle, diff_idx, dict(static_items)))
    return tuple(jax.jit(f) for f in runs), runs


class Oracle:
    """The oracle of one check, at fixed inputs: its forward, VJPs and complex-step values."""

    def __init__(self, oracle, inputs64, params64, static, diff_idx):
        self.diff_idx = tuple(diff_idx)
        self.inputs = list(inputs64)
        self.others = tuple(None if i in self.diff_idx else jnp.asarray(x)
                            for i, x in enumerate(inputs64))
        self.params = {k: jnp.asarray(v) for k, v in params64.items()}
        try:
            static_items, self.arrays = _split_static(static)
            self._fns = list(_oracle_functions(oracle, self.diff_idx, static_items))
        except TypeError:  # an unhashable static argument: op by op only
            self.arrays = {}
            self._fns = [_runs(_caller(oracle, self.diff_idx, static))]

    def _run(self, which, diff_values, params, dout, transform=lambda f: f):
        error = None
        for fns in list(self._fns):
            try:
                return transform(fns[which])(diff_values, self.others, params, self.arrays, dout)
            except Exception as exc:  # not traceable under jit: fall back to eager, once
                error = exc
                if len(self._fns) > 1:
                    self._fns.pop(0)
        raise error

    def out_shape(self):
        """The shape of the oracle's output, from a (cached) trace: nothing is computed."""
        diff_values = [jnp.asarray(self.inputs[i]) for i in self.diff_idx]
        out = self._run(2, diff_values, self.params, None,
                        transform=lambda f: lambda *a: jax.eval_shape(f, *a))
        return tuple(out.shape)

    def vjp(self, dout):
        """(out, {input index: gradient}, {param: gradient}) for the upstream gradient dout."""
        diff_values = [jnp.asarray(self.inputs[i]) for i in self.diff_idx]
        out, (d_in, d_params) = self._run(0, diff_values, self.params, jnp.asarray(dout))
        return (np.asarray(out), {i: np.asarray(g) for i, g in zip(self.diff_idx, d_in)},
                {k: np.asarray(v) for k, v in d_params.items()})

    def loss(self, key, replacement, dout):
        """<oracle(...), dout> with one tensor replaced (complex values allowed)."""
        diff_values = [jnp.asarray(replacement if i == key else self.inputs[i])
                       for i in self.diff_idx]
        params = dict(self.params)
        if not isinstance(key, int):
            params[key] = jnp.asarray(replacement)
        return complex(self._run(1, diff_values, params, jnp.asarray(dout)))


# --- finite differences --------------------------------------------------------------------

class FiniteDifferences:
    """Numerical derivatives of L(x) = <forward(x), dout>, one tensor at a time.

    ``u`` is the unit roundoff the forward effectively computes in (float64's, unless the
    forward was found to round to a lower precision internally); steps and tolerances follow it.
    """

    def __init__(self, forward, inputs, params, static, dout64, *, scheme="central",
                 oracle: Oracle | None = None, u=tolerances.U64):
        if scheme not in FD_SCHEMES:
            raise ValueError(f"fd: expected one of {FD_SCHEMES}, got {scheme!r}")
        if scheme == "complex" and oracle is None:
            raise ValueError("fd='complex' needs the oracle")
        self.forward, self.static, self.dout = forward, static, dout64
        self.inputs, self.params = list(inputs), dict(params)
        self.scheme, self.oracle, self.u = scheme, oracle, u
        self.directions = {}  # key -> the random directions compare() used

    def value(self, key, replacement):
        """(L, sum |f * dout|) of the hand forward with one tensor replaced."""
        inputs, params = list(self.inputs), dict(self.params)
        original = inputs[key] if isinstance(key, int) else params[key]
        replacement = np.asarray(replacement).astype(original.dtype)
        if isinstance(key, int):
            inputs[key] = replacement
        else:
            params[key] = replacement
        out, _ = self.forward(*inputs, params, **self.static)
        prod = np.asarray(to_numpy(out), dtype=np.float64) * self.dout
        return float(np.sum(prod)), float(np.sum(np.abs(prod)))

    def central(self, key, x, v, h):
        """(L(x + h v) - L(x - h v)) / 2h and the largest sum |f * dout| seen."""
        (lp, ap), (lm, am) = self.value(key, x + h * v), self.value(key, x - h * v)
        return (lp - lm) / (2 * h), max(ap, am)

    def forward_difference(self, key, x, v, h):
        (lp, ap), (l0, a0) = self.value(key, x + h * v), self.value(key, x)
        return (lp - l0) / h, max(ap, a0)

    def complex_step(self, key, x, v, h):
        """Im L(x + i h v) / h on the oracle: no subtraction, so no cancellation."""
        return self.oracle.loss(key, x + 1j * h * v, self.dout).imag / h, 0.0

    def derivative(self, key, x, v, size):
        """Directional derivative along v by the chosen scheme: (value, tolerance of scale)."""
        if self.scheme == "complex":
            h = 1e-20 * size
            d, _ = self.complex_step(key, x, v, h)
            return d, (lambda scale: tolerances.complex_step_tol())
        if self.scheme == "richardson":
            h = tolerances.richardson_step(size, self.u)
            d1, a1 = self.central(key, x, v, h)
            d2, a2 = self.central(key, x, v, 2 * h)
            rounding = max(a1, a2)
            return ((4 * d1 - d2) / 3,
                    lambda scale: tolerances.richardson_tol(rounding, h, scale, self.u))
        h = tolerances.fd_step(size, self.u)
        d1, a1 = self.central(key, x, v, h)
        return d1, (lambda scale: tolerances.fd_tol(a1, h, scale, self.u))

    def compare(self, key, x, g_hand, g_auto, rng):
        """Relative errors (hand vs FD, autodiff vs FD) and the FD tolerance for tensor x."""
        size = float(np.sqrt(np.mean(x * x))) if x.size else 1.0
        worst_h = worst_a = worst_tol = 0.0
        self.directions[key] = []
        for _ in range(FD_DIRECTIONS):
            v = rng.standard_normal(x.shape)
            v = v / max(np.sqrt(np.mean(v * v)), 1e-300)  # unit rms
            self.directions[key].append(v)
            d, tol_of = self.derivative(key, x, v, size)
            scale = float(np.linalg.norm(g_auto) * np.linalg.norm(v))
            worst_h = max(worst_h, _rel(float(np.sum(g_hand * v)), d, scale))
            worst_a = max(worst_a, _rel(float(np.sum(g_auto * v)), d, scale))
            worst_tol = max(worst_tol, tol_of(scale))
        if x.size <= FD_ELEMENTWISE_MAX:
            fd = np.empty(x.shape)
            tols = []
            for i, e in enumerate(_unit_vectors(x.shape)):
                d, tol_of = self.derivative(key, x, e, size)
                fd.reshape(-1)[i] = d
                tols.append(tol_of)
            scale = float(np.max(np.abs(g_auto))) if g_auto.size else 0.0
            worst_h = max(worst_h, _rel_tensor(g_hand, fd, scale))
            worst_a = max(worst_a, _rel_tensor(g_auto, fd, scale))
            worst_tol = max([worst_tol] + [t(scale) for t in tols])
        return worst_h, worst_a, worst_tol

    def kinked(self, key, x, g_auto, tol):
        """Is L non-smooth within the step along any direction compare() used, by more than
        KINK_FACTOR x the FD tolerance tol?  Run only to explain a disagreement, so its cost
        does not matter."""
        if self.scheme == "complex":
            return False
        size = float(np.sqrt(np.mean(x * x))) if x.size else 1.0
        along = [(v, float(np.linalg.norm(g_auto) * np.linalg.norm(v)))
                 for v in self.directions.get(key, [])]
        if x.size <= FD_ELEMENTWISE_MAX:
            along += [(e, float(np.max(np.abs(g_auto)))) for e in _unit_vectors(x.shape)]
        return any(self._kinked(key, x, v, size, KINK_FACTOR * tol * scale) for v, scale in along)

    def _kinked(self, key, x, v, size, threshold):
        """With the signed second difference s(t) = (L(x + tv) - 2 L(x) + L(x - tv)) / t, a
        smooth L has s(t) = t v'Hv + O(t^3), so s(H) - 4 s(H/4) and s(H) - 2 s(H/2) vanish to
        O(H^3) at the scheme's largest step H; across a kink each is a fraction of the jump in
        slope (two tests, so that no distance of the kink from x hides it from both)."""
        H = tolerances.fd_step(size, self.u) if self.scheme == "central" else \
            2 * tolerances.richardson_step(size, self.u)
        l0 = self.value(key, x)[0]
        s = lambda t: (self.value(key, x + t * v)[0] - 2 * l0 + self.value(key, x - t * v)[0]) / t
        s1 = s(H)
        jumps = (abs(s1 - 4 * s(H / 4)), abs(s1 - 2 * s(H / 2)))
        return max(jumps) > threshold


def _unit_vectors(shape):
    """The element-wise directions e_i, one at a time."""
    n = int(np.prod(shape))
    for i in range(n):
        e = np.zeros(n)
        e[i] = 1.0
        yield e.reshape(shape)


def _rel(a, b, scale):
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    if scale == 0.0:
        return 0.0 if a == b else math.inf
    return abs(a - b) / scale


def _rel_tensor(a, b, scale):
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return math.inf
    diff = float(np.max(np.abs(a - b)))
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


def normwise(a, b):
    """max |a - b| / max |b| (b the trusted reference); inf when non-finite."""
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return math.inf
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale
