"""What every study shares: its results folder, crash-safe writes, meta.json, charts, progress.

A study is a module of this package defining ``NAME`` (its CLI name), a frozen dataclass
``Config`` whose defaults are the article's, and ``run(config) -> Result`` where the result has
at least ``.summary`` (a short text) and ``.headlines`` (a list of ``Headline`` rows that the
report shows as measured vs expected).  ``python -m experiments NAME`` finds it by itself.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

import numpy as np

RESULTS = pathlib.Path(os.environ.get("GRADLAB_RESULTS", "results"))


@dataclasses.dataclass(frozen=True)
class Headline:
    """One comparison the report shows: what was measured against what is expected."""
    quantity: str
    measured: float
    expected: float | str
    source: str            # where the expected value comes from (the article, a paper, a closed form)
    agrees: bool


def results_dir(name: str) -> pathlib.Path:
    path = RESULTS / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_write_bytes(path, data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename: readers never see half a file."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_csv(path, rows: list[dict]) -> None:
    """rows: a list of dicts with the same keys, written as a CSV with a header."""
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def versions() -> dict:
    import jax
    import matplotlib
    return {"python": platform.python_version(), "numpy": np.__version__, "jax": jax.__version__,
            "matplotlib": matplotlib.__version__, "platform": platform.platform()}


def write_meta(path, config, seconds: float, **extra) -> None:
    """meta.json: the config, its seed, the versions and the run time."""
    meta = {"config": dataclasses.asdict(config), "seed": getattr(config, "seed", None),
            "seconds": round(seconds, 3), "versions": versions(),
            "argv": sys.argv, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}
    atomic_write_text(path, json.dumps(meta, indent=2, default=_jsonable))


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (pathlib.Path, tuple)):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def save_figure(fig, path) -> None:
    """Save a matplotlib figure as PNG, atomically, and close it."""
    import matplotlib.pyplot as plt
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def pyplot():
    """matplotlib.pyplot on the headless Agg backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def progress(iterable=None, **kwargs):
    """A tqdm progress bar on stderr (silent when GRADLAB_QUIET is set, as in the test suite)."""
    from tqdm.auto import tqdm
    kwargs.setdefault("disable", bool(os.environ.get("GRADLAB_QUIET")))
    kwargs.setdefault("leave", False)
    return tqdm(iterable, **kwargs)
