"""The lab's second numerical configuration: run a command under it, or print it.

    python scripts/alt_numerics.py                  # NAME=VALUE lines
    python scripts/alt_numerics.py -- CMD [ARGS]    # run CMD with them added to the environment

`make test-alt` runs the fast suite under it, and CI runs it beside the default one.  It changes
the rounding of the same programs without changing their maths, so a test that pins digits of
rounding noise fails on the developer's machine instead of on a user's:

- NumPy's SIMD dispatch limited to its baseline (``NPY_DISABLE_CPU_FEATURES`` lists every
  dispatch target this CPU would otherwise use): NumPy's sums and element-wise loops then run
  narrower vectors, which changes their summation order;
- XLA's CPU code generation limited to SSE4.2 on x86-64 (``--xla_cpu_max_isa``): the oracle's and
  the rounding model's reductions are vectorised differently;
- XLA's newer CPU emitters for fused element-wise work (``--xla_cpu_use_fusion_emitters=true``,
  XLA's default, which the fast suite turns off to compile faster): their loops and vector
  widths differ from the older emitters';
- one BLAS thread (``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS``), so products are blocked for one
  core.

It leaves ``OPENBLAS_CORETYPE`` alone: some machines set it so that their OpenBLAS runs
correctly, and tests and CI must not change it.
"""
from __future__ import annotations

import os
import platform
import sys


def alt_environment() -> dict[str, str]:
    from numpy._core import _multiarray_umath as umath      # NumPy >= 2: where the CPU tables live
    enabled = [t for t in umath.__cpu_dispatch__ if umath.__cpu_features__.get(t)]
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if enabled:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(enabled)
    if platform.machine().lower() in ("x86_64", "amd64"):
        env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_max_isa=SSE4_2").strip()
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
                        + " --xla_cpu_use_fusion_emitters=true").strip()
    return env


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--"] and argv[1:]:
        env = {**os.environ, **alt_environment()}
        print("second numerical configuration: " + ", ".join(
            f"{k}={v}" for k, v in alt_environment().items()), file=sys.stderr, flush=True)
        os.execvpe(argv[1], argv[1:], env)
    for name, value in alt_environment().items():
        print(f"{name}={value}")
