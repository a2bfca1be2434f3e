"""attention_scaling: what the 1/sqrt(d) in attention buys, tested where the parametrisation
cannot decide the answer.

Logits.  One head of width d (4 to 256), n = 64 tokens, x ~ N(0, 1), W_Q and W_K N(0, 1/d).  For
two different tokens the unscaled logit q.k has mean 0 and mean square exactly d (Vaswani et al.
2017, footnote 4), so the mean square of the off-diagonal logits over d is predicted to be 1 at
every width; each width is measured over independent weight draws, with their standard error.
With 1/sqrt(d) the logit std is about 1; with 1/d (muP) about 1/sqrt(d).

Softmax of Gaussian logits.  For n i.i.d. N(0, s^2) logits the entropy is ln n - s^2/2 plus the
first-order correction (s^2 e^{s^2} - (e^{s^2} - 1)/2)/n, the next term being of order e^{2 s^2}/n^2
(taken as the prediction's uncertainty); measured at exactly s = 1 for several n.  The expected
maximum of n standard normals (computed by quadrature, 2.34 at n = 64, not sqrt(2 ln n) = 2.88)
places the top logit for the max-probability curve.

Vaswani's "extremely small gradients", parametrisation-free.  The gradient with respect to the
logits of one softmax row, J g with J = diag(p) - p p^T and a random upstream gradient g, as a gain
|J g| / |g|: its median, quantiles and the fraction of rows below 1 % of the largest median, against
the logit std s, for n in {16, 64, 256, 1024}.  When the softmax saturates the gain is about
sqrt(2) e^{-s D} |g_1 - g_2| / |g|, D the gap between the two largest logits in units of s, so the
log median falls linearly in s with slope minus the median gap m_n of the two largest of n standard
normals (computed by quadrature).  The verdict compares the slope measured between s = 16 and 32
with -m_n (a derived number, at sigma = 16 ... 32, i.e. unscaled widths d = 256 ... 1024).  At
Vaswani's own d_k = 64 (sigma = 8) the headline is the measured ratio of the unscaled to the scaled
median gain, n = 64 random logits (bootstrap SE over rows): shown, since the claim gives no number.
The trained regime puts one key next to the query (k = rho q + sqrt(1 - rho^2) xi) and compares
unscaled, 1/sqrt(d) and 1/d logits at several widths.  The functional test trains one head with
Adam (which ignores the gradient's scale) to find, among n keys, the one its query is a noisy copy
of: steps to a target loss, scaled against unscaled logits, at several widths.  The two scalings
of a width share their seeds (initial weights and data), so each seed is a pair; a seed that does
not reach the target within the budget is censored at budget + 1: the paired difference then is a
bound, and the pairs are also counted by sign (unscaled slower, faster, tied; both censored is a
tie).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

import kernels
from experiments import common
from kernels.optim import adam_init, adam_step

NAME = "attention_scaling"
SCALINGS = {"none": 0.5, "1/sqrt(d)": 0.0, "1/d": -0.5}  # name -> exponent of d in c = d^e


@dataclasses.dataclass(frozen=True)
class Config:
    widths: tuple[int, ...] = (4, 8, 16, 32, 64, 128, 256)  # head widths d
    keys: int = 64                 # n: tokens, so n keys per query
    batch: int = 2                 # sequences per weight draw
    draws: int = 16                # independent weight draws per width
    sigma_max: float = 16.0        # the entropy sweep runs the logit std up to this (sqrt of the widest d)
    sigma_points: int = 40         # logit stds in the entropy sweep
    sweep_rows: int = 2000         # softmax rows per logit std in the sweep
    entropy_keys: tuple[int, ...] = (64, 256, 1024)  # n at which the entropy at s = 1 is measured
    entropy_rows: int = 20000      # rows for each of those
    grad_keys: tuple[int, ...] = (16, 64, 256, 1024)  # n of the logit-gradient test
    grad_sigmas: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0)  # logit stds s
    grad_rows: int = 8000          # softmax rows per (n, s)
    rho: float = 0.5               # trained regime: correlation of the matching key with its query
    adam_widths: tuple[int, ...] = (16, 64, 256)  # head widths of the functional test
    adam_seeds: int = 16           # seeds per width and scaling
    adam_keys: int = 16            # keys per query in the functional test
    adam_batch: int = 32           # queries per Adam step
    adam_rate: float = 1e-2        # Adam's learning rate
    adam_steps: int = 300          # step budget
    adam_target: float = 0.1       # loss (nats) to reach, as a running mean over 10 steps
    seed: int = 0                  # seed of every draw

    def __post_init__(self):
        common.validate(self, ints={"keys": 2, "batch": 1, "draws": 2, "sigma_points": 2,
                                    "sweep_rows": 2, "entropy_rows": 2, "grad_rows": 16,
                                    "adam_seeds": 2, "adam_keys": 2, "adam_batch": 1,
                                    "adam_steps": 10, "seed": 0},
                        tuples={"widths": 1, "entropy_keys": 2, "grad_keys": 2, "adam_widths": 1},
                        floats={"sigma_max": 0.05, "adam_rate": 0.0, "adam_target": 0.0})
        if not (len(self.grad_sigmas) >= 3 and all(b > a > 0 for a, b in
                                                    zip(self.grad_sigmas, self.grad_sigmas[1:]))):
            raise ValueError(f"grad_sigmas: expected 3 or more increasing positive stds, got {self.grad_sigmas}")
        if not 0 <= self.rho < 1:
            raise ValueError(f"rho: expected a correlation in [0, 1), got {self.rho}")


# --- closed forms ----------------------------------------------------------------------------

def entropy_theory(sigma, n, corrected=True):
    """Softmax entropy of n i.i.d. N(0, sigma^2) logits: ln n - sigma^2/2, plus the 1/n term."""
    s2 = np.asarray(sigma, float) ** 2
    h = np.log(n) - s2 / 2
    if corrected:
        h = h + (s2 * np.exp(s2) - (np.exp(s2) - 1) / 2) / n
    return h


def expected_max(n):
    """E[max of n standard normals], by quadrature."""
    from scipy import integrate, stats
    f = lambda y: y * n * stats.norm.pdf(y) * stats.norm.cdf(y) ** (n - 1)  # noqa: E731
    return float(integrate.quad(f, -12, 12, limit=200)[0])


def median_gap(n):
    """Median of the gap between the two largest of n standard normals, by quadrature:
    P(gap > x) = n * integral phi(y) Phi(y - x)^(n - 1) dy."""
    from scipy import integrate, optimize, stats

    def survival(x):
        return integrate.quad(lambda y: n * stats.norm.pdf(y) * stats.norm.cdf(y - x) ** (n - 1),
                              -12, 12, limit=200)[0]
    return float(optimize.brentq(lambda x: survival(x) - 0.5, 1e-6, 6.0))


def max_prob_theory(sigma, n):
    """Mean max probability, large n: exp(sigma M_n - sigma^2/2) / n with M_n the expected
    maximum of n standard normals, capped at 1."""
    sigma = np.asarray(sigma, float)
    return np.minimum(np.exp(sigma * expected_max(n) - sigma ** 2 / 2) / n, 1.0)


# --- measurements -----------------------------------------------------------------------------

def softmax_rows(logits):
    """Entropy (nats) and max probability per row, through the lab's softmax kernel: (R, n) ->
    two (R,) arrays."""
    p, _ = kernels.softmax_forward(logits, {})                       # (R, n)
    entropy = -(p * np.log(np.maximum(p, 1e-300))).sum(axis=-1)     # (R,)
    return entropy, p.max(axis=-1)


def logit_gradient_gain(logits, g):
    """|J g| / |g| per row, J the softmax Jacobian, through the lab's softmax backward:
    logits, g (R, n) -> (R,)."""
    _, cache = kernels.softmax_forward(logits, {})
    jg, _ = kernels.softmax_backward(g, cache)                       # (R, n) J g
    return np.linalg.norm(jg, axis=-1) / np.linalg.norm(g, axis=-1)


def width_point(rng, d, config):
    """Per weight draw at head width d: the unscaled off-diagonal logits' mean square over d, and
    per scaling the mean entropy and max probability of all rows.  Returns {key: (draws,)}."""
    n = config.keys
    off = ~np.eye(n, dtype=bool)                                     # (n, n) pairs of distinct tokens
    out = {"ms_over_d": []} | {f"{k}_{name}": [] for name in SCALINGS for k in ("entropy", "max_prob", "std")}
    for _ in range(config.draws):
        WQ, WK = (rng.standard_normal((d, d)) / math.sqrt(d) for _ in range(2))   # (d, d) each
        x = rng.standard_normal((config.batch, n, d))                # (B, n, d)
        raw = (x @ WQ) @ (x @ WK).transpose(0, 2, 1)                 # (B, n, n) unscaled q.k
        out["ms_over_d"].append(float((raw[:, off] ** 2).mean() / d))
        for name, e in SCALINGS.items():
            logits = raw * (d ** e / math.sqrt(d))                   # (B, n, n)
            ent, mp = softmax_rows(logits.reshape(-1, n))
            out[f"entropy_{name}"].append(ent.mean())
            out[f"max_prob_{name}"].append(mp.mean())
            out[f"std_{name}"].append(logits[:, off].std())
    return {k: np.array(v) for k, v in out.items()}


def sigma_sweep(rng, config):
    """Entropy and max probability of softmax(sigma z), z ~ N(0, 1) over n keys, per sigma."""
    sigmas = np.linspace(0.05, config.sigma_max, config.sigma_points)         # (S,)
    z = rng.standard_normal((config.sweep_rows, config.keys))                 # (R, n)
    ent, mp = softmax_rows((sigmas[:, None, None] * z).reshape(-1, config.keys))
    shape = (len(sigmas), config.sweep_rows)
    return sigmas, ent.reshape(shape).mean(axis=1), mp.reshape(shape).mean(axis=1)


def entropy_at_one(rng, config):
    """Mean entropy and its SE at logit std exactly 1, per n in entropy_keys."""
    out = {}
    for n in config.entropy_keys:
        ent, _ = softmax_rows(rng.standard_normal((config.entropy_rows, n)))
        out[n] = common.mean_se(ent)
    return out


def gradient_sweep(rng, config):
    """The logit-gradient gain against the logit std for every n: {(n, sigma): gains (R,)}."""
    out = {}
    for n in config.grad_keys:
        z = rng.standard_normal((config.grad_rows, n))                 # (R, n) logits / sigma
        g = rng.standard_normal((config.grad_rows, n))                 # (R, n) upstream gradient
        for s in config.grad_sigmas:
            out[n, s] = logit_gradient_gain(s * z, g)
    return out


def trained_regime(rng, config):
    """Gains when one key is the query's match (k = rho q + sqrt(1 - rho^2) xi), per width and
    scaling (SCALINGS: unscaled, 1/sqrt(d), 1/d), n = keys: {(d, name): gains (R,)}."""
    out, R, n = {}, config.grad_rows // 4, config.keys
    for d in config.widths:
        q = rng.standard_normal((R, 1, d))                             # (R, 1, d)
        k = rng.standard_normal((R, n, d))                             # (R, n, d)
        k[:, 0] = config.rho * q[:, 0] + math.sqrt(1 - config.rho ** 2) * k[:, 0]
        raw = (q @ k.transpose(0, 2, 1))[:, 0]                         # (R, n) q.k
        g = rng.standard_normal((R, n))
        for name, e in SCALINGS.items():
            out[d, name] = logit_gradient_gain(raw * (d ** e / math.sqrt(d)), g)
    return out


def median_ratio(a, b, rng):
    """median(a) / median(b) for rows measured on the same draws (paired), and its bootstrap
    standard error, the rows resampled together (``common.median_ratio``)."""
    ratio, _, se = common.median_ratio(a, b, seed=rng)
    return ratio, se


def race_pairs(race, d, budget):
    """The paired race at width d: unscaled - scaled steps per seed (censored seeds at budget + 1,
    so a censored pair's difference is a bound), and the sign counts (unscaled slower, faster,
    tied; a pair with both censored is a tie), and the censored counts (scaled, unscaled)."""
    s, u = race[d, True], race[d, False]
    diff = u.astype(float) - s
    return diff, (int((diff > 0).sum()), int((diff < 0).sum()), int((diff == 0).sum())), \
        (int((s > budget).sum()), int((u > budget).sum()))


def head_loss(params, keys, xq, target, scale):
    """The functional test's loss and its hand gradient.  Logits scale (x_q W_Q).(x_j W_K), the
    cross-entropy of their softmax against the target key, each seed (leading axis) its own mean.
    params: W_Q, W_K (S, d, d); keys (S, B, n, d); xq (S, B, d); target (S, B).  Returns (the
    loss summed over seeds, grads (S, d, d) each, probabilities (S, B, n))."""
    S = keys.shape[0]
    q = xq @ params["WQ"]                                             # (S, B, d) queries
    u = q @ params["WK"].transpose(0, 2, 1)                           # (S, B, d) W_K q: k_j.q = x_j.u
    logits = scale * (keys @ u[..., None])[..., 0]                    # (S, B, n)
    loss, cache = kernels.cross_entropy_forward(logits, target, {})
    (dlogits, _), _ = kernels.cross_entropy_backward(1.0, cache)      # (S, B, n), mean over S B
    du = scale * S * (dlogits[..., None, :] @ keys)[..., 0, :]        # (S, B, d), each seed's own mean
    grads = {"WQ": xq.transpose(0, 2, 1) @ (du @ params["WK"]),       # (S, d, d) through q = xq W_Q
             "WK": du.transpose(0, 2, 1) @ q}                         # (S, d, d) through u = W_K q
    return float(loss) * S, grads, cache.probs


def adam_race(rng, config, d, c):
    """Steps for one head to reach the target loss under Adam, per seed (adam_steps + 1 when it
    does not): logits c (x_q W_Q).(x_j W_K) / sqrt(d), c = 1 (scaled) or sqrt(d) (unscaled); the
    query is a noisy copy of one of n random keys, the loss the cross-entropy of the attention
    weights against that key.  The seeds run side by side on a leading axis."""
    S, B, n = config.adam_seeds, config.adam_batch, config.adam_keys
    params = {"WQ": rng.standard_normal((S, d, d)) / math.sqrt(d),       # (S, d, d)
              "WK": rng.standard_normal((S, d, d)) / math.sqrt(d)}
    state = adam_init(params)
    scale = c / math.sqrt(d)
    history, reached = [], np.full(S, config.adam_steps + 1)            # (S,) step reached, or budget + 1
    for step in range(config.adam_steps):
        keys = rng.standard_normal((S, B, n, d))                          # (S, B, n, d)
        target = rng.integers(0, n, (S, B))                               # (S, B)
        xq = keys[np.arange(S)[:, None], np.arange(B)[None, :], target]   # (S, B, d)
        xq = xq + 0.5 * rng.standard_normal(xq.shape)
        _, grads, probs = head_loss(params, keys, xq, target, scale)
        params, state = adam_step(params, grads, state, config.adam_rate)
        p = probs[np.arange(S)[:, None], np.arange(B)[None, :], target]   # (S, B)
        history.append(-np.log(np.maximum(p, 1e-300)).mean(axis=1))
        running = np.mean(history[-10:], axis=0)                          # (S,)
        reached = np.where((reached > config.adam_steps) & (running <= config.adam_target), step + 1, reached)
        if (reached <= config.adam_steps).all():
            break                                                          # every seed is there
    return reached


def measure(config):
    rng = np.random.default_rng(config.seed)
    bar = common.progress(total=len(config.widths) + 4, desc=NAME)
    widths = {}
    for d in config.widths:
        widths[d] = width_point(rng, d, config)
        bar.update(1)
    sweep = sigma_sweep(rng, config)
    entropy = entropy_at_one(rng, config)
    bar.update(1)
    grads = gradient_sweep(rng, config)
    bar.update(1)
    trained = trained_regime(rng, config)
    bar.update(1)
    # both scalings of a width start from the same seed: same weights, same data, paired
    race = {(d, scaled): adam_race(np.random.default_rng([config.seed, d]), config, d,
                                   1.0 if scaled else math.sqrt(d))
            for d in config.adam_widths for scaled in (True, False)}
    bar.update(1)
    bar.close()
    return {"widths": widths, "sweep": sweep, "entropy": entropy, "grads": grads,
            "trained": trained, "race": race,
            "gaps": {n: median_gap(n) for n in config.grad_keys}}


# --- tests, tables, charts --------------------------------------------------------------------

def decay_slope(gains, s1, s2):
    """Slope of the log median gain between logit stds s1 and s2, and its standard error (from
    the medians' order-statistic SEs, on the log scale)."""
    (m1, e1), (m2, e2) = common.median_se(np.log(gains[0])), common.median_se(np.log(gains[1]))
    return (m2 - m1) / (s2 - s1), math.hypot(e1, e2) / (s2 - s1)


def _headlines(m, config):
    heads = []
    d_top = max(config.widths)
    ms = m["widths"][d_top]["ms_over_d"]
    heads.append(common.test(f"unscaled logits: mean square of q·k over d, d = {d_top}",
                             *common.mean_se(ms), 1.0, "the sampler: E(q·k)² = d for N(0, 1/d) weights "
                             "(Vaswani et al. 2017, fn. 4, as an assumption)", df=len(ms) - 1,
                             kind="identity"))
    n_top = max(config.entropy_keys)
    mean, se = m["entropy"][n_top]
    heads.append(common.test(f"softmax entropy at logit std 1, n = {n_top}", mean, se,
                             float(entropy_theory(1.0, n_top)),
                             "ln n − σ²/2 + (σ²e^{σ²} − (e^{σ²} − 1)/2)/n, next term ~ e^{2σ²}/n²",
                             predicted_se=math.e ** 2 / n_top ** 2))
    s1, s2 = config.grad_sigmas[-3], config.grad_sigmas[-1]
    for n in config.grad_keys:
        slope, se = decay_slope((m["grads"][n, s1], m["grads"][n, s2]), s1, s2)
        heads.append(common.test(f"decay rate of the median logit gradient in σ, n = {n} "
                                 f"(σ = {s1:g} … {s2:g})", slope, se, -m["gaps"][n],
                                 "Vaswani et al. 2017 (saturation): minus the median top-two gap "
                                 "of n normals, by quadrature"))
    n64 = 64 if 64 in config.grad_keys else config.grad_keys[0]
    if 8.0 in config.grad_sigmas and 1.0 in config.grad_sigmas:
        ratio, se = median_ratio(m["grads"][n64, 8.0], m["grads"][n64, 1.0],
                                 np.random.default_rng(config.seed + 1))
        heads.append(common.shown(f"d_k = 64 (σ = 8), n = {n64} random logits: median logit-gradient gain, "
                                  "unscaled / 1/sqrt(d)", ratio, se, "Vaswani et al. 2017 give no number: "
                                  "'extremely small gradients' for large d_k",
                                  "the same rows at σ = 8 and σ = 1, bootstrap SE"))
    if 64 in config.widths:
        ratio, se = median_ratio(m["trained"][64, "none"], m["trained"][64, "1/sqrt(d)"],
                                 np.random.default_rng(config.seed + 2))
        heads.append(common.shown(f"d_k = 64, trained regime (ρ = {config.rho}): median gain, unscaled / "
                                  "1/sqrt(d)", ratio, se, "no published number",
                                  "one key correlated with its query; bootstrap SE"))
    for d in config.adam_widths:
        diff, (slower, faster, tied), (cs, cu) = race_pairs(m["race"], d, config.adam_steps)
        heads.append(common.shown(
            f"Adam steps to loss {config.adam_target}: unscaled − 1/sqrt(d), d = {d} (seeds paired; "
            f"unscaled slower in {slower}, faster in {faster}, tied in {tied}; censored {cs} / {cu})",
            *common.mean_se(diff), "no published number (Adam ignores the gradient's scale, not "
            "the softmax's saturation)", f"censored seeds count as budget + 1 = {config.adam_steps + 1}: "
            "the difference is then a bound"))
    return heads


def _tables(m, config):
    widths = [{"d": d, "mean square q·k / d": _pm(*common.mean_se(w["ms_over_d"])),
               **{f"entropy, {name}": _pm(*common.mean_se(w[f"entropy_{name}"])) for name in SCALINGS},
               **{f"logit std, {name}": _pm(*common.mean_se(w[f"std_{name}"])) for name in SCALINGS}}
              for d, w in m["widths"].items()]
    entropy = [{"n": n, "measured (σ = 1)": _pm(*v), "ln n − 1/2": float(entropy_theory(1.0, n, False)),
                "with the 1/n term": float(entropy_theory(1.0, n)),
                "next term, order e²/n²": math.e ** 2 / n ** 2} for n, v in m["entropy"].items()]
    grads = []
    for n in config.grad_keys:
        peak = max(np.median(m["grads"][n, s]) for s in config.grad_sigmas)
        for s in config.grad_sigmas:
            gains = m["grads"][n, s]
            low = float((gains < 0.01 * peak).mean())
            grads.append({"n": n, "σ": s, "median |Jg|/|g|": _pm(*common.median_se(gains)),
                          "10 %": float(np.quantile(gains, 0.1)), "90 %": float(np.quantile(gains, 0.9)),
                          "rows below 1 % of the peak": _pm(low, math.sqrt(low * (1 - low) / len(gains)))})
    trained = [{"d": d, **{f"median gain, {name}": _pm(*common.median_se(m["trained"][d, name]))
                           for name in SCALINGS}}
               for d in config.widths]
    race = [{"d": d, "steps, 1/sqrt(d)": _pm(*common.mean_se(m["race"][d, True])),
             "steps, unscaled": _pm(*common.mean_se(m["race"][d, False])),
             "unscaled − scaled (paired; censored = budget + 1)":
                 _pm(*common.mean_se(race_pairs(m["race"], d, config.adam_steps)[0])),
             "pairs: unscaled slower / faster / tied": "{} / {} / {}".format(
                 *race_pairs(m["race"], d, config.adam_steps)[1]),
             "seeds not reaching the target (scaled / unscaled)":
                 f"{int((m['race'][d, True] > config.adam_steps).sum())} / "
                 f"{int((m['race'][d, False] > config.adam_steps).sum())}"}
            for d in config.adam_widths]
    return [(f"per width ({config.draws} weight draws each, ± SE)", widths),
            ("softmax entropy of n Gaussian logits at σ = 1", entropy),
            ("logit-gradient gain |J g|/|g| against the logit std σ (± SE)", grads),
            (f"trained regime: one key correlated with its query (ρ = {config.rho}), n = {config.keys}", trained),
            (f"Adam, steps to a running loss of {config.adam_target} nats ({config.adam_seeds} seeds, "
             f"{config.adam_keys} keys, budget {config.adam_steps})", race)]


def _pm(value, se):
    return f"{value:.4g} ± {se:.2g}"


def _charts(m, config, figures):
    n, d = config.keys, np.array(config.widths, float)
    fig, (a1, a2) = common.figure(2, width=5.4)
    for i, (name, e) in enumerate(SCALINGS.items()):
        std = [common.mean_se(m["widths"][w][f"std_{name}"]) for w in config.widths]
        a1.errorbar(d, [s for s, _ in std], yerr=[3 * se for _, se in std], fmt="o", capsize=2,
                    color=f"C{i}", label=f"{name}, measured (±3 SE)")
        a1.loglog(d, d ** e, "--", color=f"C{i}", lw=1, label=f"theory d^{e:+.1f}")
        ent = [common.mean_se(m["widths"][w][f"entropy_{name}"]) for w in config.widths]
        a2.errorbar(d, [v for v, _ in ent], yerr=[3 * se for _, se in ent], fmt="o-", capsize=2,
                    color=f"C{i}", label=name)
    a2.set_xscale("log")
    a2.axhline(math.log(n), color="k", ls=":", lw=1, label=f"ln n (uniform), n = {n}")
    common.label(a1, "logit std vs head width", "head width d", "std of logits (unitless)",
                 logx=True, logy=True)
    common.label(a2, f"softmax entropy over n = {n} keys (±3 SE)", "head width d", "entropy (nats)")
    common.save(fig, NAME, "logits_entropy.png",
                "Left: logit std against head width, unscaled (grows as sqrt(d)), with 1/sqrt(d) "
                "(flat at 1) and with 1/d (shrinks as 1/sqrt(d)). Right: the mean softmax entropy "
                "per row; unscaled logits lower it as d grows, 1/d drives it to ln n.", figures)

    sigmas, ent, mp = m["sweep"]
    top = expected_max(n)
    fig, (b1, b2) = common.figure(2)
    b1.plot(sigmas, ent, "-", color="0.4", lw=2, label="measured (Gaussian logits)")
    b1.plot(sigmas, np.maximum(entropy_theory(sigmas, n, False), 0), "k--", lw=1, label="ln n − σ²/2")
    b2.plot(sigmas, mp, "-", color="0.4", lw=2, label="measured (Gaussian logits)")
    small = sigmas <= top                      # the closed form's own range (it peaks at sigma = M_n)
    b2.plot(sigmas[small], max_prob_theory(sigmas[small], n), "k--", lw=1,
            label=f"exp(σ M_n − σ²/2)/n, M_n = E max = {top:.2f}")
    for ax, key in ((b1, "entropy"), (b2, "max_prob")):
        for i, name in enumerate(SCALINGS):
            ax.plot([m["widths"][w][f"std_{name}"].mean() for w in config.widths],
                    [m["widths"][w][f"{key}_{name}"].mean() for w in config.widths], "o",
                    color=f"C{i}", ms=5, label=f"attention, {name} (d = {config.widths[0]}…{config.widths[-1]})")
        ax.set_xlim(0, max(config.sigma_max, 1.05 * max(m["widths"][w]["std_none"].mean()
                                                        for w in config.widths)))
    common.label(b1, f"entropy vs logit std, n = {n} keys", "logit std σ (unitless)", "entropy (nats)")
    common.label(b2, f"mean max probability, n = {n} keys", "logit std σ (unitless)", "max probability")
    common.save(fig, NAME, "freezing.png",
                "Softmax of n Gaussian logits of std σ: the entropy follows ln n − σ²/2 at small σ "
                "and bends away from it beyond σ ≈ 1.5. The max probability follows exp(σ M_n − σ²/2)/n, "
                "with M_n the expected maximum of n normals, only up to σ ≈ 1.5: the closed form takes "
                "the softmax's denominator to be n e^{σ²/2}, which fails once its largest terms dominate "
                "(drawn up to σ = M_n, its maximum). The points are the attention logits of the first "
                "chart at their measured std, every width shown.", figures)

    fig, (c1, c2) = common.figure(2, width=5.6)
    s = np.array(config.grad_sigmas)
    for i, nk in enumerate(config.grad_keys):
        med = np.array([np.median(m["grads"][nk, x]) for x in s])
        c1.semilogy(s, med, "o-", color=f"C{i}", ms=4, label=f"n = {nk}, median")
        c1.fill_between(s, [np.quantile(m["grads"][nk, x], 0.1) for x in s],
                        [np.quantile(m["grads"][nk, x], 0.9) for x in s], color=f"C{i}", alpha=0.12)
        c1.semilogy(s[-3:], med[-3] * np.exp(-m["gaps"][nk] * (s[-3:] - s[-3])), "k--", lw=1)
    for i, name in enumerate(SCALINGS):
        med = [common.median_se(m["trained"][w, name]) for w in config.widths]
        c2.errorbar(d, [v for v, _ in med], yerr=[3 * e for _, e in med], fmt="o-", capsize=2,
                    color=f"C{i}", label=f"{name}, trained regime (ρ = {config.rho}), ±3 SE")
    c2.set(xscale="log", yscale="log")
    c2.axvline(64, color="k", ls=":", lw=1, label="d_k = 64 (Vaswani et al.)")
    at_64 = ""
    if (64, 8.0) in m["grads"] and (64, 1.0) in m["grads"]:
        share = np.median(m["grads"][64, 8.0]) / np.median(m["grads"][64, 1.0])
        at_64 = (f"; at σ = 8 (Vaswani's d_k = 64, unscaled) the median is still {100 * share:.0f} % "
                 "of its σ = 1 value at n = 64")
    c1.set_xscale("log")
    c1.axvline(8.0, color="k", ls=":", lw=1, label="σ = 8: unscaled d_k = 64")
    common.label(c1, "logit gradient |J g|/|g| (band: 10–90 %)", "logit std σ (unitless)",
                 "gain (unitless)", legend="lower left")
    common.label(c2, f"trained regime, n = {n}: median gain", "head width d", "gain (unitless)")
    common.save(fig, NAME, "logit_gradient.png",
                "Left: the gradient a softmax row passes to its logits, per unit of upstream gradient, "
                "against the logit std σ; beyond σ ≈ 4 the median falls exponentially, at the rate of "
                "minus the median gap between the two largest of n normals (dashed)" + at_64 + ". Right: with one "
                "key correlated with its query, unscaled logits saturate much faster with width; 1/sqrt(d) "
                "and 1/d stay put.", figures)

    fig, (e1,) = common.figure(1, width=6)
    for i, scaled in enumerate((True, False)):
        stats = [common.mean_se(m["race"][w, scaled]) for w in config.adam_widths]
        e1.errorbar(config.adam_widths, [v for v, _ in stats], yerr=[3 * se for _, se in stats],
                    fmt="o-", capsize=3, color=f"C{i}", label="1/sqrt(d)" if scaled else "unscaled")
    e1.axhline(config.adam_steps + 1, color="k", ls=":", lw=1, label="budget (not reached)")
    common.label(e1, f"Adam: steps to loss {config.adam_target} (±3 SE over {config.adam_seeds} seeds)",
                 "head width d", "steps", logx=True)
    e1.set_xticks(config.adam_widths, [str(w) for w in config.adam_widths])
    e1.minorticks_off()
    common.save(fig, NAME, "adam.png",
                "Steps one attention head needs under Adam to learn to find the key its query copies, "
                "with and without the 1/sqrt(d) scaling, per width (the two scalings share their seeds; a "
                "seed that misses the budget counts as budget + 1).", figures)


def _rows(m, config):
    rows = [{"part": "width", "d": d, "draw": i, **{k: float(v[i]) for k, v in w.items()}}
            for d, w in m["widths"].items() for i in range(config.draws)]
    rows += [{"part": "sweep", "sigma": s, "entropy": e, "max_prob": p} for s, e, p in zip(*m["sweep"])]
    rows += [{"part": "logit gradient", "n": n, "sigma": s, "median": float(np.median(g)),
              "q10": float(np.quantile(g, 0.1)), "q90": float(np.quantile(g, 0.9))}
             for (n, s), g in m["grads"].items()]
    rows += [{"part": "adam", "d": d, "scaled": scaled, "seed": i, "steps": int(v)}
             for (d, scaled), steps in m["race"].items() for i, v in enumerate(steps)]
    return rows


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, _headlines, _charts, _rows, tables=_tables)
