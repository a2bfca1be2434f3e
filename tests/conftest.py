"""Backends for the suite: NumPy always, CuPy (marker ``gpu``) where a CUDA device answers.

The suite's processes (pytest-xdist's workers) share one JAX compilation cache, made fresh for
each run and removed after it: an oracle or rounding model compiled by one worker is loaded by
the other.  Every run starts cold, so its time is what a fresh clone sees.

XLA compiles the suite's programs for speed of compilation (``FAST_COMPILE``): its older CPU
emitters for fused element-wise work, and LLVM's optimisation level 0 without its expensive
passes (the options ``checks.rounding.FAST_COMPILE`` gives a small program's rounding-model
runs in every process; keep the two in step).  The same maths, compiled in about half the time,
and most of the fast tier's time is compiling the oracles' and rounding models' programs.
``make test-alt`` runs the suite as XLA compiles by default, newer emitters and optimised code,
what a user's process gets for every other program, so both are tested (docs/testing.md)."""
import os
import shutil
import tempfile

FAST_COMPILE = ("--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0"
                " --xla_llvm_disable_expensive_passes=true")
if "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):  # before XLA starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FAST_COMPILE).strip()

# traced programs are kept for a later process (checks/program_cache.py): a cold run only pays
# for exporting them, so the suite traces as a fresh process does (its own test turns it on)
os.environ.setdefault("GRADLAB_PROGRAM_CACHE", "off")

import jax
import numpy as np
import pytest

import checks  # noqa: F401  (switches JAX to float64 before any oracle runs)

CACHE_ENV = "GRADLAB_TEST_JAX_CACHE"


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the run's own process: a fresh cache for the run
        os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="gradlab-jax-cache-")
    jax.config.update("jax_compilation_cache_dir", os.environ[CACHE_ENV])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop(CACHE_ENV, ""), ignore_errors=True)


def _cupy_or_none():
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except Exception:
        return None


CUPY = _cupy_or_none()
BACKENDS = [pytest.param(np, id="numpy"),
            pytest.param(CUPY, id="cupy", marks=[pytest.mark.gpu, pytest.mark.skipif(
                CUPY is None, reason="CuPy with a CUDA device is not available")])]


@pytest.fixture(params=BACKENDS)
def xp(request):
    return request.param


def sandbox(monkeypatch, folder, *, charts=True):
    """Results go to folder, progress bars are silent and, with charts=False, figures are built
    but not rendered to PNG (rendering is most of a tiny run's time)."""
    import pathlib

    from experiments import common
    monkeypatch.setenv("GRADLAB_QUIET", "1")
    monkeypatch.setattr(common, "RESULTS", pathlib.Path(folder))
    if not charts:
        monkeypatch.setattr(common, "save_figure", lambda fig, path: common.pyplot().close(fig))


@pytest.fixture
def study_sandbox(tmp_path, monkeypatch):
    """Studies write into tmp_path, silently, building their charts without rendering PNGs."""
    sandbox(monkeypatch, tmp_path, charts=False)


@pytest.fixture
def study_sandbox_with_charts(tmp_path, monkeypatch):
    """As study_sandbox, but the PNGs are rendered (tests that read the files or the report)."""
    sandbox(monkeypatch, tmp_path)
