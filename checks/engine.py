"""The three-legged gradient check: hand backward, autodiff of the oracle, finite differences.

All three legs are driven by the same random upstream gradient ``dout`` (never the gradient of
``out.sum()``, which is identically zero through a softmax).  For every differentiable tensor
(each non-integer input not listed in ``nondiff`` and each parameter) the report gives

* hand vs autodiff: max |g_hand - g_autodiff| / max |g_autodiff| over the whole tensor;
* hand vs FD and autodiff vs FD: finite differences in float64 of the hand forward, along a
  few random directions always, and element by element on small tensors;

a verdict naming the leg that disagrees, and for a failure the bug shape that fits and the worst
element (``checks.diagnosis``).  The forward is compared with the oracle first: when it disagrees
the gradient comparisons are moot.  A broken kernel or oracle (raising, misshapen or missing
gradients, non-finite values) gives a failing report, never an exception.
"""
from __future__ import annotations

import math
import traceback
from typing import Callable, Sequence

import numpy as np

from checks import tolerances
from checks.diagnosis import Context, constants_from, diagnose, locate, worst_index
from checks.legs import FiniteDifferences, Oracle, normwise
from checks.report import Report, TensorResult, format_table, reports_to_json  # noqa: F401
from kernels.backend import to_numpy

CHECKER_STREAM = 0x6C6162  # mixed into the seed of the checker's random stream


def verdict(hand_auto_ok, hand_fd_ok, auto_fd_ok, kink=False):
    """Which leg disagrees, from the three pairwise agreements."""
    kinked = ": the function is not smooth within the step (a kink?)" if kink else ""
    if hand_auto_ok and hand_fd_ok and auto_fd_ok:
        return "ok"
    if not hand_auto_ok and not hand_fd_ok and auto_fd_ok:
        return "hand is wrong (autodiff and FD agree)"
    if not hand_auto_ok and hand_fd_ok and not auto_fd_ok:
        return "oracle is wrong (hand and FD agree)"
    if hand_auto_ok and ((not hand_fd_ok and not auto_fd_ok) or kink):
        return "finite differences unreliable here (hand and autodiff agree)" + kinked
    if hand_auto_ok:
        return "hand and autodiff agree, FD is borderline"
    if kink:
        return "hand and autodiff disagree and finite differences are unreliable here" + kinked
    return "all three legs disagree"


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


def _raised(part, exc):
    return (f"the {part} raised {type(exc).__name__}: {exc}".strip() + "\n"
            + traceback.format_exc(limit=-2))


def _nonfinite(label, a):
    a = np.asarray(a, dtype=np.float64)
    n_nan, n_inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
    return f"non-finite values in the {label}: {n_nan} NaN, {n_inf} Inf"


