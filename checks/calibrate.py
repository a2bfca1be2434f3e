"""Calibration: every registry row x dtype over many seeds and random shapes.

For each check it records the worst error of each leg pair as a fraction of its tolerance; a
correct kernel must never reach 1 (a false alarm).  ``python -m checks calibrate`` prints, per
layer and dtype, the worst fraction seen, which docs/tolerances.md quotes.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing

import numpy as np

from checks.verdict import Kind

N_SHAPES = 8  # shapes drawn per calibration run; each costs one compilation per oracle


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


def shape_pool(seed: int, n: int = N_SHAPES) -> list:
    rng = np.random.default_rng([seed, 0xCA1])
    return [None] + [random_sizes(rng) for _ in range(n - 1)]  # None: the default sizes


@dataclasses.dataclass
class Margin:
    """The worst fractions of tolerance one layer x dtype reached over the calibration."""
    layer: str
    dtype: str
    checks: int = 0
    false_alarms: int = 0
    fd_kinks: int = 0             # tensors where FD was unreliable (a kink) and was set aside
    forward: float = 0.0          # forward error / tol
    hand_autodiff: float = 0.0    # hand vs autodiff / tol
    hand_fd: float = 0.0          # hand vs FD / max(tol, tol_fd)
    autodiff_fd: float = 0.0      # autodiff vs FD / tol_fd
    first_alarm: str = ""

    def add(self, report, where):
        self.checks += 1
        self.forward = max(self.forward, _finite(report.forward_score))
        for t in report.tensors:
            self.hand_autodiff = max(self.hand_autodiff, _finite(t.score))
            if t.verdict is not None and t.verdict.kind is Kind.FD_SET_ASIDE:
                self.fd_kinks += 1
                continue
            self.hand_fd = max(self.hand_fd, _frac(t.hand_vs_fd, max(t.tol, t.tol_fd)))
            self.autodiff_fd = max(self.autodiff_fd, _frac(t.autodiff_vs_fd, t.tol_fd))
        if not report.ok:
            self.false_alarms += 1
            self.first_alarm = self.first_alarm or f"{where}\n{report}"

    @property
    def worst(self):
        return max(self.forward, self.hand_autodiff, self.hand_fd, self.autodiff_fd)


def _finite(x):
    return float(x) if np.isfinite(x) else float("inf")


def _frac(err, tol):
    return float(err / tol) if np.isfinite(err) else float("inf")


def calibrate_one(row_name: str, dtype: str, seeds: int, pool: list, fd: str = "central"):
    """One layer x dtype over ``seeds`` seeds, each at a shape drawn from the pool."""
    from checks.registry import BY_NAME, run_row
    row = BY_NAME[row_name]
    margin = Margin(row_name, dtype)
    pick = np.random.default_rng([seeds, 0x5EED])
    for seed in range(seeds):
        sizes = within(pool[int(pick.integers(len(pool)))], row.min_sizes)
        report = run_row(row, np.dtype(dtype), seed=seed, sizes=sizes, fd=fd)
        margin.add(report, f"seed {seed}, sizes {sizes or 'default'}")
    return margin


def calibrate(rows, dtypes, seeds: int, *, workers: int = 1, fd: str = "central",
              shape_seed: int = 0, progress=None):
    """Margins for every row x dtype; rows checked in parallel processes when workers > 1."""
    pool = shape_pool(shape_seed)
    jobs = [(row.name, dt) for row in rows for dt in dtypes
            if fd != "complex" or row.analytic]
    if workers <= 1:
        results = []
        for name, dt in jobs:
            results.append(calibrate_one(name, dt, seeds, pool, fd))
            if progress:
                progress(results[-1])
        return results
    context = multiprocessing.get_context("spawn")  # JAX does not survive a fork
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as ex:
        futures = [ex.submit(calibrate_one, name, dt, seeds, pool, fd) for name, dt in jobs]
        results = []
        for f in futures:
            results.append(f.result())
            if progress:
                progress(results[-1])
        return results


def format_margins(margins) -> str:
    head = ("layer", "dtype", "checks", "false alarms", "FD kinks", "forward", "hand-autodiff",
            "hand-FD", "autodiff-FD", "worst")
    rows = [(m.layer, m.dtype, str(m.checks), str(m.false_alarms), str(m.fd_kinks),
             f"{m.forward:.3f}",
             f"{m.hand_autodiff:.3f}", f"{m.hand_fd:.3g}", f"{m.autodiff_fd:.3g}",
             f"{m.worst:.3f}") for m in margins]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: " | ".join(c.ljust(w) for c, w in zip(r, widths))
    return "\n".join([line(head), "-|-".join("-" * w for w in widths)] + [line(r) for r in rows])
