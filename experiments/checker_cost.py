"""The checker's own cost, as bench rows: one layer check against PyTorch's ``gradcheck`` and
JAX's ``check_grads`` on the same layer and inputs, and the whole-model check's time and memory.

Every figure comes from a fresh process, so a "first call" includes JAX's tracing and
compilation and a peak is that process's own maximum resident memory (``ru_maxrss``):

* layer (self-attention, float64, the registry's row ``mha``) at LAYER_SIZES: ``check_layer``
  first call and warm (a second call), in a process with an empty persistent compilation cache
  (checks.jax_cache), then the first call again in CACHED_RUNS later processes that read it
  (their median, the figure the target judges, and their range: on a shared machine one
  process's first call moves by a fifth between runs); ``gradcheck`` in its default
  (full Jacobian) and fast mode on the PyTorch twin of the layer (experiments.peers_torch), when
  PyTorch is installed; ``check_grads`` (order 1, reverse mode) on the JAX oracle, first and warm.
* whole model (registry row ``model``, MODEL_DTYPE) at MODEL_SIZES: the registry's size and
  the bench's large training step (B 32, T 64, D 256, H 8, F 1024: ``checks.registry.model_at``,
  the row's own widths being D 6, H 2, F 8): the time of a first process with empty caches
  (tracing and compiling the oracle and the rounding model) and of a second one reading what
  the first wrote (the figure the table's other columns, the stages and the target are of: a
  check run again, as a user's test suite runs it), the larger of their peak memories, both
  verdicts and the machine's load average (1 min) before and after.  Both in a cache folder
  of their own, so the figures do not depend on what the user's cache holds.  The large check
  runs again with its kinks' moves run whether needed or not (KINKS_RUN; a passing check
  defers them: ``checks.engine``), so the table shows what deferring saves.  A child whose
  resident memory passes MEMORY_CAP or whose time passes TIME_CAP is stopped (the machine is
  shared) and reported so.
* the machine's XLA float64 product rate: the rounding model's runs are float64 XLA programs.

``python -m experiments.checker_cost [--no-peers] [--no-layer]`` prints the tables alone.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

# sizes of the layer check: the registry's defaults, and a larger attention layer
LAYER_SIZES = {"registry": {}, "larger": {"B": 4, "T": 32, "S": 32, "D": 64, "H": 4}}
# sizes of the whole-model check: the registry's, and the bench's large training step
# (experiments/bench.py); the row fixes its widths (D 6, H 2, F 8, V 4) and rejects other D, H,
# F on the command line, so the large size runs the row at the bench's (registry.model_at)
MODEL_SIZES = {"registry": {}, "large": {"B": 32, "T": 64, "D": 256, "H": 8, "F": 1024}}
CACHED_RUNS = 5  # later processes timing the first call with the persistent cache filled
WIDTHS = ("D", "H", "F")
KINKS_RUN = "large, kinks run"  # the large check again with its kinks' moves run, needed or not
MODEL_DTYPE = "float32"
MEMORY_CAP = 16 * 2 ** 30  # bytes of resident memory a child may reach before it is stopped
TIME_CAP = 600.0           # seconds a child may run before it is stopped (the target is 30 s:
#                            a check 20x over it is reported as such, not waited for)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _peak_bytes() -> int:
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else 1024 * peak  # Linux counts kB


def _seconds(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


# --- what the child processes run ----------------------------------------------------------

def layer_check_times(sizes: dict, peers: bool = True, warm: bool = True) -> dict:
    """check_layer first and (warm) a second call; with peers, also check_grads and gradcheck
    (both modes)."""
    import checks  # noqa: F401  (x64 and the persistent cache, as every check starts)
    from checks.registry import BY_NAME, run_row
    row = BY_NAME["mha"]
    first, report = _seconds(lambda: run_row(row, np.float64, sizes=sizes))
    out = {"check_layer_first": first, "check_layer_ok": report.ok}
    if warm:
        out["check_layer_warm"], _ = _seconds(lambda: run_row(row, np.float64, sizes=sizes))
    if peers:
        inputs, params, _ = row.case(np.random.default_rng(0), np.float64, sizes)
        out.update(_check_grads_times(row.oracle, inputs[0], params))
        out.update(_gradcheck_times(inputs[0], params))
    return out


def _check_grads_times(oracle, x, params) -> dict:
    import jax.numpy as jnp
    from jax.test_util import check_grads
    names = sorted(params)
    args = (jnp.asarray(x), *(jnp.asarray(params[k]) for k in names))

    def run():
        try:
            check_grads(lambda x, *w: oracle(x, dict(zip(names, w))), args, order=1, modes=("rev",))
            return True
        except AssertionError:
            return False
    first, ok = _seconds(run)
    warm, _ = _seconds(run)
    return {"check_grads_first": first, "check_grads_warm": warm, "check_grads_ok": ok}


def _gradcheck_times(x, params) -> dict:
    from experiments import peers_torch
    if not peers_torch.available():
        return {"gradcheck_note": peers_torch.INSTALL_HINT}
    import torch
    names = sorted(params)
    args = tuple(torch.tensor(np.asarray(a), requires_grad=True)
                 for a in (x, *(params[k] for k in names)))

    def layer(x, *w):
        return peers_torch.attention(x, x, dict(zip(names, w)))
    out = {}
    for mode, fast in (("gradcheck", False), ("gradcheck_fast", True)):
        out[mode], out[mode + "_ok"] = _seconds(lambda: torch.autograd.gradcheck(
            layer, args, fast_mode=fast, raise_exception=False))
    return out


def model_check_cost(sizes: dict, dtype: str = MODEL_DTYPE, defer_kinks: bool = True) -> dict:
    """The whole-model check's seconds, verdict, this process's peak resident memory, the load
    average (1 min) before and after, and where its time went (``LayerCheck.seconds``: the
    oracle, the hand, the rounding model's spreads and kinks, the legs, the diagnosis) with the
    rounding model's size (samples per part, recorded elements, predicate elements flipped).
    defer_kinks=False runs the kinks' moves with the spreads, needed or not (what they cost)."""
    import checks  # noqa: F401
    from checks.registry import layer_check, model_at
    row = model_at(**{k: v for k, v in sizes.items() if k in WIDTHS})
    sizes = {k: v for k, v in sizes.items() if k not in WIDTHS}
    load = os.getloadavg()[0]
    check = layer_check(row, np.dtype(dtype), sizes=sizes)
    check.defer_kinks = defer_kinks
    seconds, report = _seconds(check.run)
    return {"seconds": seconds, "ok": report.ok, "peak_bytes": _peak_bytes(), "dtype": dtype,
            "load": [load, os.getloadavg()[0]], "failed": report.failing,
            "stages": check.seconds, "samples": getattr(check.ref, "samples", None),
            "elements": getattr(check.ref, "elements", None), "flipped": check.flipped}


# --- the parent's side ----------------------------------------------------------------------

def _rss(pid) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next(1024 * int(line.split()[1]) for line in handle if line.startswith("VmRSS"))
    except (OSError, StopIteration):
        return 0


def in_child(function: str, env=None, **kwargs) -> dict:
    """checker_cost.function(**kwargs) in a fresh process: its JSON result, or {"error": ...}
    (also when its resident memory passes MEMORY_CAP, polled where /proc exists, or its time
    passes TIME_CAP)."""
    code = ("import json, sys; from experiments import checker_cost as c; "
            f"print(json.dumps(c.{function}(**json.loads(sys.argv[1]))))")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([sys.executable, "-c", code, json.dumps(kwargs)], cwd=ROOT,
                                 env=env, stdout=out, stderr=err, text=True)
        peak, start = 0, time.perf_counter()
        while child.poll() is None:
            peak = max(peak, _rss(child.pid))
            stop = None
            if peak > MEMORY_CAP:
                stop = f"stopped above {MEMORY_CAP / 2 ** 30:.3g} GiB of memory"
            elif time.perf_counter() - start > TIME_CAP:
                stop = f"stopped after {TIME_CAP:.3g} s"
            if stop:
                child.kill()
                child.wait()
                return {"error": stop}
            time.sleep(0.1)
        out.seek(0), err.seek(0)
        if child.returncode:
            return {"error": (err.read().strip().splitlines() or ["no output"])[-1]}
        return json.loads(out.read().strip().splitlines()[-1])


@contextlib.contextmanager
def _own_cache():
    """The environment of children that share a persistent cache folder, empty at first."""
    with tempfile.TemporaryDirectory(prefix="gradlab-cost-cache-") as cache:
        env = {**os.environ, "GRADLAB_JAX_CACHE": cache}
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        yield env


def measure(peers: bool = True, layer_sizes=LAYER_SIZES, model_sizes=MODEL_SIZES,
            kinks_run: bool = True) -> dict:
    """Every figure of the module docstring: {"layer": {size: {...}}, "model": {size: {...}}}."""
    layer = {}
    for name, sizes in layer_sizes.items():
        with _own_cache() as env:  # an empty persistent cache, then a full one
            layer[name] = in_child("layer_check_times", env, sizes=sizes, peers=peers)
            again = [in_child("layer_check_times", env, sizes=sizes, peers=False, warm=False)
                     for _ in range(CACHED_RUNS)]
            runs = [a.get("check_layer_first", float("nan")) for a in again]
            layer[name]["check_layer_first_cached_runs"] = runs
            layer[name]["check_layer_first_cached"] = float(np.median(runs))
            layer[name]["check_layer_ok"] = layer[name].get("check_layer_ok", False) and all(
                a.get("check_layer_ok", False) for a in again)
    model = {}
    with _own_cache() as env:  # each size from empty caches, then again reading them
        for name, sizes in model_sizes.items():
            first = in_child("model_check_cost", env, sizes=sizes)
            model[name] = in_child("model_check_cost", env, sizes=sizes)
            model[name]["first_seconds"] = first.get("seconds")  # None: the first failed ("-")
            if "peak_bytes" in model[name]:  # the larger peak of the two: compiling takes memory
                model[name]["peak_bytes"] = max(model[name]["peak_bytes"],
                                                first.get("peak_bytes", 0))
                model[name]["ok"] = model[name]["ok"] and first.get("ok", False)
        if kinks_run and "large" in model_sizes:  # what the deferred kinks' moves would cost
            model[KINKS_RUN] = in_child("model_check_cost", env, sizes=model_sizes["large"],
                                        defer_kinks=False)
    from experiments.timing import xla_matmul_rate
    return {"layer": layer, "model": model, "xla_float64_flops": xla_matmul_rate(np.float64)}


def _size_text(name, sizes, base) -> str:
    return f"{name} (" + " ".join(f"{k} {v}" for k, v in {**base, **sizes}.items()) + ")"


def format_cost(cost: dict) -> str:
    """Two tables: the layer check against its peers, the whole-model check's time and memory."""
    from checks.registry import BY_NAME, DEFAULT_SIZES

    base = {k: DEFAULT_SIZES[k] for k in ("B", "T", "S", "D", "H")}
    cols = (("check_layer first", "check_layer_first", "check_layer_ok"),
            ("first, cached", "check_layer_first_cached", "check_layer_ok"),
            ("check_layer warm", "check_layer_warm", "check_layer_ok"),
            ("gradcheck", "gradcheck", "gradcheck_ok"),
            ("gradcheck fast", "gradcheck_fast", "gradcheck_fast_ok"),
            ("check_grads first", "check_grads_first", "check_grads_ok"),
            ("check_grads warm", "check_grads_warm", "check_grads_ok"))

    def cell(r, key, ok):  # seconds, and FAILED when that check did not pass
        return "-" if key not in r else f"{r[key]:.3f} s" + ("" if r.get(ok, True) else " FAILED")

    head = f"{'self-attention, float64':44s}" + "".join(f" {c:>18s}" for c, _, _ in cols)
    lines = [head, "-" * len(head)]
    for name, r in cost["layer"].items():
        label = _size_text(name, LAYER_SIZES[name], base)
        if "error" in r:
            lines.append(f"{label:44s} {r['error']}")
            continue
        lines.append(f"{label:44s}" + "".join(f" {cell(r, key, ok):>18s}" for _, key, ok in cols))
        if r.get("gradcheck_note"):
            lines.append(f"  gradcheck: {r['gradcheck_note']}")
    cached = {name: r["check_layer_first_cached_runs"] for name, r in cost["layer"].items()
              if r.get("check_layer_first_cached_runs")}
    if cached:
        n = len(next(iter(cached.values())))
        lines.append(f"first, cached: the median of {n} later processes (their range: "
                     + ", ".join(f"{_span(runs)} {name}" for name, runs in cached.items()) + ")")
    lines += ["", f"{'whole-model check, ' + MODEL_DTYPE:44s} {'first, empty caches':>20s}"
                  f" {'time, cached':>14s} {'peak memory':>14s} {'load average':>14s}"]
    widths = {k: v for k, v in BY_NAME["model"].fixed.items() if k in ("D", "H", "F")}
    for name, r in cost["model"].items():
        sizes = MODEL_SIZES["large"] if name == KINKS_RUN else MODEL_SIZES.get(name, {})
        label = _size_text(name, sizes,
                           {**{k: DEFAULT_SIZES[k] for k in ("B", "T")}, **widths})
        load = "-" if "load" not in r else "%.1f, %.1f" % tuple(r["load"])
        first = "-" if r.get("first_seconds") is None else f"{r['first_seconds']:.1f} s"
        lines.append(f"{label:44s} " + (r["error"] if "error" in r else
                     f"{first:>20s} {r['seconds']:12.1f} s {r['peak_bytes'] / 2 ** 30:10.2f} GiB"
                     f" {load:>14s}"
                     + ("" if r["ok"] else "  FAILED: " + ", ".join(r.get("failed", [])))))
    return "\n".join(lines)


STAGES = ("oracle", "hand", "rounding model: spreads", "rounding model: kinks", "legs",
          "diagnosis")


def format_stages(cost: dict) -> str:
    """Where each whole-model check's time went, stage by stage (``LayerCheck.seconds``), with
    the rounding model's samples per part, recorded elements and flipped predicate elements."""
    runs = {name: r for name, r in cost["model"].items() if "stages" in r}
    if not runs:
        return ""
    head = f"{'whole-model check: where the time goes':40s}" + "".join(
        f" {name:>18s}" for name in runs)
    lines = [head, "-" * len(head)]
    for stage in (*STAGES, "the rest (setup, tolerances, report)"):
        cells = []
        for r in runs.values():
            got = r["stages"].get(stage) if stage in STAGES else \
                r["seconds"] - sum(r["stages"].values())
            cells.append("-" if got is None else
                         f"{got:6.1f} s {100 * got / r['seconds']:4.0f}%")
        lines.append(f"{stage:40s}" + "".join(f" {c:>18s}" for c in cells))
    lines.append(f"{'total':40s}" + "".join(f" {r['seconds']:6.1f} s {100:4.0f}%".rjust(19)
                                            for r in runs.values()))
    for label, key, fmt in (("samples per part of the rounding model", "samples", "{}"),
                            ("elements it records per sample", "elements", "{:,}"),
                            ("predicate elements within rounding of a kink", "flipped", "{}")):
        lines.append(f"{label:40s}" + "".join(
            f" {'-' if r.get(key) is None else fmt.format(r[key]):>18s}" for r in runs.values()))
    return "\n".join(lines)


# targets: the first call with the persistent cache at the registry's size; the whole-model
# check at the large size
FIRST_CACHED_MOST = 0.5          # seconds
MODEL_MOST = (30.0, 4 * 2 ** 30)  # seconds, bytes


def _span(runs) -> str:
    return f"{min(runs):.2f}-{max(runs):.2f} s"


def target_lines(cost: dict) -> list:
    lines = []
    r = cost["layer"].get("registry", {})
    if "check_layer_first_cached" in r:
        got, runs = r["check_layer_first_cached"], r.get("check_layer_first_cached_runs")
        how = "" if not runs else f", the median of {len(runs)} processes: {_span(runs)}"
        lines.append(f"target check_layer first call at the registry's size, persistent cache: "
                     f"<= {FIRST_CACHED_MOST} s: {'met' if got <= FIRST_CACHED_MOST else 'NOT met'} "
                     f"({got:.2f} s{how})")
    m = cost["model"].get("large", {})
    if "seconds" in m:  # a check that fails a correct model meets nothing
        ok = m["seconds"] <= MODEL_MOST[0] and m["peak_bytes"] <= MODEL_MOST[1] and m["ok"]
        lines.append(f"target whole-model check at the bench's large size (B 32, T 64, D 256, "
                     f"H 8, F 1024), caches filled: <= {MODEL_MOST[0]:.0f} s and "
                     f"<= {MODEL_MOST[1] / 2 ** 30:.0f} GiB, passing: {'met' if ok else 'NOT met'} "
                     f"({m['seconds']:.1f} s, {m['peak_bytes'] / 2 ** 30:.2f} GiB"
                     + ("" if m["ok"] else ", FAILED") + ")")
    return lines


DOCS_SECTION = "checker-cost"  # the README's generated section (--write-docs)


def report_text(cost: dict) -> str:
    """What the command prints: the date and machine, the tables, the targets."""
    from experiments import timing
    env = timing.environment(0)
    head = [f"{time.strftime('%Y-%m-%d')}; {timing.machine_line(env)}",
            timing.blas_line(env) + " (the checks leave BLAS's threads as they are)"]
    if cost.get("xla_float64_flops"):  # what the rounding model's runs are made of
        head.append(f"XLA float64 1024^3 product (jax.jit, its own threads): "
                    f"{cost['xla_float64_flops'] / 1e9:.1f} GFLOP/s, the rounding model's engine")
    return "\n".join([*head, "", format_cost(cost), "", format_stages(cost),
                      *target_lines(cost)])


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(prog="python -m experiments.checker_cost",
                                     description="the checker's own cost, as the bench prints it")
    parser.add_argument("--no-peers", dest="peers", action="store_false",
                        help="without gradcheck and check_grads")
    parser.add_argument("--no-layer", dest="layer", action="store_false",
                        help="the whole-model check only")
    parser.add_argument("--no-model", dest="model", action="store_false",
                        help="the layer check only")
    parser.add_argument("--no-kinks-run", dest="kinks_run", action="store_false",
                        help="without the large check's second run, its kinks' moves run")
    parser.add_argument("--write-docs", action="store_true",
                        help=f"write the output into README.md (section '{DOCS_SECTION}')")
    args = parser.parse_args()
    cost = measure(peers=args.peers, layer_sizes=LAYER_SIZES if args.layer else {},
                   model_sizes=MODEL_SIZES if args.model else {}, kinks_run=args.kinks_run)
    text = report_text(cost)
    print(text)
    if args.write_docs:
        from checks.docs import README, write_run
        command = " ".join(["python -m experiments.checker_cost",
                            *(a for a in sys.argv[1:] if a != "--write-docs")])
        write_run(README, DOCS_SECTION, command, text)
