"""bench: the lab's kernels against jax.jit, in one run, with ratios (lower is better for the lab).

Measures, after warm-up, medians over interleaved repeats:
- every registered layer's forward + backward against jax.jit of the oracle's vjp;
- a full training step (forward, backward, Adam) against jax.jit(value_and_grad) of the
  reference model plus the same Adam update, at the article's size and a larger one;
- the achieved FLOP rate of the lab's step (FLOPs counted by XLA for the same step) against
  the machine's own matrix-multiply rate measured in the same run;
- the checker's own cost (experiments.checker_cost, fresh processes): one layer check first and
  warm, with and without the persistent compilation cache, against torch.autograd.gradcheck and
  jax.test_util.check_grads, and the whole-model check's time and peak memory at two sizes;
- the time of the sqrt(d) study.
Absolute times drift on shared machines; the ratios are the result, each with its 95 %
interval over the interleaved loop's rounds (timing.median_ratio_interval), and a target is met
when the intervals lie on its side.  The header says what they
were measured on (timing.environment): the BLAS library and kernel, threads, JAX and PyTorch.
With OPENBLAS_CORETYPE (or OPENBLAS_L2_SIZE) set, a warning says so and the training steps are
timed a second time in a process without them, so the ratios under both settings are shown.
By default glibc's malloc is asked to keep freed memory (timing.reuse_freed_memory, printed in
the header; --no-reuse-memory leaves the system's setting): without it every fresh array above
malloc's mmap threshold faults its pages in, on every step, for the lab, JAX and PyTorch alike;
each step row counts the lab's page faults per step.
Every contender runs on the same cores (--threads, default 1; timing.on_cores): the lab's BLAS
threads, PyTorch's intra-op threads, and the process pinned to that many CPUs while the timings
run, since XLA sizes its CPU pool by the CPUs the process may use and no flag bounds it.  With
--threads 0 each library keeps its default (XLA's pool and OpenBLAS on every core).  The
checker's rows run afterwards in fresh processes on every CPU.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import ClassVar

import numpy as np

from experiments import checker_cost, common, shares, timing

NAME = "bench"
LAYER_SIZES = {"B": 64, "T": 17, "S": 16, "D": 32, "H": 4, "F": 128, "V": 12}  # the article's
# Training-step sizes: the article's, and a larger one (B batch, T tokens per sequence).
STEP_SIZES = {"article": dict(B=64, T=16, D=32, H=4, F=128, V=12),
              "large": dict(B=32, T=64, D=256, H=8, F=1024, V=12)}


@dataclasses.dataclass(frozen=True)
class Config:
    CHOICES: ClassVar[dict] = {"backend": ("numpy", "cupy"), "dtype": ("float32", "float64")}
    backend: str = "numpy"      # array library the lab's kernels run on
    repeats: int = 30           # timed repeats of each candidate (the median is reported)
    warmup: int = 5             # untimed runs before timing
    threads: int = 1            # cores of every contender: the lab's BLAS and PyTorch's threads, and the process pinned to that many CPUs (XLA's pool); 0 = each library's default
    sizes: tuple[str, ...] = ("article", "large")  # training-step sizes to time
    dtype: str = "float32"      # floating-point type of the timed steps
    layers: bool = True         # also time every layer on its own
    peers: bool = True          # also time PyTorch eager and torch.compile (when installed)
    shares: bool = True         # also time each layer's share of the lab's training step
    checker: bool = True        # also time the checker against gradcheck and check_grads, and the whole-model check's time and memory
    extras: bool = True         # also time the sqrt(d) study
    half: bool = True           # also time the model in float16 and bfloat16 against float32
    reuse_memory: bool = True   # glibc malloc keeps freed memory for reuse, process-wide (timing.reuse_freed_memory)
    write_docs: bool = False    # write the header, the training steps' tables and their shares into README.md (section 'bench-steps')
    seed: int = 0               # seed of the inputs and parameters

    def __post_init__(self):
        if self.backend not in ("numpy", "cupy"):
            raise ValueError(f"backend: expected 'numpy' or 'cupy', got {self.backend!r}")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"repeats: expected >= 1 (and warmup >= 0), got {self.repeats}, {self.warmup}")
        if self.threads < 0:
            raise ValueError(f"threads: expected >= 0, got {self.threads}")
        unknown = [name for name in self.sizes if name not in STEP_SIZES]
        if unknown:
            raise ValueError(f"sizes: expected names from {sorted(STEP_SIZES)}, got {unknown}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype: expected float32 or float64, got {self.dtype!r}")


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
    for row in common.progress([r for r in ROWS if r.name != "model"], desc="layers"):
        # (the model is timed as a whole training step)
        rng = np.random.default_rng(config.seed)
        inputs, params, static = row.case(rng, np.float32, LAYER_SIZES)
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


class LabStep:
    """The lab's training step (forward, backward, Adam) at one of STEP_SIZES, on its own state."""

    def __init__(self, config, xp, name, dtype=None):
        from kernels import model
        s = STEP_SIZES[name]
        self.sizes, self.dtype = s, np.dtype(dtype or config.dtype)
        mcfg = model.ModelConfig(D=s["D"], H=s["H"], F=s["F"], V=s["V"])
        rng = np.random.default_rng(config.seed)
        self.src = rng.integers(0, s["V"] - 2, (s["B"], s["T"]))
        self.tgt = rng.integers(0, s["V"] - 2, (s["B"], s["T"]))
        self.embedding = model.embedding_table(mcfg, self.dtype)
        self.host_params = model.init_params(mcfg, seed=config.seed, dtype=self.dtype)
        from kernels.optim import adam_init
        params = {k: xp.asarray(v) for k, v in self.host_params.items()}
        self.d_src, self.d_tgt, self.d_emb = xp.asarray(self.src), xp.asarray(self.tgt), \
            xp.asarray(self.embedding)
        self.state = {"params": params, "adam": adam_init(params)}

    def forward_backward(self):
        from kernels import model
        self.loss, cache = model.model_forward(self.d_src, self.d_tgt, self.state["params"],
                                               embedding=self.d_emb)
        return model.model_backward(self.dtype.type(1), cache)[1]

    def adam(self, grads):
        from kernels.optim import adam_step
        self.state["params"], self.state["adam"] = adam_step(self.state["params"], grads,
                                                             self.state["adam"], 1e-3)
        return self.state["params"]

    def __call__(self):
        self.adam(self.forward_backward())
        return self.loss


