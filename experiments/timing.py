"""Timing that compares in one run: interleaved repeats, medians, and the BLAS thread setting."""
from __future__ import annotations

import contextlib
import time

import numpy as np


def sync(value):
    """Block until a value (NumPy, CuPy or JAX, or a pytree of them) is computed."""
    import jax
    for leaf in jax.tree_util.tree_leaves(value):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()
        elif type(leaf).__module__.startswith("cupy"):
            import cupy
            cupy.cuda.get_current_stream().synchronize()
            return value
    return value


def compare(candidates: dict, *, repeats: int = 20, warmup: int = 3) -> dict:
    """Median seconds of each zero-argument callable, measured round-robin in one loop.

    Interleaving makes slow drifts of a shared machine hit every candidate alike, so the ratios
    between candidates are what this measures best.
    """
    for fn in candidates.values():
        for _ in range(warmup):
            sync(fn())
    times = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            start = time.perf_counter()
            sync(fn())
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(ts)) for name, ts in times.items()}


@contextlib.contextmanager
def blas_threads(n: int):
    """Limit BLAS threads (n = 0: leave the library's default)."""
    if not n:
        yield
        return
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=n, user_api="blas"):
        yield


def blas_info() -> list:
    from threadpoolctl import threadpool_info
    return [{k: lib.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
            for lib in threadpool_info() if lib.get("user_api") == "blas"]


def matmul(xp, dtype, n: int = 1024):
    """(a zero-argument n x n by n x n product, its FLOPs): a candidate to time beside others."""
    rng = np.random.default_rng(0)
    a = xp.asarray(rng.standard_normal((n, n)).astype(dtype))
    b = xp.asarray(rng.standard_normal((n, n)).astype(dtype))
    return (lambda: a @ b), 2 * n ** 3


def matmul_rate(xp, dtype, n: int = 1024, repeats: int = 10) -> float:
    """The machine's own matrix-multiply rate in FLOP/s (n x n by n x n): the practical ceiling."""
    product, flops = matmul(xp, dtype, n)
    return flops / compare({"mm": product}, repeats=repeats, warmup=2)["mm"]
