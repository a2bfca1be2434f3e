"""What the numerics studies share beyond experiments.common: their result, config checks, the
final write (data.csv, meta.json, charts) and a few chart helpers.

Not a study itself (no NAME): ``python -m experiments`` passes over it.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib
import time

import numpy as np

from experiments import common, timing


@dataclasses.dataclass
class Result:
    """What run(config) returns: the summary line, the headline comparisons, the chart files
    with their captions (for the report) and the raw rows written to data.csv."""
    summary: str
    headlines: list
    figures: list            # [(path, caption)]
    rows: list               # the rows of data.csv
    extra: dict = dataclasses.field(default_factory=dict)


# --- config validation (ValueError naming the field, what was expected and what came) -----

def _fail(field, expected, value):
    raise ValueError(f"{field}: expected {expected}, got {value!r}")


def check_int(field, value, lo=1, hi=None):
    """An int in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        _fail(field, "an integer", value)
    if value < lo or (hi is not None and value > hi):
        _fail(field, f"an integer in [{lo}, {hi if hi is not None else 'inf'}]", value)


def check_float(field, value, lo=None, hi=None, *, open_lo=False):
    """A finite real number in [lo, hi] ((lo, hi] when open_lo)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
            or not math.isfinite(value):
        _fail(field, "a finite number", value)
    if lo is not None and (value < lo or (open_lo and value == lo)):
        _fail(field, f"a number {'>' if open_lo else '>='} {lo}", value)
    if hi is not None and value > hi:
        _fail(field, f"a number <= {hi}", value)


def check_ints(field, values, lo=1, hi=None, *, increasing=True, min_len=1):
    """A non-empty tuple of ints in [lo, hi], strictly increasing when asked."""
    if not isinstance(values, tuple) or len(values) < min_len:
        _fail(field, f"a tuple of at least {min_len} integers", values)
    for v in values:
        check_int(field, v, lo, hi)
    if increasing and any(b <= a for a, b in zip(values, values[1:])):
        _fail(field, "strictly increasing integers", values)


def validate(config, ints=(), tuples=(), floats=()):
    """Check a Config's fields by table.  ints / tuples: {field: lo or (lo, hi)} for an int or a
    strictly increasing tuple of ints in range; floats: {field: lo}, a finite number above lo."""
    for field, bounds in dict(ints).items():
        check_int(field, getattr(config, field), *(bounds if isinstance(bounds, tuple) else (bounds,)))
    for field, bounds in dict(tuples).items():
        check_ints(field, getattr(config, field), *(bounds if isinstance(bounds, tuple) else (bounds,)))
    for field, lo in dict(floats).items():
        check_float(field, getattr(config, field), lo, open_lo=True)


# --- the end of every run ---------------------------------------------------------------------

def finish(name, config, start, rows, figures, headlines, summary, **extra) -> Result:
    """Write data.csv and meta.json (the charts are already saved) and build the Result."""
    folder = common.results_dir(name)
    columns = list(dict.fromkeys(key for row in rows for key in row))   # union, first-seen order
    common.write_csv(folder / "data.csv", [{key: row.get(key, "") for key in columns} for row in rows])
    seconds = time.perf_counter() - start
    common.write_meta(folder / "meta.json", config, seconds,
                      headlines=[dataclasses.asdict(h) for h in headlines], **extra)
    return Result(summary=summary, headlines=headlines, figures=figures, rows=rows, extra=extra)


def conduct(name, config, measure, headlines, charts, rows, summary=None, meta=None) -> Result:
    """The life of every study: measure(config) -> m, then headlines(m, config), charts(m, config,
    figures), rows(m, config) for data.csv, the summary text and extra meta.json entries.

    BLAS runs on one thread throughout: the studies multiply many small matrices, where
    OpenBLAS's thread hand-off costs more than it gains (the depth study took 34.6 s with two
    threads and 4.5 s with one on a loaded 2-core machine; sqrt_d's 512 x 512 products were no
    faster with two)."""
    with timing.blas_threads(1):
        start = time.perf_counter()
        m = measure(config)
        heads = headlines(m, config)
        figures = []
        charts(m, config, figures)
        text = summary(m, heads, config) if summary else "\n".join(
            f"{h.quantity}: {h.measured:.4g} (expected {h.expected})" for h in heads)
        return finish(name, config, start, rows(m, config), figures, heads, text,
                      **(meta(m) if meta else {}))


def save(fig, name, filename, caption, figures):
    """Save a chart into results/NAME/filename and remember it, with its caption, for the report."""
    path = common.results_dir(name) / filename
    common.save_figure(fig, path)
    figures.append((path, caption))


def loglog_slope(x, y):
    """Least-squares slope of log y against log x: the exponent of a power law."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def loglog_slope_se(x, y):
    """Power-law exponent and its standard error from the log-log fit's residuals (3+ points)."""
    coef, cov = np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1, cov=True)
    return float(coef[0]), float(math.sqrt(cov[0, 0]))


def headline(quantity, measured, expected, source, agrees) -> common.Headline:
    return common.Headline(quantity, float(measured), expected, source, bool(agrees))


def figure(ncols=1, width=5.2, height=4.0, nrows=1):
    """A figure with nrows x ncols axes (returned as a flat list, row by row), grid on."""
    plt = common.pyplot()
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    for ax in axes.flat:
        ax.grid(True, which="both", alpha=0.3)
    fig.subplots_adjust(wspace=0.3, hspace=0.35)  # room for the labels; cheaper than tight_layout
    return fig, list(axes.flat)


def label(ax, title, xlabel, ylabel, *, logx=False, logy=False, legend=True):
    """Title and axis labels; log scales on request; a legend (legend may name its corner,
    e.g. "upper left", or be False)."""
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if legend:
        ax.legend(fontsize=7, **({"loc": legend} if isinstance(legend, str) else {}))


def sandbox(monkeypatch, folder, *, charts=True):
    """For tests: results go to folder, progress bars are silent and, with charts=False, figures
    are built but not rendered to PNG (rendering is most of a tiny run's time)."""
    monkeypatch.setenv("GRADLAB_QUIET", "1")
    monkeypatch.setattr(common, "RESULTS", pathlib.Path(folder))
    if not charts:
        monkeypatch.setattr(common, "save_figure", lambda fig, path: common.pyplot().close(fig))