def jax_step_runner(step: LabStep):
    """jax.jit(value_and_grad) of the reference model plus the same Adam update, compiled;
    returns (run, FLOPs per step counted by XLA)."""
    import jax
    import jax.numpy as jnp

    import reference
    dtype, embedding = step.dtype, step.embedding

    def jax_step(params, m, v, t, src, tgt):
        loss, g = jax.value_and_grad(lambda p: reference.model(src, tgt, p, embedding=embedding))(params)
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        c1, c2 = 1 / (1 - 0.9 ** t), 1 / (1 - 0.999 ** t)
        params = jax.tree_util.tree_map(lambda p, m, v: p - 1e-3 * (m * c1) / (jnp.sqrt(v * c2) + 1e-8),
                                        params, m, v)
        return params, m, v, t + 1, loss

    host = {k: jnp.asarray(v) for k, v in step.host_params.items()}
    zeros = jax.tree_util.tree_map(jnp.zeros_like, host)
    jstate = [host, zeros, zeros, jnp.asarray(1.0, dtype), jnp.asarray(step.src), jnp.asarray(step.tgt)]
    compiled = jax.jit(jax_step).lower(*jstate).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float(cost.get("flops", float("nan"))) if cost else float("nan")

    def run():
        jstate[:4] = compiled(*jstate)[:4]
        return jstate[0]
    return run, flops


FAULT_STEPS = 5  # lab steps run after the timing to count their page faults


def step_row(config, xp, name):
    """One training step of the lab against the jitted JAX step and, when PyTorch is installed
    (and the lab runs on NumPy), PyTorch eager and torch.compile: one interleaved measurement."""
    from experiments import peers_torch
    step = LabStep(config, xp, name)
    jax_run, flops = jax_step_runner(step)
    candidates, notes = {"lab": step, "jax": jax_run}, {}
    if config.backend != "numpy":
        notes["torch"] = "PyTorch peers time the NumPy backend only"
    elif not config.peers:
        notes["torch"] = "PyTorch peers off (--no-peers)"
    elif not peers_torch.available():
        notes["torch"] = peers_torch.INSTALL_HINT
    else:
        peers, notes = peers_torch.step_candidates(step.host_params, step.src, step.tgt,
                                                   step.embedding, threads=config.threads)
        candidates.update(peers)
    candidates["matmul"], mm_flops = timing.matmul(xp, np.float32)  # the rate, in the same loop
    with timing.blas_threads(config.threads):
        samples = timing.compare_samples(candidates, repeats=config.repeats, warmup=config.warmup)
        t = {name: float(np.median(ts)) for name, ts in samples.items()}
        faults = timing.minor_faults()
        for _ in range(FAULT_STEPS):
            step()
        faults = (timing.minor_faults() - faults) / FAULT_STEPS
    s = step.sizes
    return {"what": f"training step, {name} " + " ".join(f"{k}{v}" for k, v in s.items()),
            "size": name, "lab_ms": 1e3 * t["lab"], "jax_ms": 1e3 * t["jax"],
            "ratio": t["lab"] / t["jax"], "flops": flops, "lab_flops_per_s": flops / t["lab"],
            "matmul_flops_per_s": mm_flops / t["matmul"], "lab_faults_per_step": faults,
            "repeats": config.repeats,  # 95 % intervals over the loop's rounds (timing.CONFIDENCE)
            "ratio_interval": timing.median_ratio_interval(samples["lab"], samples["jax"]),
            "rate_share_interval": tuple(flops / mm_flops * v for v in timing.median_ratio_interval(
                samples["matmul"], samples["lab"])),
            "peers_ms": {k: 1e3 * v for k, v in t.items() if k not in ("lab", "jax", "matmul")},
            "peer_notes": notes}


