"""Timing that compares in one run: interleaved repeats, medians, the BLAS thread setting, the
allocator setting (reuse_freed_memory) and page-fault counts, and what the run ran on (BLAS
library and kernel, threads, JAX and PyTorch), with a warning when OPENBLAS_CORETYPE forces
OpenBLAS onto another kernel than the one it detects for the CPU."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
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


def compare_samples(candidates: dict, *, repeats: int = 20, warmup: int = 3) -> dict:
    """Seconds of every repeat of each zero-argument callable, measured round-robin in one loop:
    {name: (repeats,) array}, index i of every array from the same round.

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
    return {name: np.asarray(ts) for name, ts in times.items()}


def compare(candidates: dict, *, repeats: int = 20, warmup: int = 3) -> dict:
    """Median seconds of each candidate of ``compare_samples``."""
    samples = compare_samples(candidates, repeats=repeats, warmup=warmup)
    return {name: float(np.median(ts)) for name, ts in samples.items()}


CONFIDENCE = 0.95  # of the intervals the bench prints beside its ratios


def median_ratio_interval(a, b, confidence: float = CONFIDENCE, seed: int = 0) -> tuple:
    """The interval of median(a) / median(b) over the rounds of one interleaved loop
    (``compare_samples``): a percentile bootstrap that resamples whole rounds
    (``common.median_ratio``), so each resample keeps a and b from the same moments of the
    machine.  It says how far the loop's own noise moves the ratio; a drift between runs
    (another hour, another machine) is not in it."""
    from experiments import common
    return common.median_ratio(a, b, seed=seed, confidence=confidence)[1]


@contextlib.contextmanager
def blas_threads(n: int):
    """Limit BLAS threads (n = 0: leave the library's default)."""
    if not n:
        yield
        return
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=n, user_api="blas"):
        yield


@contextlib.contextmanager
def on_cores(n: int):
    """Run this process on n of its CPUs while the block runs (n = 0: as it is), so that every
    contender of a comparison has the same cores: NumPy's BLAS (``blas_threads``), PyTorch's
    pools (their thread counts) and XLA's CPU pool, which no flag bounds (its threads ran at
    1.9 CPU-seconds per second on a 2-core machine under ``--xla_cpu_multi_thread_eigen=false
    intra_op_parallelism_threads=1``, at 1.0 with the process pinned to one CPU) and which is
    sized by the CPUs the process may use when JAX starts its CPU client.  Every thread the
    process has is pinned (Linux), and the threads it starts inherit it; the block receives a
    description of what ran where, and the CPUs are given back after it."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not n or not allowed or n >= len(allowed):
        yield (f"the process's {_usable_cpus()} CPUs"
               + (", each library's default pool" if not n else
                  "" if allowed else " (not pinned: this platform has no CPU affinity)"))
        return
    try:  # whether JAX's CPU client (and its pool) exists already: JAX's own, private, test
        from jax._src.xla_bridge import backends_are_initialized
        started = backends_are_initialized()
    except (ImportError, AttributeError):
        started = None
    chosen = set(allowed[:n])
    tasks = _threads()
    for tid in tasks:
        _set_affinity(tid, chosen)
    try:
        yield (f"{n} of {len(allowed)} CPUs (the process pinned to CPU "
               f"{', '.join(map(str, sorted(chosen)))}: NumPy's BLAS, XLA's CPU pool and PyTorch "
               f"on the same core{'s' if n > 1 else ''}"
               + ("; XLA's pool was started before the pinning and shares them)" if started
                  else ")" if started is False else "; XLA's pool may predate the pinning)"))
    finally:
        for tid in _threads():
            _set_affinity(tid, set(allowed))


def _threads() -> list:
    """The ids of this process's threads (Linux: /proc/self/task), or [0] (the caller)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _set_affinity(tid: int, cpus: set) -> None:
    try:
        os.sched_setaffinity(tid, cpus)
    except OSError:  # a thread that ended meanwhile
        pass


def blas_info() -> list:
    """The BLAS libraries loaded in this process (threadpoolctl): library, version, default
    threads, threading layer and kernel ("architecture": the core type OpenBLAS runs)."""
    from threadpoolctl import threadpool_info
    keys = ("internal_api", "version", "num_threads", "threading_layer", "architecture")
    return [{k: lib.get(k) for k in keys} for lib in threadpool_info() if lib.get("user_api") == "blas"]


