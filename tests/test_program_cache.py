"""Traced programs kept on disk (checks/program_cache.py): a later process reads the exported
program instead of tracing it, and computes what the traced one computes."""
import collections
import contextlib

import numpy as np
import jax.numpy as jnp

from checks import jax_cache, legs, program_cache
from checks.registry import BY_NAME, layer_check


def _on(monkeypatch, tmp_path):
    monkeypatch.setenv(program_cache.ENV, "on")
    monkeypatch.setattr(jax_cache, "programs_folder", lambda: tmp_path / "programs")
    monkeypatch.setattr(program_cache, "_SHARED", collections.OrderedDict())
    monkeypatch.setattr(program_cache, "_GROUPS", {})
    monkeypatch.setattr(program_cache, "_AHEAD", {})


@contextlib.contextmanager
def _compile_events():
    """The names of JAX's compile-pipeline events (trace, lowering, compilation) in the block."""
    import jax
    events = []
    listen = lambda event, seconds, **kw: events.append(event)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


# XLA's elementary functions and NumPy's differ in their last bits: values are compared at
# 1e-12, which a wrong program misses by far and any correct one meets on any machine
RTOL = 1e-12


def _later_jit(fn, key, **kw):
    """program_cache.jit as a later process makes it: nothing shared from this process's jits
    of the same key (each such jit below stands for a new process)."""
    program_cache._SHARED.clear()
    return program_cache.jit(fn, key, **kw)


def test_a_program_is_traced_once_then_read_from_disk(monkeypatch, tmp_path):
    _on(monkeypatch, tmp_path)
    traces = []

    def f(x, n, y):
        traces.append(1)  # Python runs only while JAX traces
        return jnp.sin(x) * n + y @ y.T

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(5), rng.standard_normal((5, 5))
    want = np.sin(x) * 3 + y @ y.T
    first = _later_jit(f, "test:f", static_argnums=(1,))(x, 3, y)
    assert len(traces) == 1 and len(list((tmp_path / "programs").glob("*.jaxexp"))) == 1
    assert len(list((tmp_path / "programs").glob("*.jaxexe"))) == 1  # and its executable
    again = _later_jit(f, "test:f", static_argnums=(1,))(x, 3, y)  # a new process's view
    assert len(traces) == 1, "the exported program should be read, not traced again"
    np.testing.assert_array_equal(np.asarray(again), np.asarray(first))
    np.testing.assert_allclose(np.asarray(first), want, rtol=RTOL, atol=1e-12)
    other = _later_jit(f, "test:f", static_argnums=(1,))(x, 4, y)  # another static value
    assert len(traces) == 2
    np.testing.assert_allclose(np.asarray(other), want + np.sin(x), rtol=RTOL, atol=1e-12)


def test_a_second_jit_of_a_key_in_the_process_shares_the_first_ones_programs(monkeypatch):
    """With nothing kept on disk (the suite's setting), a jit of a key this process has
    compiled runs the same compiled program: no trace, no compilation, the same values; the
    same function under another key is traced again."""
    monkeypatch.setattr(program_cache, "_SHARED", collections.OrderedDict())
    traces = []

    def f(x):
        traces.append(1)
        return jnp.tanh(x) * jnp.sum(x)

    x = np.linspace(-1.0, 2.0, 6)
    with _compile_events() as events:
        first = program_cache.jit(f, "test:shared")(x)
        del events[:]
        again = program_cache.jit(lambda x: f(x), "test:shared")(x)  # another function object
        later = [e for e in events if e.endswith("backend_compile_duration")]
        program_cache.jit(lambda x: f(x), "test:another")(x)  # another key: traced again
    assert len(traces) == 2 and not later, (traces, later)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(first))
    np.testing.assert_allclose(np.asarray(first), np.tanh(x) * np.sum(x), rtol=RTOL)


