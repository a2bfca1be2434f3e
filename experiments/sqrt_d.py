"""sqrt_d: why attention divides by sqrt(d) -- the article's study of products of random matrices.

The article's protocol (docs/article.md): for each n, draw two n x n N(0, 1) matrices, centre
each by its global mean, multiply; record the standard deviation s (ddof 0) and |mean| of the
product's entries, optionally after dividing by sqrt(n); average over 1000 trials.  Here the scaled
and unscaled columns come from the same draws (the article's came from different ones), so each
article column is compared once, with the difference's standard error: the lab's and the
article's (a mean over the same number of trials of the same distribution, so the lab's SE
stands for it too), sqrt(2) times the lab's.

Closed forms, exact for every n: E[s^2] = n - 3/n + 2/n^2, E[mean^2] = (n - 1)/n^2 and
E|mean| = (2/(n sqrt(pi))) Gamma(n/2)/Gamma((n - 1)/2).  The mean of the centred product is
(1/n^2) sum_k a_k b_k, a the column sums of the centred A and b the row sums of the centred B:
each is N(0, n P) with P the projection off the ones vector, so the mean is z.w/n for independent
z, w ~ N(0, I_(n-1)), i.e. |z| g/n with g ~ N(0, 1), and E|z| = sqrt(2) Gamma(n/2)/Gamma((n-1)/2).
(The normal limit sqrt(2 (n - 1)/pi)/n is its large-n form.)  Also: the std of a dot product of
two N(0, 1) vectors of length d, which is sqrt(d).
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from experiments import common

NAME = "sqrt_d"

# The article's table (docs/article.md): n -> (std, |mean|, std scaled, |mean| scaled), each the
# mean over 1000 trials.  The only published numbers this study uses.
ARTICLE = {3: (1.37415, 0.34911, 0.77202, 0.18582),
           16: (3.96705, 0.19906, 0.99305, 0.04576),
           64: (7.9948, 0.10101, 0.99852, 0.01214),
           512: (22.62789, 0.03494, 0.99998, 0.00157)}
ARTICLE_SOURCE = "the article's table, 1000 trials (docs/article.md)"
CHUNK_BYTES = 1 << 19  # one batch of draws: at most 512 KiB per matrix stack (stays in cache)


@dataclasses.dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...] = (3, 16, 64, 512)  # matrix sizes n (the article's)
    trials: int = 1000             # trials per size (the article's)
    loop_trials: int = 30          # trials of the per-trial loop timed at the largest size (more at smaller ones)
    dot_lengths: tuple[int, ...] = (4, 16, 64, 256, 1024, 4096)  # lengths d of the dot products
    dot_trials: int = 2000         # dot products per length
    seed: int = 0                  # seed of every draw

    def __post_init__(self):
        common.validate(self, ints={"trials": 2, "loop_trials": 1, "dot_trials": 2, "seed": 0},
                     tuples={"sizes": 2, "dot_lengths": 1})


def expected_var(n):
    """E[s^2] of the centred product's entries (ddof 0), before scaling: n - 3/n + 2/n^2."""
    return n - 3 / n + 2 / n ** 2


def expected_abs_mean(n):
    """E|mean| of the centred product's entries, exact at every n:
    (2/(n sqrt(pi))) Gamma(n/2)/Gamma((n - 1)/2) (module docstring)."""
    return 2 / (n * math.sqrt(math.pi)) * math.exp(math.lgamma(n / 2) - math.lgamma((n - 1) / 2))


def trial_stats(A, B):
    """Centre each matrix by its global mean, multiply, and return per-trial (std, |mean|).
    A, B: (m, n, n) -> two (m,) arrays.  The scaled columns are these divided by sqrt(n)."""
    A -= A.mean(axis=(1, 2), keepdims=True)             # (m, n, n) centred in place
    B -= B.mean(axis=(1, 2), keepdims=True)             # (m, n, n)
    C = A @ B                                           # (m, n, n)
    mean = C.mean(axis=(1, 2))                          # (m,)
    # ddof-0 variance in one pass: |C|^2/n^2 - mean^2 (mean^2 <= 1e-3 of it here: no cancellation)
    var = np.einsum("kij,kij->k", C, C) / C[0].size - mean ** 2   # (m,)
    return np.sqrt(var), np.abs(mean)                   # (m,), (m,)


