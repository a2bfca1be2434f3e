"""Calibration: correct kernels checked over many seeds, shapes and hard inputs; 0 alarms.

Three kinds of case, each a list of independent tasks (``checks.parallel.map_tasks``), every
task seeded by its own description (row, dtype, case, seed), so any worker gives the same result:

* ``shapes``: every row x dtype over ``seeds`` seeds, each at one of 8 shapes (the registry's
  default sizes and 7 random ones, ``shape_pool``).
* edge shapes (``EDGES``): B = 1, T = 1, H = 1, S != T, D = H (heads of width 1) and the bench's
  large training-step size, each for every row whose domain allows it.
* ill-conditioned inputs (``ILL``): a dominant softmax class, logits beyond 60 (softmax's
  large-logit branch), near-constant rows under RMS and layer normalisation, near-cancelling
  sums in a linear layer, peaked attention.

For each check it records the worst error of each leg pair as a fraction of its tolerance; a
correct kernel must never reach 1 (a false alarm).  ``python -m checks calibrate --write-docs``
writes the tables into docs/tolerances.md.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from checks.parallel import map_tasks
from checks.verdict import Kind

N_SHAPES = 8      # shapes drawn per calibration run; each costs one compilation per oracle
EDGE_SEEDS = 20   # seeds per row x dtype x edge shape
ILL_SEEDS = 50    # seeds per row x dtype x ill-conditioned case
LARGE_SEEDS = 2   # seeds at the bench's large size (seconds per check)
SHAPES = "random shapes"

# the bench's large training step (experiments/bench.py, STEP_SIZES["large"]), S = T
LARGE = {"B": 32, "T": 64, "S": 64, "D": 256, "H": 8, "F": 1024, "V": 12}
EDGES = {
    "B = 1": {"B": 1},
    "T = 1": {"T": 1},
    "H = 1": {"H": 1},
    "S != T": {"T": 2, "S": 7},
    "D = H": {"D": 4, "H": 4},
    "large (bench)": LARGE,
}
# rows that the large size does not suit: the model fixes its own widths and its element-wise
# finite differences would run the whole model at B 32 x T 64 once per parameter element
NOT_LARGE = ("model",)


# --- ill-conditioned inputs: module-level transforms (picklable by name) -------------------

def _dominant_class(rng, inputs, params):
    """One class of every row 12 above the others: probabilities near 1 and near 0."""
    x = inputs[0].astype(np.float64)
    n = x.shape[-1]
    hot = rng.integers(0, n, x.shape[:-1])
    x = x + 12.0 * (np.arange(n) == hot[..., None])
    return [x.astype(inputs[0].dtype)] + inputs[1:], params


def _beyond_60(rng, inputs, params):
    """Logits shifted by +-65: every row takes softmax's large-logit branch (|logit| >= 60)."""
    x = inputs[0].astype(np.float64)
    shift = 65.0 * rng.choice([-1.0, 1.0], x.shape[:-1] + (1,))
    return [(x + shift).astype(inputs[0].dtype)] + inputs[1:], params


def _near_constant(rng, inputs, params):
    """Rows 2 + 1e-3 noise: normalisation subtracts or divides nearly equal numbers."""
    x = inputs[0].astype(np.float64)
    return [(2.0 + 1e-3 * x).astype(inputs[0].dtype)] + inputs[1:], params


def _cancelling(rng, inputs, params):
    """x W + b nearly cancels: rows close to one x0, and b = -x0 W (terms O(1), sums O(1e-3))."""
    x = inputs[0].astype(np.float64)
    x0 = rng.standard_normal(x.shape[-1])
    W = params["W"].astype(np.float64)
    x = x0 + 1e-3 * x
    b = -(x0 @ W)
    return ([x.astype(inputs[0].dtype)] + inputs[1:],
            {**params, "b": b.astype(params["b"].dtype)})


def _peaked(rng, inputs, params):
    """Inputs 4x larger: attention logits 16x larger, each query attends to one or two keys."""
    return [(4 * x).astype(x.dtype) if x.dtype.kind == "f" else x for x in inputs], params


# name -> (rows, transform)
ILL = {
    "dominant class": (("softmax", "cross_entropy"), _dominant_class),
    "logits beyond 60": (("softmax", "cross_entropy"), _beyond_60),
    "near-constant rows": (("rms_norm", "layernorm"), _near_constant),
    "near-cancelling sums": (("linear",), _cancelling),
    "peaked attention": (("mha", "mha-causal", "mhca"), _peaked),
}


# --- one check's margins, and their merge --------------------------------------------------

