"""The study contract and what every study shares: the Result and Headline types, the results
folder, crash-safe writes, meta.json, config checks, statistics for the headline tests, charts,
progress bars.

A study is a module of this package with a frozen dataclass ``Config`` (defaults: the article's;
each field documented by a trailing comment or an attribute docstring, which the command line
shows as its help) and ``run(config) -> Result``.  It takes part in ``python -m experiments``
through one line of ``experiments.registry``.

Every headline is a stated test (``Headline``): a prediction with its own uncertainty, the
measurement with its standard error, and the rule that decides; the report prints all three.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import pathlib
import platform
import sys
import tempfile
import time

import numpy as np

RESULTS = pathlib.Path(os.environ.get("GRADLAB_RESULTS", "results"))
K_SIGMA = 3.0  # the lab's rule: a difference beyond 3 combined standard errors disagrees


# --- the one result type ------------------------------------------------------------------

@dataclasses.dataclass
class Result:
    """What every run(config) returns.

    summary: a few lines for the terminal; headlines: the stated tests (Headline); figures:
    [(path, caption)] of the charts; rows: the raw numbers written to data.csv; tables:
    [(title, [row dict, ...])] shown as HTML tables in the report (per-size numbers); protocol:
    the protocol in prose, for the report (default: the module's docstring); extra: what a
    particular run also hands back to its caller (a training run's fit and answers, generated
    tokens, benchmark rows)."""
    summary: str
    headlines: list = dataclasses.field(default_factory=list)
    figures: list = dataclasses.field(default_factory=list)
    rows: list = dataclasses.field(default_factory=list)
    tables: list = dataclasses.field(default_factory=list)
    protocol: str = ""
    extra: dict = dataclasses.field(default_factory=dict)


# --- headlines: stated tests, each of one kind ---------------------------------------------

# What a headline claims, and how the report names its outcome (passed, failed).  Only the
# Reproduced kind counts as a result of the lab; the others are printed with their kind.
KINDS = {
    "reproduced": ("Reproduced", "Not reproduced"),   # a published or derived number matched by a
                                                      # two-sided test that could fail
    "consistent": ("Consistent", "Inconsistent"),     # a bound or inequality held, with its margin
    "identity": ("Identity holds", "Identity FAILS"), # a sampler or algebraic check: kept in the
                                                      # tests, not counted as a result
    "shown": ("Shown", "Shown"),                      # measured and displayed, not judged
}
KIND_NAMES = {"reproduced": "Reproduced", "consistent": "Consistent", "identity": "Identity",
              "shown": "Shown"}


@dataclasses.dataclass(frozen=True)
class Headline:
    """One comparison: prediction (with its uncertainty), measurement (with its standard error),
    the rule in words, its outcome and its kind (KINDS).

    kind: "reproduced" (two-sided: a published or derived number, |measured − predicted| within
    the rule's multiple of the combined standard error, or exactly equal for a count or a format's
    threshold), "consistent" (a bound or inequality; the rule states the margin), "identity" (a
    property of the sampler or the algebra, true for correct code whatever the physics: checked,
    never counted) or "shown" (no quantitative expectation: agrees is None)."""
    quantity: str
    measured: float
    measured_se: float
    predicted: float | str
    predicted_se: float
    source: str
    rule: str
    agrees: bool | None
    kind: str = "reproduced"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {self.kind!r}")
        if (self.kind == "shown") != (self.agrees is None):
            raise ValueError(f"agrees: expected None exactly for the shown kind, got {self.agrees!r} "
                             f"for kind {self.kind!r}")

    @property
    def label(self) -> str:
        """The outcome in words: "Reproduced", "Not reproduced", "Consistent", "Identity holds"..."""
        passed, failed = KINDS[self.kind]
        return passed if self.agrees is not False else failed

    @property
    def counted(self) -> bool:
        """Whether the headline is a result the summary counts (the Reproduced kind only)."""
        return self.kind == "reproduced"

    def sentence(self) -> str:
        """One sentence for the report's summary."""
        se = f" ± {self.measured_se:.3g}" if _finite(self.measured_se) and self.measured_se > 0 else ""
        pred = (f"{self.predicted:.4g}" + (f" ± {self.predicted_se:.2g}" if self.predicted_se else "")
                if isinstance(self.predicted, (int, float)) else str(self.predicted))
        return (f"{self.label}: {self.quantity} — measured {self.measured:.4g}{se}, "
                f"{'expected' if self.kind != 'shown' else 'for reference'} {pred} ({self.source}).")


def tally(heads) -> dict:
    """How many headlines of each kind passed, and of how many: {kind: (passed, total)}."""
    out = {}
    for kind in KINDS:
        of_kind = [h for h in heads if h.kind == kind]
        out[kind] = (sum(h.agrees is not False for h in of_kind), len(of_kind))
    return out


def _finite(x) -> bool:
    return isinstance(x, (int, float, np.floating)) and math.isfinite(x)


def t_multiplier(df, k=K_SIGMA) -> float:
    """The multiple of the standard error with the coverage of k normal sigmas (99.73 % for 3)
    when the SE comes from df degrees of freedom: Student's t quantile (df None: normal, k)."""
    if df is None or df >= 1000:
        return k
    from scipy import stats
    coverage = 2 * stats.norm.cdf(k) - 1
    return float(stats.t.ppf(0.5 + coverage / 2, df))


def test(quantity, measured, se, predicted, source, *, predicted_se=0.0, df=None,
         k=K_SIGMA, kind="reproduced") -> Headline:
    """Two-sided: |measured - predicted| <= m sqrt(se^2 + predicted_se^2), m = k or its t
    equivalent for df degrees of freedom.  kind: "reproduced", or "identity" for a property of
    the sampler or the algebra."""
    m = t_multiplier(df, k)
    combined = math.hypot(se, predicted_se)
    ok = abs(measured - predicted) <= m * combined
    z = abs(measured - predicted) / combined if combined else math.inf
    dof = f", t with {df} df" if df is not None and df < 1000 else ""
    rule = (f"|measured − predicted| ≤ {m:.2f} × combined SE {combined:.2g}{dof} "
            f"(here {z:.2f} SE)")
    if ok and z > k:  # within the t band only: say so, the test is weak there
        rule += f"; beyond {k:g} SE, it passes only through t with {df} df"
    return Headline(quantity, float(measured), float(se), float(predicted), float(predicted_se),
                    source, rule, bool(ok), kind)


def in_interval(quantity, measured, se, lo, hi, source, *, df=None, k=K_SIGMA,
                kind="reproduced") -> Headline:
    """Two-sided interval: lo - m se <= measured <= hi + m se (a prediction given as a range)."""
    m = t_multiplier(df, k)
    ok = lo - m * se <= measured <= hi + m * se
    rule = (f"{lo:.4g} − {m:.2f} SE ≤ measured ≤ {hi:.4g} + {m:.2f} SE (SE {se:.2g})" if se > 0
            else f"{lo:.4g} ≤ measured ≤ {hi:.4g}")
    return Headline(quantity, float(measured), float(se), f"[{lo:.4g}, {hi:.4g}]", 0.0, source,
                    rule, bool(ok), kind)


def exact(quantity, measured, predicted, source, *, kind="reproduced") -> Headline:
    """An exact prediction (a format's threshold, a count that must be 0): measured == predicted,
    no standard error and no tolerance."""
    return Headline(quantity, float(measured), 0.0, float(predicted), 0.0, source,
                    "exact: measured = predicted", bool(measured == predicted), kind)


def bound(quantity, measured, limit, source, rule, *, se=float("nan"), lower=False) -> Headline:
    """A one-sided bound or inequality, measured <= limit (measured >= limit when lower; the rule
    names what is maximised): the Consistent kind; the rule states the margin, limit − measured
    (measured − limit when lower), and the measurement's share of the limit."""
    margin = measured - limit if lower else limit - measured
    share = f", {measured / limit:.3g} of the limit" if limit not in (0, 0.0) and _finite(measured) else ""
    return Headline(quantity, float(measured), float(se), f"{'≥' if lower else '≤'} {limit:.4g}", 0.0,
                    source, f"{rule}; margin {'measured − limit' if lower else 'limit − measured'} = "
                    f"{margin:.3g}{share}", bool(measured >= limit if lower else measured <= limit),
                    kind="consistent")


def shown(quantity, measured, se, note, source) -> Headline:
    """A measured number with no quantitative expectation: shown, not judged."""
    return Headline(quantity, float(measured), float(se), note, 0.0, source,
                    "no quantitative prediction: shown, not judged", None, kind="shown")


def mean_se(values, axis=0):
    """Mean and standard error of the mean (ddof 1) along axis."""
    a = np.asarray(values, float)
    n = a.shape[axis]
    return a.mean(axis=axis), a.std(axis=axis, ddof=1) / math.sqrt(n)


def median_se(values):
    """Median and a distribution-free standard error: half the distance between the order
    statistics at ranks R/2 -+ sqrt(R)/2 (the median's 68 % confidence interval)."""
    a = np.sort(np.asarray(values, float).ravel())
    R = len(a)
    lo, hi = int(max(0, math.floor(R / 2 - math.sqrt(R) / 2))), int(min(R - 1, math.ceil(R / 2 + math.sqrt(R) / 2)))
    return float(np.median(a)), float((a[hi] - a[lo]) / 2)


def median_ratio(a, b, *, seed=0, confidence=0.95, resamples=2000):
    """median(a) / median(b) of paired rows (a[i] and b[i] from the same draw, or the same round
    of a timing loop), its percentile bootstrap interval at ``confidence`` and its bootstrap
    standard error: (ratio, (low, high), se).  scipy.stats.bootstrap with paired=True resamples
    whole pairs, so whatever a pair shares (its draw, its moment of a drifting machine) stays
    together.  Fewer than 3 pairs: nothing to resample, the interval is the estimate and the
    standard error nan.  seed: an int or a numpy Generator."""
    from scipy import stats
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ratio = float(np.median(a) / np.median(b))
    if len(a) < 3:
        return ratio, (ratio, ratio), math.nan
    found = stats.bootstrap((a, b), lambda x, y, axis=-1: np.median(x, axis=axis) /
                            np.median(y, axis=axis), paired=True, vectorized=True,
                            confidence_level=confidence, n_resamples=resamples,
                            method="percentile", random_state=np.random.default_rng(seed))
    interval = found.confidence_interval
    return ratio, (float(interval.low), float(interval.high)), float(found.standard_error)


def fit_slope(x, y):
    """Least-squares slope of y on x, its standard error from the residuals, and the degrees of
    freedom (len - 2; the SE is 0 with two points)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3:
        return float((y[-1] - y[0]) / (x[-1] - x[0])), 0.0, 0
    coef, cov = np.polyfit(x, y, 1, cov=True)
    return float(coef[0]), float(math.sqrt(cov[0, 0])), len(x) - 2


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


# --- files ----------------------------------------------------------------------------------

def results_dir(name: str) -> pathlib.Path:
    path = RESULTS / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _user_mode() -> int:
    """The mode a file the user creates gets: 0666 less the umask (mkstemp would leave 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path, data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename: readers never see half a file.
    The file gets the ordinary mode of a file the user writes (0666 less the umask)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _user_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_csv(path, rows: list[dict]) -> None:
    """rows: dicts, written as a CSV whose header is the union of their keys (first-seen order)."""
    buffer = io.StringIO()
    if rows:
        columns = list(dict.fromkeys(key for row in rows for key in row))
        writer = csv.DictWriter(buffer, fieldnames=columns, restval="")
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


def finish(name, config, start, rows, figures, headlines, summary, *, tables=(), **extra) -> Result:
    """Write data.csv and meta.json (the charts are already saved) and build the Result."""
    folder = results_dir(name)
    write_csv(folder / "data.csv", rows)
    write_meta(folder / "meta.json", config, time.perf_counter() - start,
               headlines=[dataclasses.asdict(h) for h in headlines], **extra)
    return Result(summary=summary, headlines=headlines, figures=figures, rows=rows,
                  tables=list(tables), extra=extra)


def conduct(name, config, measure, headlines, charts, rows, summary=None, meta=None,
            tables=None) -> Result:
    """The life of a numerics study: measure(config) -> m, then headlines(m, config),
    charts(m, config, figures), rows(m, config) for data.csv, tables(m, config) for the report,
    the summary text and extra meta.json entries.

    BLAS runs on one thread throughout: the studies multiply many small matrices, where
    OpenBLAS's thread hand-off costs more than it gains (the depth study took 34.6 s with two
    threads and 4.5 s with one on a loaded 2-core machine)."""
    from experiments import timing
    with timing.blas_threads(1):
        start = time.perf_counter()
        m = measure(config)
        heads = headlines(m, config)
        figures = []
        charts(m, config, figures)
        text = summary(m, heads, config) if summary else "\n".join(h.sentence() for h in heads)
        return finish(name, config, start, rows(m, config), figures, heads, text,
                      tables=tables(m, config) if tables else (), **(meta(m) if meta else {}))


# --- charts ---------------------------------------------------------------------------------

def pyplot():
    """matplotlib.pyplot on the headless Agg backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path) -> None:
    """Save a matplotlib figure as PNG, atomically, and close it."""
    plt = pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def save(fig, name, filename, caption, figures):
    """Save a chart into results/NAME/filename and remember it, with its caption, for the report."""
    path = results_dir(name) / filename
    save_figure(fig, path)
    figures.append((path, caption))


def figure(ncols=1, width=5.2, height=4.0, nrows=1):
    """A figure with nrows x ncols axes (returned as a flat list, row by row), grid on."""
    plt = pyplot()
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


def progress(iterable=None, **kwargs):
    """A tqdm progress bar on stderr (silent when GRADLAB_QUIET is set, as in the test suite)."""
    from tqdm.auto import tqdm
    kwargs.setdefault("disable", bool(os.environ.get("GRADLAB_QUIET")))
    kwargs.setdefault("leave", False)
    return tqdm(iterable, **kwargs)