def test_a_check_reads_its_rounding_programs_and_reaches_the_same_tolerances(monkeypatch,
                                                                               tmp_path):
    """The same check with its rounding model traced, exported, then read back: tolerances equal
    to 1e-12 (the same operations on the same draws)."""
    def tolerances():
        legs._ROUNDING_MODELS.clear()
        program_cache._SHARED.clear()
        check = layer_check(BY_NAME["ff"], np.float32)
        report = check.run(diagnose=False)
        assert report.ok, str(report)
        return {t.name: (t.tol, t.score) for t in report.tensors}

    plain = tolerances()
    _on(monkeypatch, tmp_path)
    exported, read = tolerances(), tolerances()
    assert list((tmp_path / "programs").glob("*.jaxexp"))
    for name, tol in plain.items():
        np.testing.assert_allclose([exported[name], read[name]], [tol, tol], rtol=1e-12,
                                   err_msg=name)


def test_a_check_run_before_lowers_and_compiles_nothing(monkeypatch, tmp_path):
    """A later process's view (fresh rounding models and oracle functions): the check loads
    every program it runs, the one giving the oracle's values included (the rounding model's
    exact run), so nothing is lowered or compiled, and the report is the same.  The
    executables are those the first check noted for its oracle, each loaded ahead on the
    reader's thread, none by the check itself.  JAX's cache is off for the test: a program it
    served keeps no executable (program_cache)."""
    import threading

    import jax
    _on(monkeypatch, tmp_path)
    reads, read = [], program_cache._read

    def spied(path, *load):
        reads.append((path.suffix, threading.current_thread() is threading.main_thread()))
        return read(path, *load)
    monkeypatch.setattr(program_cache, "_read", spied)

    def check(events):
        legs._ROUNDING_MODELS.clear()
        program_cache._SHARED.clear()
        program_cache._GROUPS.clear()
        legs._oracle_functions.cache_clear()
        del events[:], reads[:]
        report = layer_check(BY_NAME["mha"], np.float64).run()
        return report, [e for e in events if e.endswith(("jaxpr_to_mlir_module_duration",
                                                         "backend_compile_duration"))]

    jax.config.update("jax_enable_compilation_cache", False)
    try:
        with _compile_events() as events:
            (first, made), (again, later) = check(events), check(events)
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
    assert made and not later, later
    # the same compiled code on the same inputs in one process: the same report, to the digit
    assert first.ok and str(again) == str(first)
    executables = _programs(tmp_path, program_cache.EXECUTABLE)
    (group,) = _programs(tmp_path, program_cache.GROUP)
    assert sorted(group.read_text().split()) == sorted(p.name for p in executables)
    assert sorted(reads) == sorted([(program_cache.GROUP, True)]
                                   + [(program_cache.EXECUTABLE, False)] * len(executables))
    assert not program_cache._AHEAD  # each one loaded ahead was taken by its program


def _programs(tmp_path, suffix):
    return sorted((tmp_path / "programs").glob("*" + suffix))


def test_a_later_process_loads_the_executable_and_neither_traces_nor_compiles(monkeypatch,
                                                                             tmp_path):
    """The compiled program is kept beside the traced one: a new jit (a later process's view)
    loads it, with no trace, no lowering and no compilation, and computes the same values."""
    _on(monkeypatch, tmp_path)
    traces = []

    def f(x, y):
        traces.append(1)
        return {"a": jnp.tanh(x) @ y, "b": [jnp.sum(x * x)]}

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    with _compile_events() as events:
        first = _later_jit(f, "test:exe")(x, y)
        made = list(events)
        del events[:]
        again = _later_jit(f, "test:exe")(x, y)
    steps = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration")
    assert all(any(e.endswith(s) for e in made) for s in steps), made  # the events are heard
    assert traces == [1] and not [e for e in events if e.endswith(steps)], events
    np.testing.assert_array_equal(np.asarray(again["a"]), np.asarray(first["a"]))
    np.testing.assert_array_equal(np.asarray(again["b"][0]), np.asarray(first["b"][0]))
    np.testing.assert_allclose(np.asarray(first["a"]), np.tanh(x) @ y, rtol=RTOL)