@dataclasses.dataclass
class Margin:
    """The worst fractions of tolerance one layer x dtype x case reached."""
    layer: str
    dtype: str
    case: str = SHAPES
    checks: int = 0
    false_alarms: int = 0
    fd_kinks: int = 0             # tensors where FD was unreliable (a kink) and was set aside
    forward: float = 0.0          # forward error / tol
    hand_autodiff: float = 0.0    # hand vs autodiff / tol
    hand_fd: float = 0.0          # hand vs FD / max(tol, tol_fd)
    autodiff_fd: float = 0.0      # autodiff vs FD / tol_fd
    bias: float = 0.0             # the aggregate test: worst |bias| / band (checks.aggregate)
    first_alarm: str = ""

    def add(self, report, where):
        self.checks += 1
        self.forward = max(self.forward, _finite(report.forward_score))
        for t in report.tensors:
            self.hand_autodiff = max(self.hand_autodiff, _finite(t.score))
            if not np.isnan(t.bias_score):
                self.bias = max(self.bias, _finite(t.bias_score))
            if t.verdict is not None and t.verdict.kind is Kind.FD_SET_ASIDE:
                self.fd_kinks += 1
                continue
            self.hand_fd = max(self.hand_fd, _frac(t.hand_vs_fd, max(t.tol, t.tol_fd)))
            self.autodiff_fd = max(self.autodiff_fd, _frac(t.autodiff_vs_fd, t.tol_fd))
        if not report.ok:
            self.false_alarms += 1
            self.first_alarm = self.first_alarm or f"{where}\n{report}"
        return self

    def merge(self, other: "Margin") -> "Margin":
        """Both calibrations' checks together (the first alarm of the first that has one)."""
        return dataclasses.replace(
            self, checks=self.checks + other.checks,
            false_alarms=self.false_alarms + other.false_alarms,
            fd_kinks=self.fd_kinks + other.fd_kinks,
            forward=max(self.forward, other.forward),
            hand_autodiff=max(self.hand_autodiff, other.hand_autodiff),
            hand_fd=max(self.hand_fd, other.hand_fd),
            autodiff_fd=max(self.autodiff_fd, other.autodiff_fd),
            bias=max(self.bias, other.bias),
            first_alarm=self.first_alarm or other.first_alarm)

    @property
    def worst(self):
        return max(self.forward, self.hand_autodiff, self.hand_fd, self.autodiff_fd, self.bias)


def _finite(x):
    return float(x) if np.isfinite(x) else float("inf")


def _frac(err, tol):
    return float(err / tol) if np.isfinite(err) else float("inf")


# --- shapes --------------------------------------------------------------------------------

def random_sizes(rng) -> dict:
    """A size set the registry's makers accept: D = H P even, any B, T, S, F, V >= 1."""
    H = int(rng.choice([1, 2, 4]))
    P = int(rng.choice([2, 4, 6, 8]))
    return {"B": int(rng.integers(1, 5)), "T": int(rng.integers(1, 9)),
            "S": int(rng.integers(1, 7)), "H": H, "D": H * P, "F": int(rng.integers(4, 33)),
            "V": int(rng.integers(2, 13))}


def within(sizes, minimum) -> dict | None:
    """sizes raised to a row's minimum (D stays a multiple of H: every H drawn divides 4)."""
    if not minimum:
        return sizes
    from checks.registry import DEFAULT_SIZES
    s = {**DEFAULT_SIZES, **(sizes or {})}
    return {k: max(v, minimum.get(k, v)) for k, v in s.items()}


def _allows(sizes, minimum) -> bool:
    from checks.registry import DEFAULT_SIZES
    s = {**DEFAULT_SIZES, **(sizes or {})}
    return s["D"] % s["H"] == 0 and all(s[k] >= v for k, v in (minimum or {}).items())


def shape_pool(seed: int, n: int = N_SHAPES) -> list:
    rng = np.random.default_rng([seed, 0xCA1])
    return [None] + [random_sizes(rng) for _ in range(n - 1)]  # None: the default sizes


# --- tasks ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Task:
    """One check of the calibration, fully described (and so seeded) by its fields."""
    row: str
    dtype: str
    case: str
    seed: int
    sizes: tuple = ()        # (name, value) pairs; () is the registry's default sizes
    fd: str = "central"


def run_task(task: Task) -> Margin:
    """One calibration check: the margins of a single report."""
    from checks.registry import BY_NAME, run_row
    row = BY_NAME[task.row]
    sizes = dict(task.sizes) or None
    transform = ILL[task.case][1] if task.case in ILL else None
    report = run_row(row, np.dtype(task.dtype), seed=task.seed, sizes=sizes, fd=task.fd,
                     transform=transform)
    return Margin(task.row, task.dtype, task.case).add(
        report, f"{task.case}, seed {task.seed}, sizes {sizes or 'default'}")


