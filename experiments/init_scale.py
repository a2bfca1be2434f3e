"""init_scale: values growing or vanishing through repeated matrix products, and what centring and
normalising do (the article's numerics chapter).

x_{k+1} = W_k x_k for k = 1...K with fresh n x n matrices W_k of i.i.d. entries, std sigma.  Given
x_k, E|W x|^2 = n sigma^2 |x|^2 exactly, so the mean-square moves by the factor n sigma^2 per
product: it vanishes for the article's sigma = 0.1 at n = 32 (factor 0.32), holds for fan-in
sigma = 1/sqrt(n) (factor 1), and vanishes fast for GPT-2's residual-branch 0.02/sqrt(2L), which
is meant for a residual x + W x, where the factor is 1 + n sigma^2 ~ 1.  A uniform [0, 1) draw
(mean 1/2, a classic mistake) blows up along the all-ones direction and collapses every vector
onto it; centring each matrix (subtracting its global mean, as the article does) removes that
direction; RMS-normalising x after each product (the lab's rms_norm kernel) pins |x|^2/n at 1
whatever the scale.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

import kernels
from experiments import common

NAME = "init_scale"
TREATMENTS = ("raw", "centred", "normalised", "residual")


def scales(n, depth):
    """name -> (sampler of a (..., n, n) stack of matrices, entry std)."""
    gpt2 = 0.02 / math.sqrt(2 * depth)
    return {"article std 0.1": (lambda rng, shape: 0.1 * rng.standard_normal(shape), 0.1),
            "fan-in 1/sqrt(n)": (lambda rng, shape: rng.standard_normal(shape) / math.sqrt(n),
                                 1 / math.sqrt(n)),
            "GPT-2 0.02/sqrt(2L)": (lambda rng, shape: gpt2 * rng.standard_normal(shape), gpt2),
            "uniform [0, 1)": (lambda rng, shape: rng.random(shape), math.sqrt(1 / 12))}


@dataclasses.dataclass(frozen=True)
class Config:
    width: int = 32            # n: the article's d_model
    depth: int = 32            # K products (and GPT-2's L)
    vectors: int = 16          # vectors pushed through each chain
    trials: int = 64           # independent chains of matrices
    seed: int = 0              # seed of every draw

    def __post_init__(self):
        common.validate(self, ints={"width": 2, "depth": 1, "vectors": 2, "trials": 2, "seed": 0})


def chain(W, x, treatment):
    """Push x (m, n, v) through the products W (m, K, n, n) -> mean-square (K + 1,), per-product
    gain |W x|^2 / |x|^2 (m, K, v) and mean |cosine| between the vectors per chain (K + 1, m)."""
    if treatment == "centred":
        W = W - W.mean(axis=(2, 3), keepdims=True)                 # (m, K, n, n)
    K, n = W.shape[1], W.shape[2]
    ms, cos = [float((x * x).mean())], [mean_cosine(x)]
    gains = np.empty((W.shape[0], K, x.shape[2]))                  # (m, K, v)
    for k in range(K):
        y = W[:, k] @ x                                            # (m, n, v)
        gains[:, k] = (y * y).sum(axis=1) / (x * x).sum(axis=1)
        if treatment == "residual":
            y = x + y
        elif treatment == "normalised":
            y, _ = kernels.rms_norm_forward(y.transpose(0, 2, 1), {})   # (m, v, n) over features
            y = y.transpose(0, 2, 1)                                    # (m, n, v)
        x = y
        ms.append(float((x * x).mean()))
        cos.append(mean_cosine(x))
    return np.array(ms), gains, np.array(cos)                     # (K + 1,), (m, K, v), (K + 1, m)


def mean_cosine(x):
    """Mean |cosine| between distinct vectors (columns), per chain: (m, n, v) -> (m,).  Absolute,
    as vectors collapsing onto one line may point either way along it."""
    u = x / np.linalg.norm(x, axis=1, keepdims=True)              # (m, n, v)
    g = np.abs(u.transpose(0, 2, 1) @ u)                           # (m, v, v)
    v = x.shape[2]
    return (g.sum(axis=(1, 2)) - v) / (v * (v - 1))               # (m,)


def measure(config):
    rng = np.random.default_rng(config.seed)
    n, K = config.width, config.depth
    out = {}
    for name, (draw, std) in common.progress(scales(n, K).items(), desc=NAME):
        W = draw(rng, (config.trials, K, n, n))                    # (m, K, n, n)
        x0 = rng.standard_normal((config.trials, n, config.vectors))  # (m, n, v)
        for treatment in TREATMENTS:
            out[name, treatment] = chain(W, x0, treatment) + (std,)
    return out


def gain_theory(name, std, n):
    """E|W x|^2/|x|^2 for zero-mean entries: n sigma^2 (uniform: not zero-mean, depends on x)."""
    return n * std ** 2 if not name.startswith("uniform") else float("nan")


def _headlines(m, config):
    n, heads = config.width, []
    for name, (_, std) in scales(n, config.depth).items():
        if name.startswith("uniform"):
            continue
        gains = m[name, "raw"][1]                                  # (m, K, v)
        # one number per chain (the mean over its K products and v vectors) -> independent samples
        per_chain = gains.mean(axis=(1, 2))
        mean, se = per_chain.mean(), per_chain.std(ddof=1) / math.sqrt(len(per_chain))
        theory = gain_theory(name, std, n)
        heads.append(common.test(f"gain in |x|^2 per product, {name}, n = {n}", mean, se, theory,
                                 "E|Wx|² = n σ² |x|² (the sampler's variance)", df=len(per_chain) - 1,
                                 kind="identity"))
    # Uniform [0, 1) entries (mean mu = 1/2, variance s^2 = 1/12).  After a few products x settles
    # at 1 + delta: the row sums of W spread it off the ones direction by |delta|^2/|1|^2 =
    # s^2/(n mu^2), which the next product does not amplify.  Its gain is then
    # ((n mu)^2 + n s^2) / (1 + s^2/(n mu^2)) = (n mu)^2 to first order, the next term being of
    # order s^4/mu^2 (the prediction's uncertainty).  ((n mu)^2 + n s^2, the gain of x exactly on
    # the ones line, is 258.7 and the measurement rules it out.)
    late = m["uniform [0, 1)", "raw"][1][:, min(7, config.depth - 1):].mean(axis=(1, 2))   # (m,)
    heads.append(common.test(f"gain in |x|^2 per product, uniform [0, 1), products 8…{config.depth} "
                             "(collapsed onto the all-ones direction)", *common.mean_se(late),
                             (n / 2) ** 2, "(n μ)², μ = 1/2: the settled direction's gain, first order",
                             predicted_se=(1 / 12) ** 2 / (1 / 2) ** 2, df=len(late) - 1))
    cen, ref = m["uniform [0, 1)", "centred"][2][1], m["fan-in 1/sqrt(n)", "raw"][2][1]   # (m,) each
    # centred uniform entries are zero-mean i.i.d. like the Gaussian fan-in ones: same |cosine|
    heads.append(common.test("mean |cosine| after 1 product, uniform [0, 1) centred", cen.mean(),
                             math.sqrt(cen.var(ddof=1) / len(cen)), float(ref.mean()),
                             "zero-mean Gaussian matrices, measured in the same run",
                             predicted_se=math.sqrt(ref.var(ddof=1) / len(ref))))
    return heads


def _charts(m, config, figures):
    n, K = config.width, config.depth
    k = np.arange(K + 1)                                           # (K + 1,)
    fig, axes = common.figure(2, width=5.6, nrows=2)
    for ax, treatment in zip(axes, TREATMENTS):
        for i, (name, (_, std)) in enumerate(scales(n, K).items()):
            ax.semilogy(k, m[name, treatment][0], "o", color=f"C{i}", ms=3, label=name)
            g = gain_theory(name, std, n) if treatment != "centred" else n * std ** 2
            if treatment in ("raw", "centred") and not math.isnan(g):
                ax.semilogy(k, g ** k, "--", color=f"C{i}", lw=1, label=f"(n σ²)^k = {g:.3g}^k")
            elif treatment == "residual" and not math.isnan(g):
                ax.semilogy(k, (1 + g) ** k, "--", color=f"C{i}", lw=1, label=f"(1 + n σ²)^k")
        if treatment != "normalised":
            decade_ticks(ax)
        if treatment == "normalised":
            ax.axhline(1, color="k", ls="--", lw=1, label="theory 1")
            ax.set_yscale("linear")
            ax.set_ylim(0.8, 1.2)
        common.label(ax, f"{treatment}: x ← {'x + W x' if treatment == 'residual' else 'W x'}"
                  + (" (W centred)" if treatment == "centred" else "")
                  + (", then RMS norm" if treatment == "normalised" else ""),
                  "products k", "|x_k|²/n (input units²)")
    common.save(fig, NAME, "growth.png",
             f"Mean-square of vectors pushed through k products of {n} x {n} random matrices, for "
             "four init scales, with the theory (n σ²)^k dashed: the article's std 0.1 vanishes, "
             "fan-in holds, GPT-2's residual scale vanishes without its residual and holds with it; "
             "uniform [0, 1) explodes even after centring (its std is not scaled) and RMS "
             "normalisation pins everything at 1.", figures)
    fig, (ax,) = common.figure(1, width=6)
    for i, treatment in enumerate(("raw", "centred")):
        for j, name in enumerate(("uniform [0, 1)", "fan-in 1/sqrt(n)")):
            ax.plot(k, m[name, treatment][2].mean(axis=1), ("o-" if j == 0 else "s:"), color=f"C{i}", ms=3,
                    lw=1, label=f"{name}, {treatment}")
    ax.axhline(1, color="k", ls="--", lw=1, label="all vectors on one line")
    ax.axhline(math.sqrt(2 / (math.pi * n)), color="0.5", ls=":", lw=1,
               label="independent random vectors, √(2/(πn))")
    ax.set_ylim(0, 1.05)
    common.label(ax, "collapse onto the mean direction, and centring", "products k",
              "mean |cosine| between vectors (unitless)")
    common.save(fig, NAME, "centring.png",
             "Matrices with a non-zero mean (uniform [0, 1)) map every vector onto the all-ones "
             "direction within a product or two; centring each matrix by its global mean keeps "
             "the vectors as spread as zero-mean matrices do.", figures)


def decade_ticks(ax, most=8):
    """Log-axis ticks at whole multiples of a decade step that include 10^0, so that the line at 1
    is labelled where it is."""
    lo, hi = (math.log10(v) for v in ax.get_ylim())
    step = max(1, math.ceil((hi - lo) / most))
    ticks = [10.0 ** (step * k) for k in range(math.ceil(lo / step), math.floor(hi / step) + 1)]
    ax.set_yticks(ticks)
    ax.minorticks_off()


def _rows(m, config):
    return [{"scale": name, "treatment": t, "product": k, "mean_square": ms[k],
             "mean_abs_cosine": cos[k].mean(), "mean_gain": gains[:, k - 1].mean() if k else "",
             "theory_gain": gain_theory(name, std, config.width)}
            for (name, t), (ms, gains, cos, std) in m.items() for k in range(config.depth + 1)]


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, _headlines, _charts, _rows)