def test_an_unreadable_executable_is_compiled_again(monkeypatch, tmp_path):
    _on(monkeypatch, tmp_path)
    f = lambda x: jnp.cos(x) * 2
    x = np.linspace(0.0, 1.0, 7)
    _later_jit(f, "test:broken")(x)
    [path] = _programs(tmp_path, ".jaxexe")
    path.write_bytes(b"not an executable")
    np.testing.assert_allclose(np.asarray(_later_jit(f, "test:broken")(x)),
                               np.cos(x) * 2, rtol=RTOL)
    assert path.read_bytes() != b"not an executable"  # written again, whole


def test_a_program_calling_a_library_keeps_no_executable(monkeypatch, tmp_path):
    """A program with a custom call (LAPACK's solver on the CPU) needs its library set up by
    the process, which loading an executable skips: only its traced program is kept."""
    _on(monkeypatch, tmp_path)
    a = np.array([[3.0, 1.0], [1.0, 2.0]])
    b = np.array([9.0, 8.0])
    got = _later_jit(lambda a, b: jnp.linalg.solve(a, b), "test:solve")(a, b)
    np.testing.assert_allclose(np.asarray(got), np.linalg.solve(a, b), rtol=RTOL)
    assert _programs(tmp_path, ".jaxexp") and not _programs(tmp_path, ".jaxexe")


def test_an_executable_is_named_by_the_machine_and_the_compiler_options(monkeypatch):
    """An executable runs only where it was compiled for: its name carries the processor, XLA's
    flags and the compiler options, so another machine or setting compiles its own."""
    plain = program_cache._machine({})
    assert plain == program_cache._machine({})
    assert plain != program_cache._machine({"xla_backend_optimization_level": 0})
    monkeypatch.setattr(program_cache, "_cpu", lambda: "another processor")
    assert plain != program_cache._machine({})
    monkeypatch.undo()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=SSE4_2")
    assert plain != program_cache._machine({})


class _NeverCounted(list):
    """A count of JAX's cache reads that never moves: the rule against keeping them defeated."""
    def __getitem__(self, i):
        return 0


def _compiled_twice(monkeypatch, tmp_path, f, x, key):
    """f compiled into one programs folder, then traced again into tmp_path/programs, where its
    compilation is JAX's read of the first (JAX keeping every program, however quick)."""
    import jax
    _on(monkeypatch, tmp_path)
    monkeypatch.setattr(jax_cache, "programs_folder", lambda: tmp_path / "first")
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    try:
        _later_jit(f, key)(x)
        monkeypatch.setattr(jax_cache, "programs_folder", lambda: tmp_path / "programs")
        hits = program_cache._CACHE_HITS[0]
        got = _later_jit(f, key)(x)
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before)
    return got, hits


def _loaded_without_compiling(f, key, x):
    """f's values from a later process's jit of key, and whether it traced, lowered or
    compiled anything (it should load the kept executable)."""
    with _compile_events() as events:
        got = _later_jit(f, key)(x)
    steps = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration")
    return got, [e for e in events if e.endswith(steps)]