def tasks_for(rows, dtypes, seeds: int, *, cases=(SHAPES,), fd="central", shape_seed=0,
              edge_seeds=EDGE_SEEDS, ill_seeds=ILL_SEEDS, large_seeds=LARGE_SEEDS) -> list:
    """Every check of a calibration, in table order."""
    from checks.registry import BY_NAME
    pool = shape_pool(shape_seed)
    rows = [BY_NAME[r] if isinstance(r, str) else r for r in rows]
    rows = [r for r in rows if fd != "complex" or r.analytic]
    tasks = []
    for case in cases:
        for row in rows:
            for dt in dtypes:
                if case == SHAPES:
                    for seed in range(seeds):
                        pick = np.random.default_rng([seed, 0x5EED]).integers(len(pool))
                        sizes = within(pool[int(pick)], row.min_sizes)
                        tasks.append(Task(row.name, dt, case, seed,
                                          tuple(sorted((sizes or {}).items())), fd))
                elif case in EDGES:
                    sizes = EDGES[case]
                    if not _allows(sizes, row.min_sizes) or (sizes is LARGE
                                                             and row.name in NOT_LARGE):
                        continue
                    n = large_seeds if sizes is LARGE else edge_seeds
                    tasks += [Task(row.name, dt, case, seed, tuple(sorted(sizes.items())), fd)
                              for seed in range(n)]
                elif case in ILL:
                    if row.name not in ILL[case][0]:
                        continue
                    for seed in range(ill_seeds):
                        sizes = within(pool[seed % len(pool)], row.min_sizes)
                        tasks.append(Task(row.name, dt, case, seed,
                                          tuple(sorted((sizes or {}).items())), fd))
                else:
                    raise ValueError(f"unknown calibration case {case!r}; known: "
                                     f"{', '.join(ALL_CASES)}")
    return tasks


ALL_CASES = (SHAPES,) + tuple(EDGES) + tuple(ILL)


def calibrate(rows, dtypes, seeds: int, *, workers: int = 0, scheduler: str | None = None,
              fd: str = "central", shape_seed: int = 0, cases=(SHAPES,), progress=True,
              **seed_counts) -> list:
    """Margins per row x dtype x case (a list of ``Margin``, equal whatever runs the tasks).

    rows: registry rows or their names.  cases: names from ``ALL_CASES`` (default: the random
    shapes only).  workers / scheduler: as ``checks.parallel.map_tasks``."""
    tasks = tasks_for(rows, dtypes, seeds, cases=cases, fd=fd, shape_seed=shape_seed,
                      **seed_counts)
    singles = map_tasks(run_task, tasks, workers=workers, scheduler=scheduler,
                        desc="calibrating", progress=progress)
    merged = {}
    for m in singles:
        key = (m.layer, m.dtype, m.case)
        merged[key] = merged[key].merge(m) if key in merged else m
    return list(merged.values())


def calibrate_one(row_name: str, dtype: str, seeds: int, pool: list, fd: str = "central"):
    """One layer x dtype over ``seeds`` seeds, each at a shape drawn from the pool."""
    from checks.registry import BY_NAME, run_row
    row = BY_NAME[row_name]
    margin = Margin(row_name, dtype)
    for seed in range(seeds):
        pick = np.random.default_rng([seed, 0x5EED]).integers(len(pool))
        sizes = within(pool[int(pick)], row.min_sizes)
        margin.add(run_row(row, np.dtype(dtype), seed=seed, sizes=sizes, fd=fd),
                   f"seed {seed}, sizes {sizes or 'default'}")
    return margin


# --- tables --------------------------------------------------------------------------------

def _table(head, rows) -> str:
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: " | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
    return "\n".join([line(head), "-|-".join("-" * w for w in widths)] + [line(r) for r in rows])


def fraction(x: float) -> str:
    """A fraction of tolerance to 3 decimals, or to as many as keep one below 1 from reading as
    1.000 (a bound a correct kernel attains, as ties of the format's rounding make it)."""
    text = f"{x:.3f}"
    digits = 3
    while x < 1 and float(text) >= 1 and digits < 12:
        digits += 1
        text = f"{x:.{digits}f}"
    return text


def format_margins(margins) -> str:
    """One line per layer x dtype (x case, when several cases are shown)."""
    cases = len({m.case for m in margins}) > 1
    head = (("case",) if cases else ()) + (
        "layer", "dtype", "checks", "false alarms", "FD kinks", "forward", "hand-autodiff",
        "hand-FD", "autodiff-FD", "bias", "worst")
    rows = [((m.case,) if cases else ()) + (
        m.layer, m.dtype, str(m.checks), str(m.false_alarms), str(m.fd_kinks),
        fraction(m.forward), fraction(m.hand_autodiff), f"{m.hand_fd:.3g}",
        f"{m.autodiff_fd:.3g}", fraction(m.bias), fraction(m.worst)) for m in margins]
    return _table(head, rows)


def format_cases(margins) -> str:
    """One line per case x dtype: how many rows and checks, the alarms, the closest call."""
    groups = {}
    for m in margins:
        groups.setdefault((m.case, m.dtype), []).append(m)
    head = ("case", "dtype", "rows", "checks", "false alarms", "worst", "closest row")
    rows = []
    for (case, dtype), ms in groups.items():
        top = max(ms, key=lambda m: m.worst)
        rows.append((case, dtype, str(len(ms)), str(sum(m.checks for m in ms)),
                     str(sum(m.false_alarms for m in ms)), fraction(top.worst), top.layer))
    return _table(head, rows)


def summary(margins) -> str:
    worst = max((m.worst for m in margins), default=0.0)
    return (f"{sum(m.checks for m in margins)} checks, "
            f"{sum(m.false_alarms for m in margins)} false alarms; worst fraction of "
            f"tolerance {fraction(worst)}" + ("" if math.isfinite(worst) else " (non-finite)"))
