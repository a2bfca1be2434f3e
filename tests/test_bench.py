"""The benchmark's plumbing (its numbers are ratios measured by `make bench`, never asserted)."""
import os

import numpy as np
import pytest

from experiments import bench, timing


def test_compare_measures_every_candidate_round_robin():
    calls = []
    medians = timing.compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                             repeats=3, warmup=1)
    assert set(medians) == {"a", "b"} and all(m >= 0 for m in medians.values())
    assert calls == ["a", "b"] + ["a", "b"] * 3  # warm-up, then interleaved repeats


def test_compare_samples_keeps_every_round_and_compare_is_their_median(monkeypatch):
    """With a clock that advances by known steps, every round's time is kept in order, each
    candidate's from its own calls, and ``compare`` returns their medians."""
    steps = iter([1.0, 10.0, 3.0, 30.0, 2.0, 20.0, 9.0, 90.0, 4.0, 40.0])  # a, b per round (means 3.8, 38)
    now = [0.0]

    def clock():  # start of a call, then its end one step later
        now[0] += 0.5 if len(ticks) % 2 == 0 else next(steps)
        ticks.append(now[0])
        return now[0]
    ticks = []
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    samples = timing.compare_samples({"a": lambda: None, "b": lambda: None}, repeats=5, warmup=0)
    np.testing.assert_array_equal(samples["a"], [1.0, 3.0, 2.0, 9.0, 4.0])
    np.testing.assert_array_equal(samples["b"], [10.0, 30.0, 20.0, 90.0, 40.0])
    ticks.clear()
    steps = iter([1.0, 10.0, 3.0, 30.0, 2.0, 20.0, 9.0, 90.0, 4.0, 40.0])
    assert timing.compare({"a": lambda: None, "b": lambda: None}, repeats=5, warmup=0) == \
        {"a": 3.0, "b": 30.0}


def test_the_ratio_interval_resamples_whole_rounds():
    """A candidate that takes exactly twice the other's time in every round has the ratio 2
    in every resample of whole rounds, however much the rounds differ (a drift that hits both
    alike); independent noise of 20 % per sample widens the interval, which holds the median's
    ratio and the true one."""
    rng = np.random.default_rng(3)
    b = rng.uniform(1.0, 3.0, 30)                                  # rounds drift by 3x
    low, high = timing.median_ratio_interval(2 * b, b)
    assert low == pytest.approx(2.0, rel=1e-12) and high == pytest.approx(2.0, rel=1e-12)
    b = rng.uniform(0.9, 1.1, 30)
    a = 2 * b * rng.normal(1.0, 0.2, 30)
    low, high = timing.median_ratio_interval(a, b)
    assert low < np.median(a) / np.median(b) < high and low < 2.0 < high
    assert 0.05 < high - low < 0.6                                 # about 4 x 0.2 x 2 / sqrt(30)
    assert timing.median_ratio_interval(a, b) == (low, high)       # seeded: the same each run


def _step(size, ratio, ratio_interval, share=0.2, share_interval=(0.19, 0.21)):
    """A step row as step_row writes it, with the lab at `share` of the matmul rate."""
    return {"size": size, "ratio": ratio, "ratio_interval": ratio_interval, "repeats": 30,
            "lab_flops_per_s": share * 1e11, "matmul_flops_per_s": 1e11, "flops": 1e9,
            "lab_ms": 10.0, "jax_ms": 10.0 / ratio, "rate_share_interval": share_interval}


@pytest.mark.parametrize("row, verdict", [
    (_step("article", 0.45, (0.43, 0.48)), "met ("),
    (_step("article", 0.55, (0.45, 0.60)), "NOT met ("),
    (_step("article", 0.48, (0.46, 0.53)), "met by the medians only"),
    (_step("large", 0.70, (0.68, 0.72), 0.85, (0.82, 0.88)), "met ("),
    (_step("large", 0.70, (0.68, 0.72), 0.77, (0.70, 0.84)), "NOT met ("),
    (_step("large", 0.70, (0.68, 0.72), 0.83, (0.78, 0.88)), "met by the medians only")])
