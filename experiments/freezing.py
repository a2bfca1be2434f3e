"""freezing: the freezing transition of softmax attention (the random-energy model).

A softmax row over n keys with logits sigma z_j, z_j i.i.d. N(0, 1), is the Gibbs measure of
Derrida's random-energy model (1981) at inverse temperature sigma with n = e^N configurations.
Its participation ratio Y = sum_j p_j^2 (the chance that two keys drawn from the row are the same)
has a sharp limit as n grows: below sigma_c = sqrt(2 ln n) the weight spreads over many keys and
E Y -> 0 (E Y = e^(sigma^2)/n while 2 sigma < sigma_c); above it the row freezes on a few keys,
whose weights follow a Poisson-Dirichlet law with parameter m = sigma_c / sigma, and
E Y -> 1 - sigma_c / sigma (Derrida and Toulouse 1985; Mezard, Parisi and Virasoro 1985).

The limit is approached slowly: at finite n the effective freezing point is the spacing of the
largest logits, below sqrt(2 ln n) by a correction of relative order 1/ln n, so E Y at a fixed
sigma / sigma_c lies above its limit by about c / ln n.  Test: at sigma = k sigma_c (k = 2 and
3) E Y is measured for n = 64 ... 16384 (rows through the lab's softmax kernel, SE over rows),
fitted linearly in 1/ln n by weighted least squares, and the intercept (n -> infinity) is
compared with 1 - 1/k, two-sided; the fit's SE is scaled up by its Birge ratio sqrt(chi^2/dof)
when the line does not fit within the SEs.  The measured curves E Y against sigma / sigma_c are
drawn for each n beside the annealed e^(sigma^2)/n and the frozen 1 - sigma_c / sigma.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

import kernels
from experiments import common

NAME = "freezing"


@dataclasses.dataclass(frozen=True)
class Config:
    keys: tuple[int, ...] = (64, 256, 1024, 4096, 16384)  # n, keys per softmax row
    elements: int = 1 << 21        # rows x n per (n, sigma): rows = elements / n (at least rows_min)
    rows_min: int = 128            # fewest rows at any n
    multiples: tuple[float, ...] = (2.0, 3.0)  # sigma / sigma_c of the tests (> 1: the frozen phase)
    curve: tuple[float, ...] = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0, 1.25, 1.5, 2.0,
                                2.5, 3.0, 4.0)  # sigma / sigma_c drawn for every n
    seed: int = 0                  # seed of every draw

    def __post_init__(self):
        common.validate(self, ints={"elements": 1024, "rows_min": 8, "seed": 0},
                        tuples={"keys": (2, None)})
        if len(self.keys) < 3:
            raise ValueError(f"keys: expected 3 or more sizes (a line and its residuals), got {self.keys}")
        if not self.multiples or any(k <= 1 for k in self.multiples):
            raise ValueError(f"multiples: expected sigma / sigma_c values above 1, got {self.multiples}")
        if not self.curve or any(k <= 0 for k in self.curve):
            raise ValueError(f"curve: expected positive sigma / sigma_c values, got {self.curve}")


def sigma_c(n):
    """The random-energy model's freezing point for n keys: sqrt(2 ln n)."""
    return math.sqrt(2 * math.log(n))


def frozen_limit(multiple):
    """E sum p^2 as n -> infinity at sigma = multiple x sigma_c: 1 - 1/multiple above 1, 0 below."""
    return max(0.0, 1 - 1 / multiple)


def participation(z, sigma):
    """sum_j p_j^2 of softmax(sigma z) per row, through the lab's softmax kernel: (R, n) -> (R,)."""
    p, _ = kernels.softmax_forward(sigma * z, {})                    # (R, n)
    return (p * p).sum(axis=-1)


