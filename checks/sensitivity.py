"""Sensitivity, measured: the smallest relative error in a correct hand gradient the checker catches.

A check is run once on a correct kernel; then, for every gradient tensor, a relative error eps
is injected into the kernel's own gradient and judged by the same legs (``LayerCheck.judges``:
no leg runs again):

    tensor   g * (1 + eps) everywhere (a wrong constant, a missing 1 - rate ...)
    slice    g * (1 + eps) on one index of one axis (a row, a head, a token), the others exact
             (tensors of rank 2 or more: a vector's slice is an element)
             (a tensor or slice carried by fewer than BIAS_MIN_ELEMENTS elements pools nothing
             for the aggregate test: the element pattern measures it)
    element  g_i * (1 + eps) at one element

The injected gradient is rounded to the checked dtype, as a kernel's own would be.  For the
slice and element patterns the hardest case is reported: along every axis the slice with the
smallest norm, and of three elements (the largest, the median and the smallest |g_i|) the one
caught last.  Slices and elements below FLOOR = 0.1 x the median magnitude are set aside: an
entry that cancels to nearly zero carries the rounding error of its much larger terms, so a
relative error of it says nothing about the checker (its absolute error is what the element-wise
tolerance bounds, and ``python -m checks calibrate``'s cancellation cases test that).

The smallest eps caught is found by bisection on log10 eps (caught is monotone in eps: a larger
error of the same shape exceeds the same element-wise tolerance further), to 1/240 of a decade
(1 %: a threshold near the final rounding's u reads as u, not as the next step of a coarse grid).

    python -m checks sensitivity [--layer NAME ...] [--dtype float32|float16|bfloat16] [--large]

Goals (``GOALS``): float64 catches 1e-8 for every pattern; float32 catches 3e-6 for whole
tensors and 2e-5 for single slices (the aggregate test's), at the registry's sizes and at the
bench's large size; float16 1e-2
and bfloat16 5e-2 for whole tensors and single slices of a layer; the whole model in half
precision 1e-1 (float16) and 1 (bfloat16) for a whole tensor (``COMPOSED_GOALS``).  For scale,
torch.autograd.gradcheck's defaults (rtol 1e-3, atol 1e-5) catch about 1e-3.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from checks.parallel import map_tasks
from checks.aggregate import pools
from checks.tolerances import DEFAULT

PATTERNS = ("tensor", "slice", "element")
LOG_RANGE = (-17.0, 0.0)   # eps searched in [1e-17, 1]
STEPS = 12                 # bisection steps: 17 decades / 2^12 ~ 1/240 decade
FLOOR = 0.1                # slices and elements below FLOOR x the median magnitude: cancelled
GOALS = {("float64", "tensor"): 1e-8, ("float64", "slice"): 1e-8, ("float64", "element"): 1e-8,
         # the aggregate test (checks.aggregate) judges a whole tensor's and each slice's bias
         # against its own Monte Carlo band: 50 u and 335 u of float32
         ("float32", "tensor"): 3e-6, ("float32", "slice"): 2e-5,
         # a half-precision layer rounds what it returns once (kernels.precision), which the
         # tolerance allows at ULPS = 4 units: about 20 and 13 units of roundoff u
         ("float16", "tensor"): 1e-2, ("float16", "slice"): 1e-2,
         ("bfloat16", "tensor"): 5e-2, ("bfloat16", "slice"): 5e-2}
# A composition in half precision rounds at every layer boundary and in its residual sums: its
# gradients carry that noise (the rounding model's format part), which a correct model shows
# too (its errors reach about half the spread), so only a whole wrong tensor has a goal there:
# 205 u in float16 and, in bfloat16 (3 significant digits), a gradient off by a factor of 2.
COMPOSITIONS = ("model",)
# Goals the checker misses, measured and named, not hidden (docs/tolerances.md): (layer, dtype,
# sizes, pattern) -> why.  The tests and the docs' table accept a miss of these only.
KNOWN_GAPS = {
    ("model", "float32", "registry", "tensor"): "a composition's gradients carry every layer's "
                                                "rounding, over few elements at the registry's "
                                                "widths (3.7e-6 over enc1.attn.WQ's 18)",
}
COMPOSED_GOALS = {("float16", "tensor"): 1e-1, ("bfloat16", "tensor"): 1.0}


def _injected(g, region, eps, dtype):
    """g with (1 + eps) applied on region (a boolean mask or index), rounded to dtype."""
    bad = np.array(g, dtype=np.float64)
    bad[region] *= 1.0 + eps
    return bad.astype(dtype)


def threshold(judge, g, region, dtype) -> float:
    """The smallest eps (to 1/240 decade) whose injection on region the judge rejects;
    inf when even eps = 1 passes."""
    # whether it passes only: a disagreement fails whoever is blamed, so no evidence is examined
    caught = lambda log_eps: not judge.judge(_injected(g, region, 10.0 ** log_eps, dtype),
                                             evidence=False).ok
    lo, hi = LOG_RANGE
    if not caught(hi):
        return math.inf
    if caught(lo):
        return 10.0 ** lo
    for _ in range(STEPS):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if caught(mid) else (mid, hi)
    return 10.0 ** hi


def _typical(magnitudes):
    """Indices whose magnitude is at least FLOOR x the median of the non-zero magnitudes: what
    remains when the near-cancelled entries are set aside."""
    nonzero = magnitudes[magnitudes > 0]
    if nonzero.size == 0:
        return np.zeros(0, dtype=int)
    return np.flatnonzero(magnitudes >= FLOOR * np.median(nonzero))


def _pools(rows):
    """Per row of ``rows`` (..., N): is it carried by enough elements for the aggregate test to
    judge it ((sum g^2)^2 >= BIAS_MIN_ELEMENTS sum g^4, ``checks.aggregate``)?  A region that
    pools nothing is an element's question: the element pattern measures it."""
    return pools(np.sum(rows ** 2, axis=-1), np.sum(rows ** 4, axis=-1), DEFAULT)