def test_a_target_is_met_when_its_intervals_are_on_its_side(row, verdict):
    line = bench.target_lines([row])[0]
    assert f": {verdict}" in line, line
    assert f"lab/jax {row['ratio']:.2f} [{row['ratio_interval'][0]:.2f}, " in line
    assert "95% intervals over the loop's 30 rounds" in line


@pytest.mark.parametrize("field, value, message", [
    ("sizes", ("huge",), "sizes: expected names"), ("backend", "tpu", "backend: expected"),
    ("repeats", 0, "repeats: expected"), ("dtype", "float16", "dtype: expected")])
def test_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        bench.Config(**{field: value})


def test_header_names_the_blas_kernel_threads_and_versions():
    import jax
    env = timing.environment(threads=1)
    header = timing.format_header(env)
    assert env["blas"], "threadpoolctl finds NumPy's BLAS"
    for lib in env["blas"]:
        assert f"{lib['internal_api']} {lib['version']}, kernel {lib['architecture']}" in header
        assert f"{lib['num_threads']} threads by default" in header
    assert "the bench sets 1 thread(s)" in header
    assert f"jax {jax.__version__} on {jax.default_backend()}" in header
    torch = env["torch"]
    assert ("torch: not installed" in header if torch["version"] is None else
            f"torch: {torch['version']} (BLAS {torch['blas']}), intra-op threads 1" in header)
    assert ("WARNING" in header) == any(k in env["env"] for k in timing.CORETYPE_VARS)