def check_layer(forward: Callable, backward: Callable, oracle: Callable, inputs: Sequence,
                params: dict, *, static: dict | None = None, nondiff: Sequence[int] = (),
                seed: int = 0, name: str = "layer", input_names: Sequence[str] | None = None,
                reduction: int | None = None, axes: dict | None = None,
                sizes: dict | None = None, fd: str = "central") -> Report:
    """Check a hand forward/backward pair against its JAX oracle and finite differences.

    forward(*inputs, params, **static) -> (out, cache); backward(dout, cache) -> (dinputs,
    dparams) with dinputs aligned with inputs (a bare array for a single input, None for
    non-differentiable ones) and dparams a dict with the keys of params; oracle(*inputs,
    params, **static) -> out in jax.numpy.  The hand pair runs in the dtype of the given inputs
    (NumPy or CuPy); the oracle and the finite differences run in float64 on the host.
    Integer inputs (token ids, targets) are never differentiated; ``nondiff`` adds more.

    axes: tensor name -> axis names, to report the worst element as ``batch 3, head 1, ...``.
    sizes: the layer's named sizes (B, T, H, P ...), to name a wrong scale factor.
    fd: "central" (u^(1/3) step), "richardson" or "complex" (complex step on the oracle).
    """
    static = dict(static or {})
    axes = dict(axes or {})
    # The checker's own stream, distinct from a caller's default_rng(seed) that may have drawn
    # the inputs (dout equal to x would make e.g. RMS-norm's gradient vanish); never the global RNG.
    rng = np.random.default_rng([seed, CHECKER_STREAM])
    names = list(input_names) if input_names else [f"input{i}" for i in range(len(inputs))]
    host_inputs = [np.asarray(to_numpy(x)) for x in inputs]
    host_params = {k: np.asarray(to_numpy(v)) for k, v in params.items()}
    floats = [x for x in host_inputs if x.dtype.kind == "f"] + list(host_params.values())
    dtype = floats[0].dtype if floats else np.dtype(np.float64)
    diff_idx = [i for i, x in enumerate(host_inputs) if x.dtype.kind == "f" and i not in set(nondiff)]
    inputs64 = [x.astype(np.float64) if x.dtype.kind == "f" else x for x in host_inputs]
    params64 = {k: v.astype(np.float64) for k, v in host_params.items()}
    k = reduction or (1 + max([int(x.size) for x in host_inputs + floats] or [1]))
    tol = tolerances.grad_tol(dtype, k)

    def failed(msg, part, forward_error=math.nan):
        return Report(name, str(dtype), forward_error, tol, False, [], error=msg, error_in=part)

    try:
        ref = Oracle(oracle, inputs64, params64, static, diff_idx)
        out_shape = ref.out_shape()
    except Exception as exc:
        return failed(_raised("oracle", exc), "oracle")
    dout64 = rng.standard_normal(out_shape)
    k = reduction or (int(np.prod(out_shape)) + k)
    tol = tolerances.grad_tol(dtype, k)
    try:
        out, cache = forward(*inputs, params, **static)
    except Exception as exc:  # a broken kernel is a failing report, never a crashed suite
        return failed(_raised("hand forward", exc), "forward")
    try:
        dinputs, dparams = backward(_like(dout64.astype(dtype), inputs), cache)
        dinputs = _as_tuple(dinputs, len(inputs))
        if not isinstance(dparams, dict):
            raise TypeError(f"backward returned {type(dparams).__name__} for the parameter "
                            f"gradients, expected a dict with keys {sorted(params)}")
    except Exception as exc:
        return failed(_raised("hand backward", exc), "backward")
    try:
        ref_out, auto_in, auto_params = ref.vjp(dout64)
    except Exception as exc:
        return failed(_raised("oracle", exc), "oracle")

    out = np.asarray(to_numpy(out))
    if out.shape != ref_out.shape:
        return failed(f"the hand forward returned shape {out.shape}, the oracle {ref_out.shape}",
                      "forward")
    if out.dtype != dtype:
        return failed(f"the forward returned dtype {out.dtype} for {dtype} inputs", "forward")
    forward_error = normwise(out.astype(np.float64), ref_out)
    error, error_in, note, u_eff = "", "", "", tolerances.U64
    for label, a, part in (("hand forward", out, "forward"), ("oracle", ref_out, "oracle")):
        if not np.all(np.isfinite(a)):
            error, error_in = _nonfinite(label, a), part
    # A forward that quietly computes in float32 gets a note, not a failure: its float64 outputs
    # are all float32 numbers (no float64 computation gives that by chance, and a small error in
    # the maths does not), and its error against the oracle is float32's.
    low = (dtype == np.float64 and tol < forward_error <= tolerances.grad_tol(np.float32, k)
           and np.array_equal(out, out.astype(np.float32).astype(np.float64)))
    if low and not error:
        tol, u_eff = tolerances.grad_tol(np.float32, k), tolerances.unit_roundoff(np.float32)
        note = (f"the forward computes in lower precision than its float64 inputs (its error "
                f"against the oracle, {forward_error:.1e}, is float32's): judged at float32 "
                f"tolerance, finite differences with float32's step")
    forward_ok = forward_error <= tol and not error

    fd_leg = FiniteDifferences(forward, inputs64, params64, static, dout64, scheme=fd,
                               oracle=ref, u=u_eff)
    results, pairs = [], {}
    for key in list(diff_idx) + list(params):
        tname = names[key] if isinstance(key, int) else key
        x = inputs64[key] if isinstance(key, int) else params64[key]
        g_auto = auto_in[key] if isinstance(key, int) else auto_params[key]
        hand = dinputs[key] if isinstance(key, int) else dparams.get(key)
        result, g_hand = _compare_tensor(tname, key, x, hand, g_auto, dtype, tol, fd_leg, rng)
        results.append(result)
        pairs[tname] = (g_hand, g_auto)
    for key in sorted(set(dparams) - set(params)):
        results.append(TensorResult(key, (), verdict=f"backward returned a gradient for "
                                    f"'{key}', which is not a parameter"))
    for i, name_i in enumerate(names):
        if host_inputs[i].dtype.kind != "f" and dinputs[i] is not None:
            results.append(TensorResult(name_i, (), verdict="backward returned a gradient for "
                                        "a non-differentiable (integer) input; expected None"))

    ctx = Context(trusted={n: g for n, (_, g) in pairs.items()},
                  constants=constants_from(sizes, static, [x.shape for x in floats]),
                  axes=axes,
                  masks=[(f"the mask '{m}' (its False entries)", ~np.asarray(v))
                         for m, v in static.items() if getattr(v, "dtype", None) == bool],
                  ids=[x for x in host_inputs if x.dtype.kind in "iu"],
                  dout=dout64, slice_vjp=_slice_vjp(ref, dout64),
                  heads=(sizes or {}).get("H"))
    for result in results:
        if result.ok or result.name not in pairs or pairs[result.name][0] is None \
                or result.hand_vs_autodiff <= tol:  # nothing to explain between hand and oracle
            continue
        g_hand, g_auto = pairs[result.name]
        suspect, trusted = (g_auto, g_hand) if result.verdict.startswith("oracle") else \
            (g_hand, g_auto)
        result.diagnosis = diagnose(result.name, suspect, trusted, ctx, tol)
        result.location = locate(result.worst, result.shape, axes.get(result.name))
        if not forward_ok:
            result.note = "moot while the forward disagrees with the oracle"
    return Report(name, str(dtype), forward_error, tol, bool(forward_ok), results,
                  error=error, error_in=error_in, note=note)


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