def extras_rows(config):
    """A single timing of the sqrt(d) study at defaults."""
    from experiments import sqrt_d
    start = time.perf_counter()
    sqrt_d.run(sqrt_d.Config())
    return [{"what": "sqrt(d) study at defaults", "note": f"{time.perf_counter() - start:.2f} s"}]


HALF_FORMATS = ("float32", "float16", "bfloat16")


def half_rows(config, xp, n=256):
    """The model's forward and backward (NumPy) in float16 and bfloat16 against float32 at each
    step size, interleaved in one loop; and an n x n bfloat16 product as the kernels compute it
    (a float32 BLAS product of the exactly upcast operands, rounded once: kernels.precision)
    against NumPy's own bfloat16 arithmetic (ml_dtypes' element loops, no BLAS)."""
    from kernels.precision import BFLOAT16, COMPUTE
    rows = []
    if xp is not np:
        return [{"what": "half precision", "note": "timed on the NumPy backend only"}]
    for name in config.sizes:
        steps = {dt: LabStep(config, xp, name, dtype=dt) for dt in HALF_FORMATS}
        with timing.blas_threads(config.threads):
            t = timing.compare({dt: step.forward_backward for dt, step in steps.items()},
                               repeats=config.repeats, warmup=config.warmup)
        for dt in HALF_FORMATS[1:]:
            rows.append({"what": f"{name} fwd+bwd {dt} / float32",
                         "note": f"{1e3 * t[dt]:.2f} ms against {1e3 * t['float32']:.2f} ms: "
                                 f"{t[dt] / t['float32']:.2f}x"})
    rng = np.random.default_rng(config.seed)
    a, b = (rng.standard_normal((n, n)).astype(BFLOAT16) for _ in range(2))
    with timing.blas_threads(config.threads):
        t = timing.compare({"upcast": lambda: (a.astype(COMPUTE) @ b.astype(COMPUTE)).astype(BFLOAT16),
                            "native": lambda: a @ b}, repeats=max(3, config.repeats // 10),
                           warmup=1)
    rows.append({"what": f"bfloat16 matmul {n}^3",
                 "note": f"as the kernels run it {1e3 * t['upcast']:.2f} ms, NumPy's own bfloat16 "
                         f"product {1e3 * t['native']:.2f} ms (own / kernels' "
                         f"{t['native'] / t['upcast']:.2f})"})
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
        if "ratio" in r and r.get("note"):
            lines.append(f"{'':34s} {r['note']}")
    return "\n".join(lines)


PEERS = ("torch eager", "torch.compile")
# targets of the lab's step: size -> (most lab/jax, least fraction of the matmul rate)
TARGETS = {"article": (0.5, None), "large": (0.9, 0.80)}


def format_steps(steps) -> str:
    """Every training-step time and ratio in one table; floor = FLOPs at the matmul rate
    measured in the same interleaved loop."""
    names = ("lab", "jax.jit") + PEERS + ("floor",)
    head = f"{'step':8s}" + "".join(f" {n + ' ms':>16s}" for n in names) + \
        "".join(f" {'lab/' + n:>18s}" for n in names[1:])
    lines = [head, "-" * len(head)]
    for r in steps:
        ms = {"lab": r["lab_ms"], "jax.jit": r["jax_ms"], **r["peers_ms"],
              "floor": 1e3 * r["flops"] / r["matmul_flops_per_s"]}
        cell = lambda v, fmt: f"{v:{fmt}}" if v is not None else "-"
        lines.append(f"{r['size']:8s}" + "".join(f" {cell(ms.get(n), '.3f'):>16s}" for n in names)
                     + "".join(f" {cell(ms['lab'] / ms[n] if n in ms else None, '.2f'):>18s}"
                               for n in names[1:]))
    notes = {k: v for r in steps for k, v in r["peer_notes"].items()}
    lines += [f"  {k}: {v}" for k, v in notes.items()]
    return "\n".join(lines)


def _verdict(r, most, rate) -> str:
    """'met' when the intervals (timing.median_ratio_interval) lie on the target's side,
    'NOT met' when a median misses it, and otherwise 'met by the medians only' (the loop's own
    noise reaches past the target).  A row without intervals is judged by its medians."""
    frac = r["lab_flops_per_s"] / r["matmul_flops_per_s"]
    if r["ratio"] > most or (rate is not None and frac < rate):
        return "NOT met"
    worst_ratio = r.get("ratio_interval", (r["ratio"],) * 2)[1]
    worst_share = r.get("rate_share_interval", (frac,) * 2)[0]
    if worst_ratio <= most and (rate is None or worst_share >= rate):
        return "met"
    return "met by the medians only (their intervals reach past the target)"


def _with_interval(value, interval, fmt) -> str:
    return (f"{value:{fmt}}" if interval is None else
            f"{value:{fmt}} [{interval[0]:{fmt}}, {interval[1]:{fmt}}]")


def target_lines(steps) -> list:
    """Whether each size meets its target (``_verdict``), with the intervals of its figures,
    and what bounds it when it does not."""
    lines = []
    for r in steps:
        if r["size"] not in TARGETS:
            continue
        most, rate = TARGETS[r["size"]]
        frac = r["lab_flops_per_s"] / r["matmul_flops_per_s"]
        floor_ms = 1e3 * r["flops"] / r["matmul_flops_per_s"]
        verdict = _verdict(r, most, rate)
        ok = verdict == "met"
        want = f"lab/jax <= {most}" + (f" at >= {rate:.0%} of the matmul rate" if rate else "")
        line = (f"target {r['size']}: {want}: {verdict} "
                f"(lab/jax {_with_interval(r['ratio'], r.get('ratio_interval'), '.2f')}, "
                f"{_with_interval(frac, r.get('rate_share_interval'), '.0%')} of the matmul rate"
                + (f"; {timing.CONFIDENCE:.0%} intervals over the loop's {r['repeats']} rounds"
                   if "ratio_interval" in r else ""))
        if not ok:
            line += (f"; bound: the floor is {floor_ms:.2f} ms = {floor_ms / r['jax_ms']:.2f} of "
                     f"jax's step and the lab takes {r['lab_ms'] / floor_ms:.1f}x the floor: its "
                     f"products are smaller than 1024^3 and run below that rate, and the "
                     f"element-wise work and Python calls come on top (the shares below)")
        lines.append(line + ")")
    return lines


def step_rows(config, xp) -> list:
    """The training-step rows at every size of config.sizes."""
    steps = []
    for name in common.progress(config.sizes, desc="training steps"):
        row = step_row(config, xp, name)
        rate = row["matmul_flops_per_s"]
        row["note"] = (f"lab at {row['lab_flops_per_s'] / 1e9:.1f} GFLOP/s = "
                       f"{row['lab_flops_per_s'] / rate:.0%} of the matmul rate measured in the "
                       f"same loop ({rate / 1e9:.1f} GFLOP/s; {row['flops'] / 1e6:.0f} MFLOP per "
                       f"step, counted by XLA); {row['lab_faults_per_step']:.0f} page faults per "
                       f"lab step")
        steps.append(row)
    return steps


def _steps_here(config_fields: dict) -> dict:
    """The child's side of unforced_steps: its environment and its step rows."""
    config = Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in config_fields.items()})
    with timing.on_cores(config.threads) as cores:
        return {"environment": timing.environment(config.threads, _allocator(config), cores),
                "steps": step_rows(config, array_module(config.backend))}