def _slices(g):
    """Along every axis, the typical slice with the smallest norm (the hardest to see), among
    the slices that pool (``_pools``).  A slice fixes one index of a tensor of rank 2 or more;
    a vector's slice would be an element."""
    for axis in range(g.ndim if g.ndim >= 2 else 0):
        rows = np.moveaxis(g, axis, 0).reshape(g.shape[axis], -1)
        norms = np.sqrt(np.sum(rows ** 2, axis=1))
        keep = _typical(norms)
        keep = keep[_pools(rows)[keep]]
        if keep.size == 0:
            continue
        index = int(keep[np.argmin(norms[keep])])
        region = [slice(None)] * g.ndim
        region[axis] = index
        yield f"axis {axis} index {index}", tuple(region)


def _elements(g):
    """Three typical elements: the largest, the median and the smallest of |g|."""
    flat = np.abs(g).reshape(-1)
    keep = _typical(flat)
    if keep.size == 0:
        return
    order = keep[np.argsort(flat[keep])]
    for i in sorted({int(order[-1]), int(order[order.size // 2]), int(order[0])}):
        index = tuple(int(j) for j in np.unravel_index(i, g.shape))
        yield f"element {index}", index


def _regions(pattern, g):
    if pattern == "tensor":
        return [("whole", (Ellipsis,))] if _pools(g.reshape(-1)) else []
    return list(_slices(g) if pattern == "slice" else _elements(g))


@dataclasses.dataclass
class Sensitivity:
    """The smallest error caught for one row x dtype x sizes x pattern: the hardest tensor."""
    layer: str
    dtype: str
    sizes: str
    pattern: str
    eps: float = 0.0          # the smallest relative error caught in the hardest place
    where: str = ""           # tensor and region of that place
    baseline_ok: bool = True  # the correct kernel passed (else nothing is measured)

    @property
    def goal(self) -> float | None:
        if self.baseline_ok and not self.where:  # no tensor or slice pools: no such set
            return None
        if self.layer in COMPOSITIONS and self.dtype in ("float16", "bfloat16"):
            return COMPOSED_GOALS.get((self.dtype, self.pattern))
        return GOALS.get((self.dtype, self.pattern))

    @property
    def known_gap(self) -> bool:
        return (self.layer, self.dtype, self.sizes, self.pattern) in KNOWN_GAPS

    @property
    def met(self) -> bool | None:
        return None if self.goal is None else self.baseline_ok and self.eps <= self.goal


def measure(check, sizes_label="registry", patterns=PATTERNS) -> list:
    """Sensitivity per pattern of a check that has run (``LayerCheck.run``) on a correct kernel."""
    dtype = np.dtype(check.dtype)
    report = check.report()
    out = [Sensitivity(check.name, dtype.name, sizes_label, p, 0.0 if report.ok else math.inf,
                       baseline_ok=report.ok) for p in patterns]
    if not report.ok:
        return out
    check.settle_kinks()  # an injected error is judged as the check judges it: with the kinks
    for judge in check.judges.values():
        g = np.asarray(_hand(check, judge.key), dtype=np.float64)
        if not np.any(g):
            continue  # an identically zero gradient has no relative error to inject
        for result in out:
            for label, region in _regions(result.pattern, g):
                eps = threshold(judge, g, region, dtype)
                if eps > result.eps or not result.where:
                    result.eps, result.where = max(eps, result.eps), f"{judge.name} {label}"
    for judge in check.judges.values():  # leave the judges as the check left them
        judge.judge(_hand(check, judge.key))
    return out


def _hand(check, key):
    return check.dinputs[key] if isinstance(key, int) else check.dparams[key]


@dataclasses.dataclass(frozen=True)
class Task:
    row: str
    dtype: str
    sizes: tuple = ()   # () is the registry's default sizes
    seed: int = 0


def run_task(task: Task) -> list:
    from checks.registry import BY_NAME, layer_check
    check = layer_check(BY_NAME[task.row], np.dtype(task.dtype), seed=task.seed,
                        sizes=dict(task.sizes) or None)
    check.run()
    return measure(check, "large" if task.sizes else "registry")


def tasks_for(rows, dtypes, *, large=False, seed=0) -> list:
    from checks.calibrate import LARGE, NOT_LARGE, _allows
    tasks = [Task(r.name, dt, (), seed) for r in rows for dt in dtypes]
    if large:
        tasks += [Task(r.name, dt, tuple(sorted(LARGE.items())), seed) for r in rows
                  for dt in dtypes if r.name not in NOT_LARGE and _allows(LARGE, r.min_sizes)]
    return tasks


def sensitivity(rows, dtypes, *, large=False, seed=0, workers=0, scheduler=None,
                progress=True) -> list:
    """Every row x dtype (x the large size) x pattern: a list of ``Sensitivity``."""
    tasks = tasks_for(rows, dtypes, large=large, seed=seed)
    results = map_tasks(run_task, tasks, workers=workers, scheduler=scheduler,
                        desc="sensitivity", progress=progress)
    return [s for per_task in results for s in per_task]


def _eps(x):
    return "not caught" if math.isinf(x) else f"{x:.1e}"


def format_sensitivity(results) -> str:
    from checks.calibrate import _table
    head = ("layer", "dtype", "sizes", "pattern", "smallest caught", "goal", "met",
            "hardest place")
    rows = [(s.layer, s.dtype, s.sizes, s.pattern,
             _eps(s.eps) if s.baseline_ok else "(correct kernel failed)",
             "" if s.goal is None else f"{s.goal:.0e}",
             "" if s.met is None else ("yes" if s.met else "NO"),
             s.where or "(none pools: see element)") for s in results]
    return _table(head, rows)


def summary(results) -> str:
    goals = [s for s in results if s.goal is not None]
    missed = [s for s in goals if not s.met]
    text = f"{len(goals) - len(missed)} of {len(goals)} goals met"
    if missed:
        text += "; missed: " + ", ".join(f"{s.layer} {s.dtype} {s.sizes} {s.pattern}"
                                         + (" (known)" if s.known_gap else "") for s in missed)
    return text