@pytest.mark.slow  # a fresh process (JAX's CPU pool sized before it starts): 6 s
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning needs a process that may use two CPUs or more")
def test_every_contender_runs_on_the_cores_the_bench_gives_it():
    """In a fresh process: a thread started before on_cores(1) is pinned with the main one, a
    JAX product computed inside uses at most one CPU-second per second (XLA's pool, which its
    flags do not bound, is sized by the pinned process), the header says so, and every thread
    gets its CPUs back after the block.  The CPU-time bound holds on any machine: a process on
    one CPU cannot exceed it; 1.1 leaves the clocks' granularity."""
    import json
    import subprocess
    import sys
    code = """if True:
        import json, os, resource, threading, time
        from experiments import timing
        stop = threading.Event(); worker = threading.Thread(target=stop.wait); worker.start()
        before = sorted(os.sched_getaffinity(0))
        with timing.on_cores(1) as cores:
            import jax, jax.numpy as jnp
            header = timing.format_header(timing.environment(1, cores=cores))
            inside = [sorted(os.sched_getaffinity(0)), sorted(os.sched_getaffinity(worker.native_id))]
            x = jnp.ones((512, 512), jnp.float32); f = jax.jit(lambda a: a @ a @ a)
            f(x).block_until_ready()
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            while time.perf_counter() - t0 < 0.5:
                f(x).block_until_ready()
            r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
        cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        after = [sorted(os.sched_getaffinity(0)), sorted(os.sched_getaffinity(worker.native_id))]
        stop.set()
        print(json.dumps(dict(before=before, inside=inside, after=after, ratio=cpu / wall,
                              header=header)))"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["inside"] == [got["before"][:1]] * 2
    assert got["after"] == [got["before"]] * 2
    assert got["ratio"] <= 1.1, got["ratio"]
    assert f"cores: 1 of {len(got['before'])} CPUs (the process pinned to CPU" in got["header"]
    assert "threads: its CPU pool uses the process's 1 CPU" in got["header"]


def test_unforced_env_drops_only_the_core_type_overrides():
    env = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "1048576", "OMP_NUM_THREADS": "1"}
    assert timing.unforced_env(env) == {"OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_a_forced_core_type_is_warned_about_and_named():
    """A process with OPENBLAS_CORETYPE=Haswell prints the warning; on x86-64 OpenBLAS then runs
    the Haswell kernel, and the warning names the kernel detected with the variable unset."""
    import json
    import os
    import platform
    import subprocess
    import sys
    code = ("import json; from experiments import timing; env = timing.environment(1); "
            "print(timing.format_header(env)); print(json.dumps(env))")
    # the core type alone: the machine's own OPENBLAS_* settings (an L2 size) would join it
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**env, "OPENBLAS_CORETYPE": "Haswell"})
    *header, env = done.stdout.strip().splitlines()
    env, header = json.loads(env), "\n".join(header)
    assert env["env"]["OPENBLAS_CORETYPE"] == "Haswell"
    assert "WARNING: OPENBLAS_CORETYPE=Haswell forces OpenBLAS's core type" in header
    detected = ", ".join(map(str, env["detected_kernel"]))
    assert f"kernel detected with it unset {detected}" in header
    if platform.machine() in ("x86_64", "AMD64") and env["blas"][0]["internal_api"] == "openblas":
        assert env["blas"][0]["architecture"] == "Haswell"
        assert "kernel Haswell" in header


@pytest.mark.slow
def test_with_a_forced_core_type_the_steps_are_timed_under_both_settings(tmp_path):
    import json
    import os
    import subprocess
    import sys
    subprocess.run([sys.executable, "-m", "experiments", "bench", "--sizes", "article",
                    "--repeats", "1", "--warmup", "0", "--no-layers", "--no-shares", "--no-extras",
                    "--no-half", "--no-peers", "--no-checker"],  # the steps only
                   capture_output=True, text=True, check=True,
                   env={**os.environ, "OPENBLAS_CORETYPE": "Haswell", "GRADLAB_RESULTS": str(tmp_path)})
    saved = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert saved["environment"]["env"]["OPENBLAS_CORETYPE"] == "Haswell"
    assert "WARNING: OPENBLAS_CORETYPE=Haswell" in saved["header"]
    unforced = saved["unforced"]
    assert "OPENBLAS_CORETYPE" not in unforced["environment"]["env"]
    assert [r["size"] for r in unforced["steps"]] == ["article"]
    assert all(r["lab_ms"] > 0 and r["jax_ms"] > 0 for r in unforced["steps"])


@pytest.mark.slow
def test_the_checker_and_its_peers_are_timed_on_the_same_layer_in_a_fresh_process():
    from experiments import checker_cost, peers_torch
    r = checker_cost.in_child("layer_check_times", sizes={}, peers=True)
    assert r["check_layer_ok"] and r["check_grads_ok"]
    assert r["check_layer_first"] > 0 and r["check_layer_warm"] > 0 and r["check_grads_warm"] > 0
    if peers_torch.available():  # the PyTorch twin's gradients pass gradcheck in both modes
        assert r["gradcheck_ok"] and r["gradcheck_fast_ok"]
    text = checker_cost.format_cost({"layer": {"registry": r}, "model": {}})
    assert f"{r['check_layer_first']:.3f} s" in text and "FAILED" not in text


@pytest.mark.slow
def test_a_child_above_the_memory_cap_is_stopped(monkeypatch):
    from experiments import checker_cost
    monkeypatch.setattr(checker_cost, "MEMORY_CAP", 2 ** 20)  # 1 MiB: any Python process passes it
    r = checker_cost.in_child("model_check_cost", sizes={})
    assert r == {"error": f"stopped above {2 ** 20 / 2 ** 30:.3g} GiB of memory"}


@pytest.mark.slow
def test_a_child_past_the_time_cap_is_stopped(monkeypatch):
    from experiments import checker_cost
    monkeypatch.setattr(checker_cost, "TIME_CAP", 0.5)  # the model check's imports take longer
    r = checker_cost.in_child("model_check_cost", sizes={})
    assert r == {"error": "stopped after 0.5 s"}


def test_checker_targets_are_judged_on_the_measured_figures():
    from experiments import checker_cost
    cost = {"layer": {"registry": {"check_layer_first_cached": 0.7}},
            "model": {"large": {"seconds": 20.0, "peak_bytes": 3 * 2 ** 30, "ok": True}}}
    lines = checker_cost.target_lines(cost)
    assert "<= 0.5 s: NOT met (0.70 s)" in lines[0]
    # several later processes: judged on their median, their range printed beside it
    cost["layer"]["registry"].update(check_layer_first_cached=0.46,
                                     check_layer_first_cached_runs=[0.61, 0.42, 0.46, 0.44, 0.55])
    assert "<= 0.5 s: met (0.46 s, the median of 5 processes: 0.42-0.61 s)" in \
        checker_cost.target_lines(cost)[0]
    assert "first, cached: the median of 5 later processes (their range: 0.42-0.61 s registry)" \
        in checker_cost.format_cost(cost)
    assert "caches filled: <= 30 s and <= 4 GiB, passing: met (20.0 s, 3.00 GiB)" in lines[1]
    cost["model"]["large"]["ok"] = False  # fast and small, but a correct model failed
    assert "passing: NOT met (20.0 s, 3.00 GiB, FAILED)" in checker_cost.target_lines(cost)[1]


def test_the_model_rows_name_their_dtype_widths_and_load_average():
    from experiments import checker_cost
    cost = {"layer": {}, "model": {"large": {"seconds": 20.0, "peak_bytes": 3 * 2 ** 30,
                                             "ok": True, "dtype": "float32", "load": [1.5, 2.0]}}}
    text = checker_cost.format_cost(cost)
    assert "whole-model check, float32" in text
    assert "large (B 32 T 64 D 256 H 8 F 1024)" in text and "1.5, 2.0" in text
    # the large check again with its kinks' moves run: labelled with the same sizes
    cost["model"][checker_cost.KINKS_RUN] = dict(cost["model"]["large"], seconds=31.0)
    text = checker_cost.format_cost(cost)
    assert "large, kinks run (B 32 T 64 D 256 H 8 F 1024)" in text and "31.0 s" in text
    # a first process with empty caches beside the cached run the other figures are of
    cost["model"]["large"]["first_seconds"] = 44.5
    line = next(row for row in checker_cost.format_cost(cost).splitlines()
                if row.startswith("large ("))
    assert line.split()[-8:-4] == ["44.5", "s", "20.0", "s"], line


def test_the_model_figures_come_from_their_own_caches_first_empty_then_filled(monkeypatch):
    """The whole-model check runs twice per size in children sharing one fresh cache folder:
    the first's time is reported beside the second's, the larger peak and both verdicts count."""
    from experiments import checker_cost
    calls = []

    def child(function, env=None, **kwargs):
        calls.append(env["GRADLAB_JAX_CACHE"])
        first = len(calls) % 2 == 1
        return {"seconds": 40.0 if first else 20.0, "peak_bytes": (3 if first else 2) * 2 ** 30,
                "ok": True}
    monkeypatch.setattr(checker_cost, "in_child", child)
    import experiments.timing
    monkeypatch.setattr(experiments.timing, "xla_matmul_rate", lambda dtype: 1.0)
    monkeypatch.setenv("GRADLAB_JAX_CACHE", "/the/users/cache")
    cost = checker_cost.measure(layer_sizes={}, model_sizes={"large": {}}, kinks_run=False)
    assert len(calls) == 2 and calls[0] == calls[1] != "/the/users/cache"
    assert cost["model"]["large"] == {"seconds": 20.0, "first_seconds": 40.0,
                                      "peak_bytes": 3 * 2 ** 30, "ok": True}
    # a first process that fails a correct model fails the figure, though the second passes
    passed = child
    monkeypatch.setattr(checker_cost, "in_child", lambda function, env=None, **kw: dict(
        passed(function, env, **kw), ok=len(calls) % 2 == 0))
    cost = checker_cost.measure(layer_sizes={}, model_sizes={"large": {}}, kinks_run=False)
    assert cost["model"]["large"]["ok"] is False


def test_a_failing_model_row_names_its_failing_tensors():
    from experiments import checker_cost
    cost = {"layer": {}, "model": {"registry": {"seconds": 2.0, "peak_bytes": 2 ** 29, "ok": False,
                                                "failed": ["enc0.ff.W1", "out.b"]}}}
    assert "FAILED: enc0.ff.W1, out.b" in checker_cost.format_cost(cost)


def test_a_checks_stages_account_for_its_time_and_its_kinks_are_counted():
    """LayerCheck.seconds holds every stage of a run, each timed once, together within the
    run's own time; a pre-activation placed 1e-7 from leaky ReLU's kink is counted among the
    predicate elements that flip (the check's verdict is not what this tests)."""
    import time

    import numpy as np
    from checks.registry import BY_NAME, layer_check
    from experiments import checker_cost
    row = BY_NAME["ff"]

    def at_the_kink(rng, inputs, params):
        x, W1 = inputs[0].astype(np.float64), params["W1"].astype(np.float64)
        z = x.reshape(-1, x.shape[-1]) @ W1
        params = dict(params)
        params["b1"] = params["b1"].copy()
        params["b1"][2] = -z[4, 2] + 1e-7  # hidden unit 2 of token 4 within rounding of the kink
        return inputs, params
    check = layer_check(row, np.float32, seed=3, transform=at_the_kink)
    start = time.perf_counter()
    check.run()
    total = time.perf_counter() - start
    assert set(check.seconds) == set(checker_cost.STAGES)
    assert all(s >= 0 for s in check.seconds.values()) and sum(check.seconds.values()) <= total
    assert check.flipped >= 1
    cost = {"layer": {}, "model": {"registry": {"seconds": 10.0, "peak_bytes": 2 ** 29,
                                                "ok": True, "samples": 64, "elements": 40751,
                                                "flipped": 3,
                                                "stages": {s: 1.0 for s in checker_cost.STAGES}}}}
    text = checker_cost.format_stages(cost)
    assert "rounding model: kinks" in text and "1.0 s   10%" in text
    assert "the rest (setup, tolerances, report)" in text and "4.0 s   40%" in text  # 10 - 6
    assert "40,751" in text and "total" in text


def test_the_readmes_checker_cost_is_the_commands_output_and_its_stages_add_up():
    """The README's checker-cost section is what ``python -m experiments.checker_cost
    --write-docs`` wrote (a dated measurement, not recomputed here: the machines differ): it
    names the command and the machine, has a row per stage, and per size the stages add up
    to the total within the printed rounding (0.05 s per cell, seven cells)."""
    import re

    from checks import docs
    from experiments import checker_cost
    text = docs.section(docs.README, checker_cost.DOCS_SECTION)
    assert text.startswith("```\n$ python -m experiments.checker_cost") and "machine:" in text
    assert "XLA float64 1024^3 product" in text  # the engine of the rounding model's runs
    rows = {}
    for line in text.splitlines():
        cells = re.findall(r"(\d+\.\d) s +\d+%", line)
        if cells:
            rows[line[:40].strip()] = [float(c) for c in cells]
    assert set(checker_cost.STAGES) <= set(rows) and "total" in rows
    stages = [v for k, v in rows.items() if k != "total"]
    for i, total in enumerate(rows["total"]):
        assert abs(sum(v[i] for v in stages) - total) <= 7 * 0.05 + 1e-9, (i, rows)


def test_the_readmes_speed_tables_are_the_benchs_output_and_their_ratios_are_their_times():
    """The README's speed section is what ``python -m experiments bench --write-docs`` wrote (a
    dated measurement, not rerun here: the machines differ): the command, the header with the
    BLAS kernel, both step sizes with their targets, and in the every-ratio table each ratio is
    the quotient of the times beside it (to the printed rounding: ms to 0.001, ratios to 0.01)."""
    from checks import docs
    from experiments import bench
    text = docs.section(docs.README, bench.DOCS_SECTION)
    assert text.startswith("```\n$ python -m experiments bench") and "--write-docs" not in text
    assert "BLAS: " in text and "kernel " in text
    assert "target article:" in text and "target large:" in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("step "))
    names = ("lab", "jax.jit") + bench.PEERS + ("floor",)  # format_steps' columns
    seen = set()
    for line in lines[start + 2:]:
        cells = line.split()
        if not cells or cells[0] not in bench.STEP_SIZES:
            break
        n = len(names)
        ms = dict(zip(names, cells[1:1 + n]))
        ratios = dict(zip(names[1:], cells[1 + n:]))
        for other, ratio in ratios.items():
            if ratio == "-":
                continue
            want = float(ms["lab"]) / float(ms[other])
            assert abs(float(ratio) - want) <= 0.005 + 1e-3 * want, (cells[0], other, ratio, want)
        seen.add(cells[0])
    assert seen == set(bench.STEP_SIZES)