def unforced_steps(config) -> dict:
    """The training steps timed again in a fresh process without OpenBLAS's core-type overrides
    (timing.CORETYPE_VARS): {"environment": ..., "steps": [...]}, or {"error": ...}."""
    code = ("import json, sys; from experiments import bench; "
            "print(json.dumps(bench._steps_here(json.loads(sys.argv[1]))))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code, json.dumps(dataclasses.asdict(config))],
                          env=timing.unforced_env(), capture_output=True, text=True, cwd=root)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _allocator(config) -> str:
    """The allocator setting of this process: reuse_freed_memory's answer, or the default."""
    return timing.reuse_freed_memory() if config.reuse_memory else "system default (--no-reuse-memory)"


DOCS_SECTION = "bench-steps"  # the README's generated section (--write-docs)


def write_steps_section(header: str, steps_text: list, seconds: float) -> None:
    """The README's speed tables as this run printed them: the command, the date, the header
    (machine, BLAS kernel and threads, versions), the training steps' ratios and targets and
    where the lab's step goes."""
    from checks.docs import README, write_run
    argv = [a for a in sys.argv[1:] if a != "--write-docs"]
    when = f"{time.strftime('%Y-%m-%d')}; the steps and their shares measured in {seconds:.0f} s"
    write_run(README, DOCS_SECTION, "python -m experiments " + " ".join(argv or ["bench"]),
              "\n".join([when, header, "", *steps_text]))


