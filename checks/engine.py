"""The three-legged gradient check: hand backward, autodiff of the oracle, finite differences.

All three legs are driven by the same random upstream gradient ``dout`` (never the gradient of
``out.sum()``, which is identically zero through a softmax).  For every differentiable tensor
(each non-integer input not listed in ``nondiff`` and each parameter) the report gives

* hand vs autodiff: max |g_hand - g_autodiff| / max |g_autodiff| over the whole tensor;
* hand vs FD and autodiff vs FD: central differences in float64 of the hand forward, along a
  few random directions always, and element by element on small tensors;

and a verdict naming the leg that disagrees.  The forward is compared with the oracle first.
"""
from __future__ import annotations

import dataclasses
import json
import math
import traceback
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from checks import tolerances
from kernels.backend import to_numpy

FD_ELEMENTWISE_MAX = 256  # tensors up to this many elements also get an element-wise FD check
FD_DIRECTIONS = 3         # random directions per tensor, always
CHECKER_STREAM = 0x6C6162  # mixed into the seed of the checker's random stream


@dataclasses.dataclass
class TensorResult:
    """The comparison of one gradient tensor across the three legs."""
    name: str
    shape: tuple
    hand_vs_autodiff: float = math.nan   # normwise relative error
    hand_vs_fd: float = math.nan          # relative to |g| |v| (directional) or max |g| (elements)
    autodiff_vs_fd: float = math.nan
    max_abs: float = math.nan             # max |g_hand - g_autodiff|
    tol: float = math.nan                 # tolerance of the hand leg (dtype, reduction length)
    tol_fd: float = math.nan              # tolerance of the finite-difference leg
    verdict: str = ""
    ok: bool = False
    worst: tuple | None = None            # index of the largest hand-autodiff difference


@dataclasses.dataclass
class Report:
    """What check_layer found: ``.ok``, ``.failing`` and a readable table from ``str()``."""
    layer: str
    dtype: str
    forward_error: float
    forward_tol: float
    forward_ok: bool
    tensors: list
    error: str = ""   # set when the kernel could not be run at all

    @property
    def ok(self) -> bool:
        return not self.error and self.forward_ok and all(t.ok for t in self.tensors)

    @property
    def failing(self) -> list:
        names = [] if self.forward_ok and not self.error else ["forward"]
        return names + [t.name for t in self.tensors if not t.ok]

    def to_dict(self) -> dict:
        return {"layer": self.layer, "dtype": self.dtype, "ok": self.ok, "error": self.error,
                "forward": {"error": _num(self.forward_error), "tol": self.forward_tol,
                            "ok": self.forward_ok},
                "tensors": [{k: _num(v) for k, v in dataclasses.asdict(t).items()}
                            for t in self.tensors]}

    def __str__(self) -> str:
        return format_table([self])