def test_the_large_model_row_is_the_benchs_step_at_its_own_widths():
    """The large row checks the model at the bench's widths, which --sizes rejects for the
    registry's row (it fixes D 6, H 2, F 8): registry.model_at draws that case."""
    import numpy as np
    from checks.registry import BY_NAME, model_at
    from experiments import bench, checker_cost
    large = checker_cost.MODEL_SIZES["large"]
    assert {k: large[k] for k in ("B", "T", "D", "H", "F")} == {
        k: bench.STEP_SIZES["large"][k] for k in ("B", "T", "D", "H", "F")}
    row = model_at(D=8, H=2, F=12)  # the same draw at small widths, for speed
    (src, tgt), params, _ = row.case(np.random.default_rng(0), np.float32, {"B": 3, "T": 4})
    assert src.shape == tgt.shape == (3, 4)
    assert params["enc0.ff.W1"].shape == (8, 12) and params["out.W"].shape == (8, 4)
    with pytest.raises(ValueError, match="widths: expected D, H or F, got V"):
        model_at(V=5)
    # without widths it is the registry's row: the same draw
    rng = lambda: np.random.default_rng(1)
    own, row_own = model_at().case(rng(), np.float32), BY_NAME["model"].case(rng(), np.float32)
    assert own[1].keys() == row_own[1].keys()
    for k in own[1]:
        np.testing.assert_array_equal(own[1][k], row_own[1][k])


