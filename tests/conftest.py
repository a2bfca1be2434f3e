"""Backends for the suite: NumPy always, CuPy (marker ``gpu``) where a CUDA device answers."""
import numpy as np
import pytest

import checks  # noqa: F401  (switches JAX to float64 before any oracle runs)


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