def _num(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def format_table(reports: Sequence[Report]) -> str:
    """One line per layer x tensor: the three legs' errors, the tolerance and the verdict."""
    head = ("layer", "dtype", "tensor", "shape", "hand-autodiff", "hand-FD", "autodiff-FD",
            "tol", "verdict")
    rows = []
    for r in reports:
        fwd = "ok" if r.forward_ok else "FAIL: forward disagrees with the oracle"
        if r.error:
            fwd = "FAIL: " + r.error
        rows.append((r.layer, r.dtype, "forward", "", f"{r.forward_error:.1e}", "", "",
                     f"{r.forward_tol:.1e}", fwd))
        for t in r.tensors:
            rows.append((r.layer, r.dtype, t.name, "x".join(map(str, t.shape)) or "scalar",
                         f"{t.hand_vs_autodiff:.1e}", f"{t.hand_vs_fd:.1e}",
                         f"{t.autodiff_vs_fd:.1e}", f"{t.tol:.1e}",
                         ("ok" if t.ok else "FAIL: ") + ("" if t.ok else t.verdict)))
    widths = [max(len(str(row[i])) for row in rows + [head]) for i in range(len(head))]
    line = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def reports_to_json(reports: Sequence[Report]) -> str:
    return json.dumps([r.to_dict() for r in reports], indent=2)


# --- the legs ------------------------------------------------------------------------------

def _as_tuple(dinputs, n):
    """Backward returns a bare gradient for one input, a tuple for several."""
    if n == 1 and not isinstance(dinputs, (tuple, list)):
        return (dinputs,)
    if not isinstance(dinputs, (tuple, list)) or len(dinputs) != n:
        raise ValueError(f"backward returned {type(dinputs).__name__} for the input gradients, "
                         f"expected a tuple of {n} (one per input, None for non-differentiable)")
    return tuple(dinputs)


def _autodiff_leg(oracle, inputs64, params64, static, diff_idx, dout64):
    """Forward and vector-Jacobian product of the oracle, in float64."""
    def f(diff_values, params):
        full = list(inputs64)
        for i, value in zip(diff_idx, diff_values):
            full[i] = value
        return oracle(*full, params, **static)

    diff_values = [jnp.asarray(inputs64[i]) for i in diff_idx]
    jparams = {k: jnp.asarray(v) for k, v in params64.items()}
    out, vjp = jax.vjp(f, diff_values, jparams)
    d_inputs, d_params = vjp(jnp.asarray(dout64, dtype=out.dtype))
    grads = {i: np.asarray(g) for i, g in zip(diff_idx, d_inputs)}
    return np.asarray(out), grads, {k: np.asarray(v) for k, v in d_params.items()}


def _normwise(a, b):
    """max |a - b| / max |b| (b the trusted reference); inf when non-finite."""
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return math.inf
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


class _FiniteDifferences:
    """Central differences of <forward(...), dout> in float64, one tensor at a time."""

    def __init__(self, forward, inputs64, params64, static, dout64):
        self.forward, self.static, self.dout = forward, static, dout64
        self.inputs, self.params = list(inputs64), dict(params64)

    def value(self, key, replacement):
        inputs, params = list(self.inputs), dict(self.params)
        if isinstance(key, int):
            inputs[key] = replacement
        else:
            params[key] = replacement
        out, _ = self.forward(*inputs, params, **self.static)
        prod = to_numpy(out) * self.dout
        return float(np.sum(prod)), float(np.sum(np.abs(prod)))

    def compare(self, key, x, g_hand, g_auto, rng):
        """Relative errors (hand vs FD, autodiff vs FD) and the FD tolerance for tensor x."""
        h = tolerances.fd_step(np.sqrt(np.mean(x * x)) if x.size else 1.0)
        worst_h = worst_a = 0.0
        worst_tol = 0.0
        directions = [rng.standard_normal(x.shape) for _ in range(FD_DIRECTIONS)]
        for v in directions:
            v = v / max(np.sqrt(np.mean(v * v)), 1e-300)  # unit rms
            (lp, ap), (lm, am) = self.value(key, x + h * v), self.value(key, x - h * v)
            fd = (lp - lm) / (2 * h)
            scale = np.linalg.norm(g_auto) * np.linalg.norm(v)
            tol = tolerances.fd_tol(max(ap, am), h, scale)
            worst_h = max(worst_h, _rel(float(np.sum(g_hand * v)), fd, scale))
            worst_a = max(worst_a, _rel(float(np.sum(g_auto * v)), fd, scale))
            worst_tol = max(worst_tol, tol)
        if x.size <= FD_ELEMENTWISE_MAX:
            fd = np.empty(x.shape)
            rounding = 0.0
            flat = x.reshape(-1)
            for i in range(flat.size):
                e = np.zeros(flat.size)
                e[i] = h
                (lp, ap), (lm, am) = (self.value(key, (flat + e).reshape(x.shape)),
                                      self.value(key, (flat - e).reshape(x.shape)))
                fd.reshape(-1)[i] = (lp - lm) / (2 * h)
                rounding = max(rounding, ap, am)
            scale = float(np.max(np.abs(g_auto))) if g_auto.size else 0.0
            worst_h = max(worst_h, _rel_tensor(g_hand, fd, scale))
            worst_a = max(worst_a, _rel_tensor(g_auto, fd, scale))
            worst_tol = max(worst_tol, tolerances.fd_tol(rounding, h, scale))
        return worst_h, worst_a, worst_tol


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


def verdict(hand_auto_ok, hand_fd_ok, auto_fd_ok):
    """Which leg disagrees, from the three pairwise agreements."""
    if hand_auto_ok and hand_fd_ok and auto_fd_ok:
        return "ok"
    if not hand_auto_ok and not hand_fd_ok and auto_fd_ok:
        return "hand is wrong (autodiff and FD agree)"
    if not hand_auto_ok and hand_fd_ok and not auto_fd_ok:
        return "oracle is wrong (hand and FD agree)"
    if hand_auto_ok and not hand_fd_ok and not auto_fd_ok:
        return "finite differences unreliable here (hand and autodiff agree)"
    if hand_auto_ok:
        return "hand and autodiff agree, FD is borderline"
    return "all three legs disagree"


# --- the public entry point ----------------------------------------------------------------

def check_layer(forward: Callable, backward: Callable, oracle: Callable, inputs: Sequence,
                params: dict, *, static: dict | None = None, nondiff: Sequence[int] = (),
                seed: int = 0, name: str = "layer", input_names: Sequence[str] | None = None,
                reduction: int | None = None) -> Report:
    """Check a hand forward/backward pair against its JAX oracle and finite differences.

    forward(*inputs, params, **static) -> (out, cache); backward(dout, cache) -> (dinputs,
    dparams) with dinputs aligned with inputs (a bare array for a single input, None for
    non-differentiable ones) and dparams a dict with the keys of params; oracle(*inputs,
    params, **static) -> out in jax.numpy.  The hand pair runs in the dtype of the given inputs
    (NumPy or CuPy); the oracle and the finite differences run in float64 on the host.
    Integer inputs (token ids, targets) are never differentiated; ``nondiff`` adds more.
    """
    static = dict(static or {})
    # The checker's own stream, distinct from a caller's default_rng(seed) that may have drawn
    # the inputs (dout equal to x would make e.g. RMS-norm's gradient vanish); never the global RNG.
    rng = np.random.default_rng([seed, CHECKER_STREAM])
    names = list(input_names) if input_names else [f"input{i}" for i in range(len(inputs))]
    host_inputs = [to_numpy(x) for x in inputs]
    floats = [x for x in host_inputs if np.asarray(x).dtype.kind == "f"]
    floats += [to_numpy(v) for v in params.values()]
    dtype = floats[0].dtype if floats else np.dtype(np.float64)
    diff_idx = [i for i, x in enumerate(host_inputs)
                if np.asarray(x).dtype.kind == "f" and i not in set(nondiff)]
    to64 = lambda x: x.astype(np.float64) if np.asarray(x).dtype.kind == "f" else x
    inputs64 = [to64(np.asarray(x)) for x in host_inputs]
    params64 = {k: to_numpy(v).astype(np.float64) for k, v in params.items()}

    # The oracle in float64 gives the reference forward and, with dout, the autodiff leg.
    ref_out = np.asarray(oracle(*inputs64, params64, **static))
    dout64 = rng.standard_normal(ref_out.shape)
    k = reduction or (ref_out.size + max(int(np.size(x)) for x in host_inputs + floats))
    tol = tolerances.grad_tol(dtype, k)
    empty = lambda msg: Report(name, str(dtype), math.nan, tol, False, [], error=msg)

    try:
        out, cache = forward(*inputs, params, **static)
        xp_dout = _like(dout64.astype(dtype), inputs)
        dinputs, dparams = backward(xp_dout, cache)
        dinputs = _as_tuple(dinputs, len(inputs))
    except Exception as exc:  # a broken kernel is a failing report, never a crashed suite
        return empty(f"the hand kernel raised {type(exc).__name__}: {exc}".strip()
                     + "\n" + traceback.format_exc(limit=-2))
    out = to_numpy(out)
    forward_error = _normwise(np.asarray(out, dtype=np.float64), ref_out)
    forward_ok = forward_error <= tol and tuple(np.shape(out)) == ref_out.shape
    if np.asarray(out).dtype != dtype:
        forward_ok = False
        return empty(f"the forward returned dtype {np.asarray(out).dtype} for {dtype} inputs")

    _, auto_in, auto_params = _autodiff_leg(oracle, inputs64, params64, static, diff_idx, dout64)
    fd = _FiniteDifferences(forward, inputs64, params64, static, dout64)

    if not isinstance(dparams, dict):
        return empty(f"backward returned {type(dparams).__name__} for the parameter gradients, "
                     f"expected a dict with keys {sorted(params)}")
    results = []
    for key in list(diff_idx) + list(params):
        tname = names[key] if isinstance(key, int) else key
        x = inputs64[key] if isinstance(key, int) else params64[key]
        g_auto = auto_in[key] if isinstance(key, int) else auto_params[key]
        hand = dinputs[key] if isinstance(key, int) else dparams.get(key)
        results.append(_compare_tensor(tname, key, x, hand, g_auto, dtype, tol, fd, rng))
    extra = sorted(set(dparams) - set(params))
    for key in extra:
        results.append(TensorResult(key, (), verdict=f"backward returned a gradient for "
                                    f"'{key}', which is not a parameter"))
    for i, name_i in enumerate(names):
        if i not in diff_idx and dinputs[i] is not None and np.asarray(host_inputs[i]).dtype.kind != "f":
            results.append(TensorResult(name_i, (), verdict="backward returned a gradient for "
                                        "a non-differentiable (integer) input; expected None"))
    return Report(name, str(dtype), forward_error, tol, bool(forward_ok), results)


def _like(array, inputs):
    """dout on the same backend as the inputs (CuPy inputs get a CuPy dout)."""
    for x in inputs:
        if type(x).__module__.startswith("cupy"):
            import cupy
            return cupy.asarray(array)
    return array


def _compare_tensor(tname, key, x, hand, g_auto, dtype, tol, fd, rng):
    result = TensorResult(tname, tuple(np.shape(x)), tol=tol)
    if hand is None:
        result.verdict = "backward returned no gradient for this tensor"
        return result
    hand = to_numpy(hand)
    if tuple(np.shape(hand)) != tuple(np.shape(x)):
        result.verdict = f"hand gradient has shape {tuple(np.shape(hand))}, expected {result.shape}"
        return result
    if np.asarray(hand).dtype != dtype:
        result.verdict = f"hand gradient has dtype {np.asarray(hand).dtype}, expected {dtype}"
        return result
    g_hand = np.asarray(hand, dtype=np.float64)
    result.hand_vs_autodiff = _normwise(g_hand, g_auto)
    if np.all(np.isfinite(g_hand)) and np.all(np.isfinite(g_auto)) and g_hand.size:
        diff = np.abs(g_hand - g_auto)
        result.max_abs = float(diff.max())
        result.worst = tuple(int(i) for i in np.unravel_index(int(diff.argmax()), diff.shape))
    result.hand_vs_fd, result.autodiff_vs_fd, result.tol_fd = fd.compare(key, x, g_hand, g_auto, rng)
    finite = all(math.isfinite(v) for v in (result.hand_vs_autodiff, result.hand_vs_fd,
                                               result.autodiff_vs_fd))
    if not finite:
        legs = [leg for leg, g in (("hand", g_hand), ("autodiff", g_auto)) if not np.all(np.isfinite(g))]
        result.verdict = ("non-finite values in the " + " and ".join(legs) + " leg"
                          if legs else "non-finite values in the finite differences")
        return result
    fd_tol = max(result.tol_fd, tol)  # a float32 hand leg cannot agree with FD better than tol
    result.verdict = verdict(result.hand_vs_autodiff <= tol, result.hand_vs_fd <= fd_tol,
                             result.autodiff_vs_fd <= result.tol_fd)
    result.ok = result.verdict == "ok"
    return result