FAULTS_CHILD = """
import json, sys
import numpy as np
from experiments import bench, timing
setting = timing.reuse_freed_memory() if sys.argv[1] == "reuse" else "system default"
step = bench.LabStep(bench.Config(), np, "article")
for _ in range(3):
    step()
before = timing.minor_faults()
for _ in range(5):
    step()
print(json.dumps({"malloc": setting, "faults": (timing.minor_faults() - before) / 5}))
"""


@pytest.mark.slow
def test_reusing_freed_memory_stops_the_page_faults_of_the_lab_step():
    """With glibc's defaults the article-size step faults fresh pages in on every step (its
    arrays outgrow malloc's adaptive mmap threshold and the heap's top is handed back); with
    reuse_freed_memory the same step, after warm-up, faults a tenth as often at most (here about
    1800 faults per step, then none)."""
    import json
    import platform
    import subprocess
    import sys
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    run = lambda mode: json.loads(subprocess.run([sys.executable, "-c", FAULTS_CHILD, mode],
                                                 capture_output=True, text=True,
                                                 check=True).stdout.splitlines()[-1])
    default, reuse = run("default"), run("reuse")
    assert reuse["malloc"].startswith("glibc malloc keeps freed memory")
    # (a glibc whose defaults already reuse the memory faults little either way: then the
    # bound is the 20 faults per step that a warm step's few new pages may take)
    assert reuse["faults"] <= max(default["faults"] / 10, 20), (default, reuse)


def test_the_header_names_the_allocator_setting():
    env = timing.environment(threads=1, malloc="system default (--no-reuse-memory)")
    assert "malloc: system default (--no-reuse-memory)" in timing.format_header(env)
