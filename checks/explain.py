"""The float64 run of a low-precision check, for the diagnosis.

A float32 (float16, bfloat16) failure within a few times its tolerance may be rounding in an
ill-conditioned case, or a small bug.  The same kernel on the same inputs in float64, with the
same upstream gradient, tells them apart: where its float64 check passes the error is rounding;
where it fails, the bug is there without the low precision's rounding, and its pattern is fitted
on the float64 error (cleaner by eight orders of magnitude).
"""
from __future__ import annotations

import math

import numpy as np

from kernels.backend import to_numpy


def float64_rerun(forward, backward, inputs64, params64, static, dout64, names, judges, tol64):
    """name -> (float64 hand gradient or None, the float64 check passes, its relative fit
    tolerance).  Runs the kernel once, on first use; a kernel that fails in float64 (or has no
    float64 path) gives (None, False, nan).  ``result.cache()`` is that run's forward cache
    (None where it failed): a gradient fitted in float64 is compared with the float64 values
    the kernel cached, not with the low-precision check's, which differ by its rounding."""
    state = {}

    def run():
        try:
            _, cache = forward(*inputs64, params64, **static)
            state["cache"] = cache
            dinputs, dparams = backward(dout64, cache)
            if len(inputs64) == 1 and not isinstance(dinputs, (tuple, list)):
                dinputs = (dinputs,)
            grads = {n: d for n, d in zip(names, dinputs) if d is not None}
            grads.update(dparams)
            return {k: np.asarray(to_numpy(v)).astype(np.float64) for k, v in grads.items()}
        except Exception:
            return {}

    def result(name):
        if "grads" not in state:
            state["grads"] = run()
        g64 = state["grads"].get(name)
        judge = judges.get(name)
        if g64 is None or judge is None or g64.shape != judge.g_auto.shape:
            return None, False, math.nan
        tol = tol64(judge)
        scale = float(np.max(np.abs(judge.g_auto))) if judge.g_auto.size else 0.0
        passes = bool(np.all(np.abs(g64 - judge.g_auto) <= tol))
        return g64, passes, float(np.max(tol)) / scale if scale else math.inf

    def cache():
        if "grads" not in state:
            state["grads"] = run()
        return state.get("cache")
    result.cache = cache
    return result
