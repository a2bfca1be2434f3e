"""bench: the lab's kernels against jax.jit, in one run, with ratios (lower is better for the lab).

Measures, after warm-up, medians over interleaved repeats:
- every registered layer's forward + backward against jax.jit of the oracle's vjp;
- a full training step (forward, backward, Adam) against jax.jit(value_and_grad) of the
  reference model plus the same Adam update, at the article's size and a larger one;
- the achieved FLOP rate of the lab's step (FLOPs counted by XLA for the same step) against
  the machine's own matrix-multiply rate measured in the same run;
- the time of a whole-model gradient check and of the sqrt(d) study.
Absolute times drift on shared machines; the ratios are the result.
"""
from __future__ import annotations

import dataclasses
import json
import time

import numpy as np

from experiments import common, timing

NAME = "bench"
IN_ALL = False  # a benchmark, not a study: `python -m experiments bench` or `make bench`
LAYER_SIZES = {"B": 64, "T": 17, "S": 16, "D": 32, "H": 4, "F": 128, "V": 12}  # the article's


@dataclasses.dataclass(frozen=True)
class Config:
    backend: str = "numpy"      # numpy or cupy
    repeats: int = 30
    warmup: int = 5
    threads: int = 0            # BLAS threads for the lab's kernels; 0 = the library's default
    layers: bool = True         # also time every layer on its own
    seed: int = 0

    def __post_init__(self):
        if self.backend not in ("numpy", "cupy"):
            raise ValueError(f"backend: expected 'numpy' or 'cupy', got {self.backend!r}")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"repeats: expected >= 1 (and warmup >= 0), got {self.repeats}, {self.warmup}")
        if self.threads < 0:
            raise ValueError(f"threads: expected >= 0, got {self.threads}")


@dataclasses.dataclass
class Result:
    rows: list
    summary: str
    headlines: list


def array_module(backend):
    if backend == "cupy":
        try:
            import cupy
            cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:
            raise ValueError(f"backend: cupy was asked for, but no CUDA device answers ({exc})")
        return cupy
    return np


def layer_rows(config, xp):
    """Every registry row at the article's sizes, float32: hand fwd+bwd vs jit(vjp(oracle))."""
    import jax
    import jax.numpy as jnp

    from checks.registry import ROWS
    rows = []
    for row in common.progress(ROWS, desc="layers"):
        rng = np.random.default_rng(config.seed)
        inputs, params, static = row.case(rng, np.float32, LAYER_SIZES)
        if row.name == "model":
            continue  # the model is timed as a training step below
        dev_inputs = [xp.asarray(x) for x in inputs]
        dev_params = {k: xp.asarray(v) for k, v in params.items()}
        out, _ = row.forward(*dev_inputs, dev_params, **static)
        dout = xp.asarray(rng.standard_normal(np.shape(out)).astype(np.float32))
        diff = [i for i, x in enumerate(inputs) if np.asarray(x).dtype.kind == "f"]

        def hand():
            out, cache = row.forward(*dev_inputs, dev_params, **static)
            return row.backward(dout, cache)

        def oracle_vjp(diff_values, params, dout):
            full = list(inputs)
            for i, value in zip(diff, diff_values):
                full[i] = value
            out, vjp = jax.vjp(lambda d, p: row.oracle(*_merge(full, diff, d), p, **static),
                               diff_values, params)
            return vjp(dout)

        jitted = jax.jit(oracle_vjp)
        j_args = ([jnp.asarray(inputs[i]) for i in diff], {k: jnp.asarray(v) for k, v in params.items()},
                  jnp.asarray(np.asarray(timing.sync(dout).get() if hasattr(dout, "get") else dout)))
        with timing.blas_threads(config.threads):
            t = timing.compare({"lab": hand, "jax": lambda: jitted(*j_args)},
                               repeats=config.repeats, warmup=config.warmup)
        rows.append({"what": f"layer {row.name}", "lab_ms": 1e3 * t["lab"], "jax_ms": 1e3 * t["jax"],
                     "ratio": t["lab"] / t["jax"]})
    return rows


def _merge(full, diff, values):
    full = list(full)
    for i, value in zip(diff, values):
        full[i] = value
    return full


def format_rows(rows) -> str:
    head = f"{'what':34s} {'lab ms':>9s} {'jax.jit ms':>11s} {'lab/jax':>8s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['what']:34s} {r['lab_ms']:9.3f} {r['jax_ms']:11.3f} {r['ratio']:8.2f}"
                     if "ratio" in r else f"{r['what']:34s} {r.get('note', '')}")
    return "\n".join(lines)


def run(config: Config) -> Result:
    start = time.perf_counter()
    xp = array_module(config.backend)
    rows = []
    with timing.blas_threads(config.threads):
        ceiling = timing.matmul_rate(xp, np.float32)
    rows.append({"what": "float32 matmul 1024^3", "note": f"{ceiling / 1e9:.1f} GFLOP/s (the ceiling)"})
    if config.layers:
        rows += layer_rows(config, xp)
    table = format_rows(rows)
    print(table)
    out = common.results_dir(NAME)
    meta = {"backend": config.backend, "blas": timing.blas_info(), "matmul_flops": ceiling}
    common.atomic_write_text(out / "bench.json", json.dumps({"rows": rows, **meta}, indent=2))
    common.write_csv(out / "data.csv", [{k: r.get(k, "") for k in ("what", "lab_ms", "jax_ms", "ratio", "note")}
                                        for r in rows])
    common.write_meta(out / "meta.json", config, time.perf_counter() - start, **meta)
    return Result(rows, f"matmul ceiling {ceiling / 1e9:.1f} GFLOP/s; see results/bench/bench.json", [])