def vectorised(rng, n, trials, bar=None):
    """All trials of one size in cache-sized batches of draws: (trials,) std and |mean|."""
    chunk = max(1, CHUNK_BYTES // (8 * n * n))
    stds, means = [], []
    for start in range(0, trials, chunk):
        m = min(chunk, trials - start)
        s, mu = trial_stats(rng.standard_normal((m, n, n)),   # (m, n, n) A ...
                            rng.standard_normal((m, n, n)))   # ... and B -> (m,), (m,)
        stds.append(s)
        means.append(mu)
        if bar is not None:
            bar.update(m)
    return np.concatenate(stds), np.concatenate(means)  # (trials,), (trials,)


def loop(rng, n, trials):
    """The same work one trial at a time, as the article's loop does it (for the timing only)."""
    out = np.empty((trials, 4))                          # (trials, 4)
    root = math.sqrt(n)
    for t in range(trials):
        A, B = rng.standard_normal((n, n)), rng.standard_normal((n, n))  # (n, n) each
        C = (A - A.mean()) @ (B - B.mean())              # (n, n)
        out[t] = C.std(), abs(C.mean()), (C / root).std(), abs((C / root).mean())
    return out


def dot_product_std(rng, lengths, trials):
    """std over trials of x . y for x, y of length d, N(0, 1), and its standard error (delta
    method from the sample's fourth moment: SE(s) = sqrt((m4 - s^4)/trials) / (2 s), which
    holds for the heavy tails of short dot products too): two (len(lengths),) arrays."""
    out = []
    for d in lengths:
        z = (rng.standard_normal((trials, d)) * rng.standard_normal((trials, d))).sum(axis=1)  # (trials,)
        z = z - z.mean()
        s2, m4 = float((z ** 2).mean()), float((z ** 4).mean())
        out.append((math.sqrt(s2), math.sqrt(max(m4 - s2 ** 2, 0.0) / trials) / (2 * math.sqrt(s2))))
    return np.array(out).T                                   # (2, lengths)


def time_both(config, n, repeats=2):
    """Seconds per trial of the vectorised study and of the per-trial loop, on the same number
    of trials, alternating, best of `repeats` (the least disturbed run, as timeit does).  The loop
    is timed on every trial where that is cheap and on fewer for large n: as many as keep
    trials x n^2 within loop_trials x max(sizes)^2 (30 trials at n = 512 by default)."""
    timed = min(config.trials, math.ceil(config.loop_trials * (max(config.sizes) / n) ** 2))
    best_vec = best_loop = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        vectorised(np.random.default_rng(config.seed + 1), n, timed)
        best_vec = min(best_vec, time.perf_counter() - start)
        start = time.perf_counter()
        loop(np.random.default_rng(config.seed + 1), n, timed)
        best_loop = min(best_loop, time.perf_counter() - start)
    return best_vec / timed, best_loop / timed, timed


def _table(config, rng):
    rows, timing = [], {}
    bar = common.progress(total=len(config.sizes) * config.trials, desc=f"{NAME} trials")
    for n in config.sizes:
        bar.set_postfix(n=n)
        std, mu = vectorised(rng, n, config.trials, bar)  # (trials,), (trials,)
        timing[n] = time_both(config, n)
        root, k = math.sqrt(n), config.trials
        row = {"n": n, "trials": k,
               "std": std.mean(), "std_se": std.std(ddof=1) / math.sqrt(k),
               "abs_mean": mu.mean(), "abs_mean_se": mu.std(ddof=1) / math.sqrt(k),
               "var": (std ** 2).mean(), "var_se": (std ** 2).std(ddof=1) / math.sqrt(k),
               "var_theory": expected_var(n),
               "mean_sq": (mu ** 2).mean(), "mean_sq_se": (mu ** 2).std(ddof=1) / math.sqrt(k),
               "mean_sq_theory": (n - 1) / n ** 2,
               "abs_mean_theory": expected_abs_mean(n)}
        row.update({"std_scaled": row["std"] / root, "std_scaled_se": row["std_se"] / root,
                    "abs_mean_scaled": row["abs_mean"] / root,
                    "abs_mean_scaled_se": row["abs_mean_se"] / root})
        if n in ARTICLE:
            row.update(zip(("article_std", "article_abs_mean", "article_std_scaled",
                            "article_abs_mean_scaled"), ARTICLE[n]))
        rows.append(row)
    bar.close()
    return rows, timing


def _headlines(rows, timing, config):
    heads = []
    for r in rows:
        n = r["n"]
        for key, what in (("std", "std"), ("abs_mean", "|mean|"), ("std_scaled", "std, scaled"),
                          ("abs_mean_scaled", "|mean|, scaled")):
            if f"article_{key}" in r:  # two means of 1000 trials: the difference's SE is sqrt(2) SE
                heads.append(common.test(f"{what} of the product, n = {n}", r[key], r[f"{key}_se"],
                                      r[f"article_{key}"], ARTICLE_SOURCE,
                                      predicted_se=r[f"{key}_se"]))
        heads.append(common.test(f"mean s^2, n = {n}", r["var"], r["var_se"], r["var_theory"],
                              "closed form n − 3/n + 2/n² (exact)"))
        heads.append(common.test(f"mean of mean^2, n = {n}", r["mean_sq"], r["mean_sq_se"],
                              r["mean_sq_theory"], "closed form (n − 1)/n² (exact)"))
        heads.append(common.test(f"E|mean| of the product against its exact form, n = {n}", r["abs_mean"],
                                 r["abs_mean_se"], r["abs_mean_theory"],
                                 "closed form (2/(n√π)) Γ(n/2)/Γ((n − 1)/2) (exact)"))
    return heads


def _table_rows(rows):
    """The per-size table of the report: each measured column ± SE beside its prediction."""
    pm = lambda r, k: f"{r[k]:.5g} ± {r[k + '_se']:.2g}"  # noqa: E731
    return [{"n": r["n"], "std": pm(r, "std"), "article std": r.get("article_std", ""),
             "|mean|": pm(r, "abs_mean"), "article |mean|": r.get("article_abs_mean", ""),
             "(2/(n√π))Γ(n/2)/Γ((n−1)/2)": r["abs_mean_theory"],
             "std scaled": pm(r, "std_scaled"), "article std scaled": r.get("article_std_scaled", ""),
             "|mean| scaled": pm(r, "abs_mean_scaled"),
             "article |mean| scaled": r.get("article_abs_mean_scaled", ""),
             "mean s²": pm(r, "var"), "n − 3/n + 2/n²": r["var_theory"],
             "mean mean²": pm(r, "mean_sq"), "(n − 1)/n²": r["mean_sq_theory"]} for r in rows]


def _charts(rows, dots, config, figures):
    n = np.array([r["n"] for r in rows], float)                      # (sizes,)
    grid = np.geomspace(n.min(), n.max(), 200)                         # (200,)
    fig, (ax1, ax2) = common.figure(2)
    for key, marker, lab in (("std", "o", "unscaled"), ("std_scaled", "s", "scaled by 1/sqrt(n)")):
        ax1.errorbar(n, [r[key] for r in rows], yerr=[3 * r[key + "_se"] for r in rows],
                     fmt=marker, capsize=3, label=f"measured, {lab} (±3 SE)")
    ax1.plot(grid, np.sqrt(expected_var(grid)), "k-", lw=1, label="sqrt(n - 3/n + 2/n²)")
    ax1.plot(grid, np.sqrt(expected_var(grid) / grid), "k--", lw=1, label="same / sqrt(n)")
    art = [r for r in rows if "article_std" in r]
    ax1.plot([r["n"] for r in art], [r["article_std"] for r in art], "x", color="C3", ms=9,
             label="article (unscaled)")
    ax1.plot([r["n"] for r in art], [r["article_std_scaled"] for r in art], "+", color="C3", ms=10,
             label="article (scaled)")
    common.label(ax1, f"std of entries of centred A·B ({config.trials} trials)",
              "matrix size n", "std of entries (unitless)", logx=True, logy=True)
    d = np.array(config.dot_lengths, float)                           # (lengths,)
    dots, dots_se = dots
    ax2.errorbar(d, dots, yerr=3 * dots_se, fmt="o", capsize=3, label="measured std of x·y (±3 SE)")
    ax2.set(xscale="log", yscale="log")
    ax2.loglog(d, np.sqrt(d), "k-", lw=1, label="theory sqrt(d)")
    ax2.errorbar(d, dots / np.sqrt(d), yerr=3 * dots_se / np.sqrt(d), fmt="s", capsize=3,
                 label="measured std of x·y / sqrt(d) (±3 SE)")
    ax2.axhline(1, color="k", ls="--", lw=1, label="theory 1")
    common.label(ax2, f"dot product of two N(0,1) vectors ({config.dot_trials} trials)",
              "length d", "std (unitless)")
    common.save(fig, NAME, "sqrt_d.png", "Left: std of the centred product's entries against n, "
             "unscaled (grows as sqrt(n)) and divided by sqrt(n) (flat at 1), with the exact "
             "expectation sqrt(E[s²]) (which exceeds E[s] by Jensen's inequality: visible at n = 3) "
             "and the article's numbers. Right: the std of a dot product of length d "
             "grows as sqrt(d); dividing by sqrt(d) makes it 1.", figures)


def measure(config):
    rng = np.random.default_rng(config.seed)
    rows, timing = _table(config, rng)
    return rows, timing, dot_product_std(rng, config.dot_lengths, config.dot_trials)  # (lengths,)


def speedup(timing, trials):
    """(loop seconds, vectorised seconds) for all trials, from the per-trial times."""
    return (sum(t_loop for _, t_loop, _ in timing.values()) * trials,
            sum(t_vec for t_vec, _, _ in timing.values()) * trials)


def _summary(m, heads, config):
    rows, timing, _ = m
    loop_total, vec_total = speedup(timing, config.trials)
    lines = [f"{'n':>5} {'std':>18} {'article':>9} {'|mean|':>16} {'article':>8} "
             f"{'std scaled':>17} {'article':>8}"]
    for r in rows:
        lines.append(f"{r['n']:>5} {r['std']:>9.5f} ± {r['std_se']:.5f} "
                     f"{r.get('article_std', float('nan')):>9.5f} "
                     f"{r['abs_mean']:>7.5f} ± {r['abs_mean_se']:.5f} "
                     f"{r.get('article_abs_mean', float('nan')):>8.5f} "
                     f"{r['std_scaled']:>8.5f} ± {r['std_scaled_se']:.5f} "
                     f"{r.get('article_std_scaled', float('nan')):>8.5f}")
    timed = ", ".join(f"{t[2]} at n = {n}" for n, t in timing.items())
    lines.append(f"timing (not a headline): for {config.trials} trials per size the vectorised study "
                 f"takes {vec_total:.2f} s and the per-trial loop {loop_total:.2f} s, ratio "
                 f"{loop_total / vec_total:.1f}x (both timed on the same trials, best of 2: {timed})")
    return "\n".join(lines)


def _meta(m):
    """Timings go to meta.json, not data.csv: they differ from run to run."""
    return {"timings": {str(n): {"vectorised_s_per_trial": a, "loop_s_per_trial": b,
                                 "loop_trials_timed": c} for n, (a, b, c) in m[1].items()}}


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, lambda m, c: _headlines(m[0], m[1], c),
                       lambda m, c, figs: _charts(m[0], m[2], c, figs),
                       lambda m, c: m[0] + [{"n": f"dot d={d}", "std": s, "std_se": e}
                                            for d, s, e in zip(c.dot_lengths, *m[2])],
                       summary=_summary, meta=_meta,
                       tables=lambda m, c: [("per size: measured ± SE beside the article and the "
                                             "closed forms", _table_rows(m[0])),
                                            ("dot products", [{"d": d, "std of x·y": f"{s:.5g} ± {e:.2g}",
                                                               "sqrt(d)": math.sqrt(d)}
                                                              for d, s, e in zip(c.dot_lengths, *m[2])])])
