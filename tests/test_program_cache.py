"""Traced programs kept on disk (checks/program_cache.py): a later process reads the exported
program instead of tracing it, and computes what the traced one computes."""
import numpy as np
import jax.numpy as jnp

from checks import jax_cache, legs, program_cache
from checks.registry import BY_NAME, layer_check


def _on(monkeypatch, tmp_path):
    monkeypatch.setenv(program_cache.ENV, "on")
    monkeypatch.setattr(jax_cache, "programs_folder", lambda: tmp_path / "programs")


def test_a_program_is_traced_once_then_read_from_disk(monkeypatch, tmp_path):
    _on(monkeypatch, tmp_path)
    traces = []

    def f(x, n, y):
        traces.append(1)  # Python runs only while JAX traces
        return jnp.sin(x) * n + y @ y.T

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(5), rng.standard_normal((5, 5))
    want = np.sin(x) * 3 + y @ y.T
    first = program_cache.jit(f, "test:f", static_argnums=(1,))(x, 3, y)
    assert len(traces) == 1 and len(list((tmp_path / "programs").glob("*.jaxexp"))) == 1
    again = program_cache.jit(f, "test:f", static_argnums=(1,))(x, 3, y)  # a new process's view
    assert len(traces) == 1, "the exported program should be read, not traced again"
    np.testing.assert_array_equal(np.asarray(again), np.asarray(first))
    np.testing.assert_allclose(np.asarray(first), want, rtol=1e-12, atol=1e-12)
    other = program_cache.jit(f, "test:f", static_argnums=(1,))(x, 4, y)  # another static value
    assert len(traces) == 2
    np.testing.assert_allclose(np.asarray(other), want + np.sin(x), rtol=1e-12, atol=1e-12)


def test_a_check_reads_its_rounding_programs_and_reaches_the_same_tolerances(monkeypatch,
                                                                               tmp_path):
    """The same check with its rounding model traced, exported, then read back: tolerances equal
    to 1e-12 (the same operations on the same draws)."""
    def tolerances():
        legs._ROUNDING_MODELS.clear()
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