def test_a_program_jaxs_cache_served_is_compiled_here_once_and_kept(monkeypatch, tmp_path):
    """JAX's compilation cache hands back an executable that serializes without its compiled
    functions (a process loading it fails).  A program whose compilation was such a read (JAX's
    cache holds it from before a change of this package) is compiled once more with JAX's cache
    set aside and that executable is kept: the next process loads it, traces, lowers and
    compiles nothing, and computes the right values.  JAX's cache is in use again after."""
    import jax
    f = lambda x: jnp.exp(jnp.sin(x)) @ x.T
    x = np.random.default_rng(2).standard_normal((4, 4))
    want = np.exp(np.sin(x)) @ x.T
    got, hits = _compiled_twice(monkeypatch, tmp_path, f, x, "test:hit")
    assert program_cache._CACHE_HITS[0] > hits, "the second compilation should be JAX's read"
    assert _programs(tmp_path, ".jaxexp") and _programs(tmp_path, ".jaxexe")
    again, steps = _loaded_without_compiling(f, "test:hit", x)
    assert not steps, steps
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL)
    np.testing.assert_allclose(np.asarray(again), want, rtol=RTOL)
    # the cache set aside for that one compilation only: a third folder's compilation of the
    # same program is JAX's read again (and is compiled here once more, as above)
    monkeypatch.setattr(jax_cache, "programs_folder", lambda: tmp_path / "third")
    hits = program_cache._CACHE_HITS[0]
    _later_jit(f, "test:hit")(x)
    assert jax.config.jax_enable_compilation_cache and program_cache._CACHE_HITS[0] > hits


def test_an_executable_that_cannot_run_is_compiled_again(monkeypatch, tmp_path):
    """An executable that loads but fails to run (kept from JAX's cache, as it was before the
    rule above) is deleted, and the program compiled again from its traced form, here: the
    next process loads that one and runs it."""
    monkeypatch.setattr(program_cache, "_CACHE_HITS", _NeverCounted([0]))
    f = lambda x: jnp.cosh(x) * x[::-1]
    x = np.linspace(-1.0, 1.0, 9)
    _compiled_twice(monkeypatch, tmp_path, f, x, "test:broken-run")
    [kept] = _programs(tmp_path, ".jaxexe")
    broken = kept.read_bytes()
    monkeypatch.setattr(program_cache, "_CACHE_HITS", [0])  # the rule back
    np.testing.assert_allclose(np.asarray(_later_jit(f, "test:broken-run")(x)),
                               np.cosh(x) * x[::-1], rtol=RTOL)
    assert program_cache._CACHE_HITS[0] == 1  # compiled again: JAX's read, then here
    assert kept.read_bytes() != broken
    again, steps = _loaded_without_compiling(f, "test:broken-run", x)
    assert not steps, steps
    np.testing.assert_allclose(np.asarray(again), np.cosh(x) * x[::-1], rtol=RTOL)


def test_a_check_takes_the_oracles_values_from_the_models_exact_run(monkeypatch):
    """The autodiff leg's values come from the rounding model's exact run, which the spreads
    need anyway: a passing check traces (so compiles) no separate program of the oracle, and
    its values are the oracle's jitted vjp's (float64 at RTOL: the two programs are the same
    maths compiled with other XLA options, so they may differ in the last bits)."""
    import jax

    from checks import rounding
    traced = []
    plain = rounding.RoundingModel._oracle

    def counted(self, *flat):
        traced.append(1)
        return plain(self, *flat)
    monkeypatch.setattr(rounding.RoundingModel, "_oracle", counted)
    monkeypatch.setattr(program_cache, "_SHARED", collections.OrderedDict())
    monkeypatch.setattr(legs, "_ROUNDING_MODELS", {})
    check = layer_check(BY_NAME["mha-causal"], np.float64)
    assert check.run().ok and not traced
    ref = check.ref
    out, (d_in, d_params) = ref._run(0, ref._diff_values(), ref.params,
                                     jax.device_put(check.dout64))
    got = {"out": check.ref_out, **{f"input {i}": check.auto_in[i] for i in ref.diff_idx},
           **check.auto_params}
    want = {"out": out, **{f"input {i}": g for i, g in zip(ref.diff_idx, d_in)}, **d_params}
    assert got.keys() == want.keys()
    for name, g in want.items():  # an element cancelling to ~0 keeps its terms' absolute error
        g = np.asarray(g)
        np.testing.assert_allclose(got[name], g, rtol=RTOL, atol=RTOL * np.abs(g).max(),
                                   err_msg=name)