def run(config: Config) -> common.Result:
    start = time.perf_counter()
    xp = array_module(config.backend)
    with timing.on_cores(config.threads) as cores:  # before JAX starts its CPU pool
        environment = timing.environment(config.threads, _allocator(config), cores)
        header = timing.format_header(environment)
        print(header, flush=True)
        rows = []
        with timing.blas_threads(config.threads):
            ceiling = timing.matmul_rate(xp, np.float32)
        rows.append({"what": "float32 matmul 1024^3", "note": f"{ceiling / 1e9:.1f} GFLOP/s (alone, "
                     f"before the steps; each step's loop measures it again)"})
        steps = step_rows(config, xp)
        rows += steps
        unforced = unforced_steps(config) if timing.coretype_warning(environment) else None
        shares_by_size = {}
        if config.shares:
            for name in common.progress(config.sizes, desc="layer shares"):
                step = LabStep(config, xp, name)
                with timing.blas_threads(config.threads):
                    shares_by_size[name] = shares.measure(
                        (step.forward_backward, step.adam), repeats=config.repeats,
                        warmup=config.warmup, sync=None if xp is np else timing.sync)
        if config.layers:
            rows += layer_rows(config, xp)
        if config.extras:
            rows += extras_rows(config)
        if config.half:
            rows += half_rows(config, xp)
    cost = checker_cost.measure(peers=config.peers) if config.checker else None
    forced = " ".join(f"{k}={v}" for k, v in environment["env"].items() if k in timing.CORETYPE_VARS)
    text = [format_rows(rows), "", "training steps, every ratio (lower is better for the lab; "
            "floor: XLA's FLOP count at the matmul rate of the same loop)"
            + (f", with {forced} (this process)" if unforced else ""), format_steps(steps),
            *target_lines(steps)]
    if unforced and "error" in unforced:
        text += ["", f"training steps with {forced} unset: the second process failed: "
                 f"{unforced['error']}"]
    elif unforced:
        kernels = ", ".join(str(lib["architecture"]) for lib in unforced["environment"]["blas"])
        text += ["", f"training steps with {forced} unset (a second process, kernel {kernels})",
                 format_steps(unforced["steps"]), *target_lines(unforced["steps"])]
    if shares_by_size:
        text += ["", "where the lab's step goes (kernels timed inside the real step; medians)",
                 shares.format_shares(shares_by_size)]
    if config.write_docs:
        write_steps_section(header, text, time.perf_counter() - start)
    if cost:
        text += ["", "the checker's own cost (fresh processes; 'cached': a second process reading "
                 "the persistent compilation cache the first wrote)", checker_cost.format_cost(cost),
                 "", checker_cost.format_stages(cost), *checker_cost.target_lines(cost)]
    print("\n".join(text))
    out = common.results_dir(NAME)
    meta = {"backend": config.backend, "blas": timing.blas_info(), "matmul_flops": ceiling,
            "environment": environment, "header": header, "unforced": unforced, "checker": cost}
    shares_json = {n: {" ".join(k).strip(): v for k, v in m.items()}
                   for n, m in shares_by_size.items()}
    common.atomic_write_text(out / "bench.json", json.dumps(
        {"rows": rows, "shares_s": shares_json, **meta}, indent=2))
    common.write_csv(out / "data.csv", [{k: r.get(k, "") for k in ("what", "lab_ms", "jax_ms", "ratio", "flops", "note")}
                                        for r in rows])
    common.write_meta(out / "meta.json", config, time.perf_counter() - start, **meta)
    summary = "; ".join(f"{r['size']} step lab/jax {r['ratio']:.2f}" for r in steps)
    return common.Result(f"{summary}; matmul ceiling {ceiling / 1e9:.1f} GFLOP/s", rows=rows)