def _like(array, inputs):
    """dout on the same backend as the inputs (CuPy inputs get a CuPy dout)."""
    for x in inputs:
        if type(x).__module__.startswith("cupy"):
            import cupy
            return cupy.asarray(array)
    return array


def _compare_tensor(tname, key, x, hand, g_auto, dtype, tol, fd, rng):
    """(result, hand gradient in float64 or None when it cannot be compared)."""
    result = TensorResult(tname, tuple(np.shape(x)), tol=tol)
    if hand is None:
        result.verdict = "backward returned no gradient for this tensor"
        return result, None
    hand = np.asarray(to_numpy(hand))
    if hand.shape != result.shape:
        result.verdict = f"hand gradient has shape {hand.shape}, expected {result.shape}"
        if hand.dtype.kind == "f":
            result.diagnosis = diagnose(tname, hand.astype(np.float64), g_auto,
                                        Context({}, [], {}, [], [], np.zeros(0), None), tol)
        return result, None
    if hand.dtype != dtype:
        result.verdict = f"hand gradient has dtype {hand.dtype}, expected {dtype}"
        return result, None
    g_hand = hand.astype(np.float64)
    result.hand_vs_autodiff = normwise(g_hand, g_auto)
    if np.all(np.isfinite(g_hand)) and np.all(np.isfinite(g_auto)) and g_hand.size:
        result.max_abs = float(np.max(np.abs(g_hand - g_auto)))
        result.worst = worst_index(g_hand, g_auto)
    try:
        result.hand_vs_fd, result.autodiff_vs_fd, result.tol_fd = fd.compare(
            key, x, g_hand, g_auto, rng)
    except Exception as exc:  # the forward raised at a perturbed point
        result.verdict = _raised("hand forward, at a finite-difference point,", exc)
        return result, g_hand
    legs = [leg for leg, g in (("hand", g_hand), ("autodiff", g_auto)) if not np.all(np.isfinite(g))]
    if legs or not (math.isfinite(result.hand_vs_fd) and math.isfinite(result.autodiff_vs_fd)):
        result.verdict = "non-finite values in the " + (" and ".join(legs) + " leg" if legs
                                                         else "finite differences")
        return result, g_hand
    fd_tol = max(result.tol_fd, tol)  # a float32 hand leg cannot agree with FD better than tol
    agree = (result.hand_vs_autodiff <= tol, result.hand_vs_fd <= fd_tol,
             result.autodiff_vs_fd <= result.tol_fd)
    kink = not agree[2] and fd.kinked(key, x, g_auto, result.tol_fd)  # explains FD's miss
    result.verdict = verdict(*agree, kink)
    if result.verdict.startswith("finite differences unreliable") and kink:
        result.ok, result.note = True, result.verdict  # explained: hand and autodiff agree
    else:
        result.ok = result.verdict == "ok"
    return result, g_hand