# OpenBLAS's core-type overrides: set, they replace the kernel it detects for the CPU
CORETYPE_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "XLA_FLAGS")


def unforced_env(env=None) -> dict:
    """A copy of env (default os.environ) without OpenBLAS's core-type overrides."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k not in CORETYPE_VARS}


def detected_blas_kernel() -> list:
    """The kernels OpenBLAS picks for this CPU by itself: blas_info() in a fresh process whose
    environment lacks CORETYPE_VARS."""
    code = "import json, numpy; from experiments import timing; print(json.dumps(timing.blas_info()))"
    done = subprocess.run([sys.executable, "-c", code], env=unforced_env(), capture_output=True,
                          text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    if done.returncode:
        return []
    return [lib.get("architecture") for lib in json.loads(done.stdout.splitlines()[-1])]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _torch_info(threads: int) -> dict:
    try:
        import torch
    except ImportError:
        return {"version": None}
    default = torch.get_num_threads()
    config = torch.__config__.show()
    blas = next((part.split("=", 1)[1] for part in config.replace(",", " ").split()
                 if part.startswith("BLAS_INFO=")), "unknown")
    return {"version": torch.__version__, "blas": blas, "default_threads": default,
            "threads": threads or default, "interop_threads": torch.get_num_interop_threads()}


# glibc malloc's settings for reuse_freed_memory: the largest mmap threshold glibc accepts on
# 64-bit machines, and a trim threshold far above any working set of the bench
MMAP_THRESHOLD, TRIM_THRESHOLD = 32 * 2 ** 20, 2 ** 30
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


def reuse_freed_memory() -> str:
    """Ask glibc's malloc to keep freed memory for the next allocation, process-wide: blocks
    up to 32 MiB come from the heap instead of fresh mmaps, and the heap's top is not handed
    back to the system.  By default, an array above the (adaptive) mmap threshold is fresh
    memory whose first writes fault each 4 KiB page in, and a NumPy step that allocates a few
    MB per step pays those faults on every step (counted by minor_faults, on a loaded 2-core
    machine: about 1800 per article-size step in a process that runs the lab alone, and about
    14 000 per large step inside the bench, where JAX's allocations have already raised
    glibc's adaptive threshold).  XLA reuses its own buffers; this gives NumPy's (and
    PyTorch's, and XLA's own mallocs) the same reuse.  Returns the setting for the header, or why it was not
    applied (not glibc)."""
    import ctypes
    import ctypes.util
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"system allocator unchanged (not glibc: {platform.system()} {platform.libc_ver()[0]})"
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and
            libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "system allocator unchanged (mallopt refused the settings)"
    return (f"glibc malloc keeps freed memory (mallopt M_MMAP_THRESHOLD {MMAP_THRESHOLD >> 20} MiB, "
            f"M_TRIM_THRESHOLD {TRIM_THRESHOLD >> 20} MiB)")


def minor_faults() -> int:
    """Page faults this process has taken so far without reading a disk (first touches of
    fresh memory, mostly)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def environment(threads: int, malloc: str = "system default", cores: str | None = None) -> dict:
    """What a timing ran on.  threads: the BLAS (and PyTorch intra-op) threads the bench sets
    (0: the libraries' defaults); malloc: the allocator setting (reuse_freed_memory's answer);
    cores: the CPUs the timings run on (``on_cores``' description).
    With OPENBLAS_CORETYPE set, 'detected_kernel' names the kernel OpenBLAS picks when it is
    unset (one extra process)."""
    import jax
    import numpy
    cpus = _usable_cpus()
    env = {"cpu": _cpu_model(), "cpus": os.cpu_count(), "machine": platform.machine(),
           "malloc": malloc,
           "load_average": [round(x, 2) for x in os.getloadavg()],
           "python": platform.python_version(), "numpy": numpy.__version__,
           "blas": blas_info(), "blas_threads": threads or "library default",
           "env": {k: os.environ[k] for k in CORETYPE_VARS + THREAD_VARS if k in os.environ},
           "jax": {"version": jax.__version__, "backend": jax.default_backend(),
                   "devices": len(jax.devices()),
                   "threads": f"its CPU pool uses the process's {cpus} "
                   f"CPU{'s' if cpus > 1 else ''}" + (
                       f" (XLA_FLAGS: {os.environ['XLA_FLAGS']})" if "XLA_FLAGS" in os.environ
                       else "")},
           "torch": _torch_info(threads), "cores": cores or f"the process's {cpus} CPUs"}
    if any(k in os.environ for k in CORETYPE_VARS):
        env["detected_kernel"] = detected_blas_kernel()
    return env


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def coretype_warning(env: dict) -> str | None:
    """A warning when OPENBLAS_CORETYPE (or OPENBLAS_L2_SIZE) is set, None otherwise."""
    forced = {k: env["env"][k] for k in CORETYPE_VARS if k in env["env"]}
    if not forced:
        return None
    running = ", ".join(str(lib.get("architecture")) for lib in env["blas"]) or "none found"
    detected = ", ".join(map(str, env.get("detected_kernel") or [])) or "unknown"
    settings = " ".join(f"{k}={v}" for k, v in forced.items())
    verdict = ("the same kernel: the setting changes nothing here" if running == detected else
               "NumPy's products may run below the CPU's own rate, so lab/peer ratios mean "
               "something else than on a machine without it")
    return (f"WARNING: {settings} forces OpenBLAS's core type: kernel in use {running}, kernel "
            f"detected with it unset {detected}; {verdict}. The training steps are also timed "
            f"with it unset (a second process).")


def machine_line(env: dict) -> str:
    """The machine, its CPUs and load average (``environment``'s answer)."""
    return (f"machine: {env['cpu']} ({env['machine']}), {env['cpus']} CPUs, load average "
            f"{' '.join(map(str, env['load_average']))} (1, 5, 15 min)")


def blas_line(env: dict) -> str:
    """The BLAS libraries NumPy loaded, each with its kernel and default threads."""
    return "BLAS: " + ("; ".join(
        f"{lib['internal_api']} {lib['version']}, kernel {lib['architecture']}, "
        f"{lib['num_threads']} threads by default ({lib['threading_layer']})"
        for lib in env["blas"]) or "none found by threadpoolctl")


def format_header(env: dict) -> str:
    """The lines the bench prints first."""
    torch = env["torch"]
    torch_line = ("not installed" if torch["version"] is None else
                  f"{torch['version']} (BLAS {torch['blas']}), intra-op threads {torch['threads']} (default "
                  f"{torch['default_threads']}), inter-op threads {torch['interop_threads']}")
    jax = env["jax"]
    lines = [machine_line(env), f"cores: {env.get('cores', 'not recorded')}",
             f"{blas_line(env)}; the bench sets {env['blas_threads']} thread(s)",
             f"malloc: {env.get('malloc', 'system default')}",
             f"numpy {env['numpy']}, python {env['python']}",
             f"jax {jax['version']} on {jax['backend']} ({jax['devices']} devices), threads: {jax['threads']}",
             f"torch: {torch_line}",
             "environment: " + (" ".join(f"{k}={v}" for k, v in env["env"].items())
                                or f"none of {', '.join(CORETYPE_VARS + THREAD_VARS)} set")]
    warning = coretype_warning(env)
    return "\n".join(lines + ([warning] if warning else []))


def matmul(xp, dtype, n: int = 1024):
    """(a zero-argument n x n by n x n product, its FLOPs): a candidate to time beside others."""
    rng = np.random.default_rng(0)
    a = xp.asarray(rng.standard_normal((n, n)).astype(dtype))
    b = xp.asarray(rng.standard_normal((n, n)).astype(dtype))
    return (lambda: a @ b), 2 * n ** 3


def xla_matmul_rate(dtype, n: int = 1024, repeats: int = 10) -> float:
    """The n x n by n x n product's rate in FLOP/s under jax.jit on the host, at XLA's own
    threads: the engine of the rounding model's float64 runs (the checker's cost follows it)."""
    import checks  # noqa: F401  (switches JAX's float64 on, as the checks run)
    import jax
    import jax.numpy as jnp
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal((n, n)), dtype) for _ in range(2))
    product = jax.jit(jnp.matmul)
    seconds = compare({"mm": lambda: product(a, b).block_until_ready()},
                      repeats=repeats, warmup=2)["mm"]
    return 2 * n ** 3 / seconds


def matmul_rate(xp, dtype, n: int = 1024, repeats: int = 10) -> float:
    """The machine's own matrix-multiply rate in FLOP/s (n x n by n x n): the practical ceiling."""
    product, flops = matmul(xp, dtype, n)
    return flops / compare({"mm": product}, repeats=repeats, warmup=2)["mm"]