def measure(config):
    """{(n, multiple): (mean, se)} of sum p^2 over rows, for the tests' and the curve's
    multiples; the same rows z serve every sigma of an n."""
    rng = np.random.default_rng(config.seed)
    out = {}
    for n in common.progress(config.keys, desc=NAME):
        rows = max(config.rows_min, config.elements // n)
        z = rng.standard_normal((rows, n))                             # (R, n)
        for k in sorted(set(config.multiples) | set(config.curve)):
            out[n, k] = common.mean_se(participation(z, k * sigma_c(n)))
    return out


def extrapolate(m, config, multiple):
    """Weighted least squares of E sum p^2 against 1/ln n at one multiple: the intercept, its SE
    (scaled by the Birge ratio when chi^2/dof > 1), chi^2/dof and the slope."""
    x = np.array([1 / math.log(n) for n in config.keys])              # (K,)
    y = np.array([m[n, multiple][0] for n in config.keys])            # (K,)
    w = 1 / np.array([m[n, multiple][1] for n in config.keys]) ** 2   # (K,)
    A = np.stack([np.ones_like(x), x], axis=1)                        # (K, 2)
    cov = np.linalg.inv(A.T @ (w[:, None] * A))                       # (2, 2)
    coef = cov @ A.T @ (w * y)                                        # (2,)
    dof = len(x) - 2
    chi2 = float((w * (y - A @ coef) ** 2).sum() / dof)
    se = math.sqrt(cov[0, 0]) * math.sqrt(max(1.0, chi2))
    return float(coef[0]), se, chi2, float(coef[1])


def _headlines(m, config):
    heads = []
    for k in config.multiples:
        value, se, chi2, slope = extrapolate(m, config, k)
        heads.append(common.test(f"E Σp² at σ = {k:g} σ_c, extrapolated to n → ∞ in 1/ln n "
                                 f"(n = {min(config.keys)} … {max(config.keys)})", value, se,
                                 frozen_limit(k), "random-energy model, frozen phase: 1 − σ_c/σ "
                                 f"(Derrida 1981; Mézard, Parisi, Virasoro 1985); fit χ²/dof {chi2:.2f}, "
                                 f"slope {slope:.3g}"))
    return heads


def _tables(m, config):
    rows = []
    for k in sorted(set(config.multiples) | set(config.curve)):
        rows.append({"σ / σ_c": k, **{f"n = {n}": f"{m[n, k][0]:.4g} ± {m[n, k][1]:.2g}" for n in config.keys},
                     "limit n → ∞": frozen_limit(k)})
    fits = [{"σ / σ_c": k, **dict(zip(("intercept", "SE", "χ²/dof", "slope in 1/ln n"),
                                      extrapolate(m, config, k)))} for k in config.multiples]
    return [("E Σp² per n and σ / σ_c (± SE over rows)", rows),
            ("the fits in 1/ln n and their intercepts", fits)]


def _charts(m, config, figures):
    fig, (a1, a2) = common.figure(2, width=5.6)
    ks = np.array(sorted(set(config.multiples) | set(config.curve)))
    for i, n in enumerate(config.keys):
        mean = np.array([m[n, k][0] for k in ks])
        se = np.array([m[n, k][1] for k in ks])
        a1.errorbar(ks, mean, yerr=3 * se, fmt="o-", ms=3, lw=1, capsize=2, color=f"C{i}", label=f"n = {n}")
        annealed = ks <= 0.5                     # e^(sigma^2)/n holds while 2 sigma < sigma_c
        a1.plot(ks[annealed], np.exp((ks[annealed] * sigma_c(n)) ** 2) / n, ":", color=f"C{i}", lw=1)
    grid = np.linspace(1, ks.max(), 100)
    a1.plot(grid[1:], 1 - 1 / grid[1:], "k--", lw=1.5, label="n → ∞: 1 − σ_c/σ (0 below σ_c)")
    a1.axvline(1, color="0.5", lw=1)
    a1.set_yscale("log")
    a1.set_ylim(1e-4, 1.5)
    common.label(a1, "participation Σp² of a softmax row (±3 SE; dotted: exp(σ²)/n)",
                 "σ / σ_c, σ_c = sqrt(2 ln n)", "E Σp²", legend="lower right")
    x = np.array([1 / math.log(n) for n in config.keys])
    for i, k in enumerate(config.multiples):
        y = [m[n, k][0] for n in config.keys]
        e = [3 * m[n, k][1] for n in config.keys]
        value, se, _, slope = extrapolate(m, config, k)
        a2.errorbar(x, y, yerr=e, fmt="o", capsize=3, color=f"C{i}", label=f"σ = {k:g} σ_c (±3 SE)")
        line = np.linspace(0, x.max(), 50)
        a2.plot(line, value + slope * line, "-", color=f"C{i}", lw=1)
        a2.errorbar([0], [value], yerr=[3 * se], fmt="s", capsize=3, color=f"C{i}", mfc="none")
        a2.axhline(frozen_limit(k), color=f"C{i}", ls="--", lw=1, label=f"1 − 1/{k:g} = {frozen_limit(k):.3f}")
    common.label(a2, "extrapolation in 1/ln n (open squares: n → ∞)", "1 / ln n", "E Σp²",
                 legend="lower right")
    common.save(fig, NAME, "freezing.png",
                "Left: the participation ratio Σp² of softmax rows over n Gaussian logits of std σ, "
                "against σ / sqrt(2 ln n): near e^{σ²}/n at small σ (dotted), rising through the freezing "
                "point and towards the random-energy model's 1 − σ_c/σ above it, more sharply as n grows. "
                "Right: at σ = 2 and 3 σ_c the measured values fall linearly in 1/ln n; the intercepts "
                "(n → ∞) are compared with 1 − 1/k.", figures)


def _rows(m, config):
    return [{"n": n, "sigma_over_sigma_c": k, "sigma": k * sigma_c(n), "mean_sum_p2": v, "se": se}
            for (n, k), (v, se) in sorted(m.items())]


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, _headlines, _charts, _rows, tables=_tables)
