"""rank_collapse: how fast self-attention merges its tokens, layer by layer and over depth, what
reaches W_Q as they merge, and the residual scaling alpha = L^-beta.

Tokens X (T x d) are written as their mean plus a residual: X = 1 xbar^T + R.  The measure of
collapse is res(X) = ||X - 1 xbar^T||_F / ||X||_F (0: every token the same).  Attention layers are
the lab's kernel (kernels.mha_forward, one head), weights N(0, 1/fan_in), no norm, no feed-forward.

Rate (Dong et al. 2021).  Dong et al. prove that pure self-attention (no skip connections, no
MLP) loses rank doubly exponentially with depth: each layer's residual is bounded by a constant
times the cube of the residual before it, so after L layers res is of order res_0^(3^L).  Two
tests.  One layer: inputs X = 1 xbar^T + eps R0 for eps from 1e-3 to 1e-1, slope of log res(out)
against log res(in), predicted 3 (expanding the softmax around equal tokens: logit differences
O(|R|), the query-dependent part of A X the product of three residuals, O(|R|^3)).  Over depth:
a stack of pure attention layers from tokens with res about 0.45; for every layer with res_l <=
0.2 (and res_(l+1) above the float64 floor, 1e-13), log res_(l+1) is fitted against log res_l
over all layers and draws: the layer-to-layer exponent, predicted 3, and the per-layer log-ratio
log res_(l+1) / log res_l, which approaches 3 from below as res falls (the constant's share of it
vanishing).

Gradient (Noci et al. 2022).  Noci et al. state that under rank collapse the gradients of the
queries and keys vanish while the values' do not.  The order is the lab's expansion: the logit
gradient J g is O(|R|) (J removes what is common to the keys, and the values differ by O(|R|)),
and the query gradient multiplies it by the keys' spread, O(|R|): |dL/dW_Q| = O(res^2), for a
random upstream gradient.  |dL/dW_V| = O(1) holds by the algebra (W_V enters linearly): an
Identity.  Tests: the slopes of log |dW_Q| and log |dW_V| against log res(in), 2 and 0.

Depth limit (Noci et al. 2022).  Noci et al. scale the residual branch by 1/sqrt(L) so that the
stack has a limit as L grows.  Stacks X <- X + alpha SA(X) of L = 4, 16, 64 layers with
alpha = L^-beta for beta in 0 ... 1, from tokens that share a common part (X = 2 m + R, m and
the rows of R N(0, 1), R centred: res(X) about 0.45); the same inputs enter every depth and every
beta, so the comparisons over L are paired by input.  Per beta: the slope of the output's res
against log L, per draw, mean and SE.  At beta = 1/2 the layers' random increments add up to a
variance independent of L: slope 0 (Reproduced, two-sided).  Below 1/2 the stack merges more
tokens the deeper it is (slope < 0); above it the stack tends to the identity (res stays at the
input's).  Chart: the mean token cosine against depth for each beta and without the residual
path, as in Noci et al.'s figure of cosine against depth.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

import kernels
from experiments import common
from experiments.depth import token_cosine

NAME = "rank_collapse"


@dataclasses.dataclass(frozen=True)
class Config:
    width: int = 32                # d, the token width
    tokens: int = 16               # T
    draws: int = 16                # independent weight (and input) draws
    epsilons: tuple[float, ...] = (1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1)  # input residual sizes
    depths: tuple[int, ...] = (4, 16, 64)  # stack depths L of the residual-scaling test
    betas: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  # residual scalings alpha = L^-beta
    pure_depth: int = 8            # layers of the pure-attention stack (no residual path)
    seed: int = 0                  # seed of every draw

    def __post_init__(self):
        common.validate(self, ints={"width": 2, "tokens": 3, "draws": 3, "seed": 0, "pure_depth": 2},
                        tuples={"depths": 1})
        if len(self.depths) < 2:
            raise ValueError(f"depths: expected at least 2 depths (a slope over L), got {self.depths}")
        if 0.5 not in self.betas or any(not 0 <= b <= 2 for b in self.betas) \
                or list(self.betas) != sorted(self.betas):
            raise ValueError(f"betas: expected increasing values in [0, 2] including 0.5, got {self.betas}")
        if len(self.epsilons) < 3 or any(not 0 < e < 1 for e in self.epsilons) \
                or list(self.epsilons) != sorted(self.epsilons):
            raise ValueError(f"epsilons: expected 3 or more increasing sizes in (0, 1), got {self.epsilons}")


def residual(x):
    """res(X) = ||X - 1 xbar^T||_F / ||X||_F per sequence: (B, T, d) -> (B,)."""
    centred = x - x.mean(axis=1, keepdims=True)                      # (B, T, d)
    return np.linalg.norm(centred, axis=(1, 2)) / np.linalg.norm(x, axis=(1, 2))


def attention_params(rng, d):
    """One head, every weight N(0, 1/fan_in)."""
    return {k: rng.standard_normal((1, d, d)) / math.sqrt(d) for k in ("WQ", "WK", "WV")} | \
        {"WO": rng.standard_normal((d, d)) / math.sqrt(d)}


def one_layer(rng, config):
    """For each draw: res(in), res(out), |dW_Q|, |dW_V| at every epsilon: dict of (draws, eps)."""
    d, T = config.width, config.tokens
    out = {k: np.empty((config.draws, len(config.epsilons))) for k in ("res_in", "res_out", "dWQ", "dWV")}
    for i in range(config.draws):
        params = attention_params(rng, d)
        mean = rng.standard_normal((1, 1, d))                        # (1, 1, d) the common token
        r0 = rng.standard_normal((1, T, d))
        r0 -= r0.mean(axis=1, keepdims=True)                         # (1, T, d) centred residual
        r0 *= math.sqrt(T * d) / np.linalg.norm(r0) * np.linalg.norm(mean) / math.sqrt(d)
        dout = rng.standard_normal((1, T, d))                        # (1, T, d) upstream gradient
        for j, eps in enumerate(config.epsilons):
            x = mean + eps * r0                                      # (1, T, d)
            y, cache = kernels.mha_forward(x, params)
            _, grads = kernels.mha_backward(dout, cache)
            out["res_in"][i, j], out["res_out"][i, j] = residual(x)[0], residual(y)[0]
            out["dWQ"][i, j] = np.linalg.norm(grads["WQ"])
            out["dWV"][i, j] = np.linalg.norm(grads["WV"])
    return out


def slopes(out, key):
    """Per draw, the least-squares slope of log key against log res(in): (draws,)."""
    return np.array([common.fit_slope(np.log(out["res_in"][i]), np.log(out[key][i]))[0]
                     for i in range(len(out["res_in"]))])


def stack_inputs(rng, config):
    """One input per draw, (draws, 1, T, d): a common token 2 m plus a centred N(0, 1) residual."""
    m = 2 * rng.standard_normal((config.draws, 1, 1, config.width))
    r = rng.standard_normal((config.draws, 1, config.tokens, config.width))
    return m + r - r.mean(axis=2, keepdims=True)


def stack(rng, config, inputs, L, alpha, residual_path=True):
    """res and the mean token cosine after each of L layers of X <- X + alpha SA(X) (or SA(X)
    without the residual path), per draw, from the given inputs (draws, 1, T, d): two
    (draws, L + 1) arrays."""
    d = config.width
    res, cos = np.empty((config.draws, L + 1)), np.empty((config.draws, L + 1))
    for i in range(config.draws):
        x = inputs[i]                                                # (1, T, d)
        res[i, 0], cos[i, 0] = residual(x)[0], token_cosine(x)
        for l in range(L):
            y, _ = kernels.mha_forward(x, attention_params(rng, d))
            x = x + alpha * y if residual_path else y                # (1, T, d)
            res[i, l + 1], cos[i, l + 1] = residual(x)[0], token_cosine(x)
    return res, cos


FLOOR = 1e-13  # res below this is float64 rounding of rank-one tokens (about 2e-16 at T = 16)


def layer_pairs(res, top=0.2):
    """(res_l, res_(l+1)) of every layer of a pure-attention stack with res_l <= top and
    res_(l+1) above FLOOR, and the layer index l: three flat arrays."""
    a, b = res[:, :-1], res[:, 1:]                                   # (draws, L) each
    keep = (a <= top) & (b >= FLOOR)
    layer = np.broadcast_to(np.arange(a.shape[1]), a.shape)
    return a[keep], b[keep], layer[keep]


def depth_slopes(depth, config, beta):
    """Per draw, the slope of the output's res against log L at residual scaling L^-beta:
    (draws,), the depths paired by input."""
    logL = np.log(np.array(config.depths, float))
    final = np.stack([depth[L, beta][0][:, -1] for L in config.depths], axis=1)   # (draws, Ls)
    return np.array([common.fit_slope(logL, row)[0] for row in final])


def measure(config):
    rng = np.random.default_rng(config.seed)
    layer = one_layer(rng, config)
    depth, inputs = {}, stack_inputs(rng, config)
    for L in common.progress(config.depths, desc=NAME):
        for beta in config.betas:
            depth[L, beta] = stack(rng, config, inputs, L, L ** -beta)
    pure = stack(rng, config, inputs, config.pure_depth, 1.0, False)
    return layer, depth, pure


def _headlines(m, config):
    layer, depth, pure = m
    df = config.draws - 1
    heads = [common.test("one attention layer: exponent of res(out) against res(in) (ε = "
                         f"{min(config.epsilons):g} … {max(config.epsilons):g})",
                         *common.mean_se(slopes(layer, "res_out")), 3.0,
                         "Dong et al. 2021: each layer's residual bounded by a constant × the cube of "
                         "its input's", df=df)]
    a, b, _ = layer_pairs(pure[0])
    slope, se, pairs_df = common.fit_slope(np.log(a), np.log(b))
    heads.append(common.test(f"pure-attention stack: layer-to-layer exponent, log res_(l+1) against "
                             f"log res_l ({len(a)} layers with res ≤ 0.2, {config.draws} draws)", slope, se,
                             3.0, "Dong et al. 2021: rank collapses doubly exponentially with depth, "
                             "res_L ~ res_0^(3^L)", df=pairs_df))
    heads += [common.test("exponent of |dL/dW_Q| against res(in)", *common.mean_se(slopes(layer, "dWQ")),
                          2.0, "Noci et al. 2022: the query gradient vanishes under rank collapse; the "
                          "order 2 is the lab's expansion", df=df),
              common.test("exponent of |dL/dW_V| against res(in)", *common.mean_se(slopes(layer, "dWV")),
                          0.0, "Noci et al. 2022: the value gradient does not vanish (W_V enters "
                          "linearly: 0 by the algebra)", df=df, kind="identity")]
    span = f"L = {min(config.depths)} … {max(config.depths)}"
    heads.append(common.test(f"α = L^-1/2: slope of the output's res against log L ({span}, paired by "
                             "input)", *common.mean_se(depth_slopes(depth, config, 0.5)), 0.0,
                             "Noci et al. 2022: with the residual branch scaled by 1/sqrt(L) the stack "
                             "has a depth limit", df=df))
    low = [b for b in config.betas if b < 0.5]
    if low:
        mean, se = common.mean_se(depth_slopes(depth, config, max(low)))
        heads.append(common.bound(f"α = L^-{max(low):g}: slope of the output's res against log L "
                                  f"({span}), below the depth limit", mean, -common.K_SIGMA * se,
                                  "below β = 1/2 the stack merges more tokens the deeper it is",
                                  "slope ≤ −3 SE: negative beyond its noise", se=se))
    return heads


def _pm(mean_se):
    return f"{mean_se[0]:.4g} ± {mean_se[1]:.2g}"


def _tables(m, config):
    layer, depth, pure = m
    rows = [{"ε": eps, "res(in)": _pm(common.mean_se(layer["res_in"][:, j])),
             "res(out)": _pm(common.mean_se(layer["res_out"][:, j])),
             "|dW_Q|": _pm(common.mean_se(layer["dWQ"][:, j])),
             "|dW_V|": _pm(common.mean_se(layer["dWV"][:, j]))} for j, eps in enumerate(config.epsilons)]
    scan = [{"β": beta, **{f"res(out), L = {L}": _pm(common.mean_se(depth[L, beta][0][:, -1]))
                           for L in config.depths},
             "slope against log L (paired)": _pm(common.mean_se(depth_slopes(depth, config, beta)))}
            for beta in config.betas]
    a, b, layer_of = layer_pairs(pure[0])
    ratio = np.log(b) / np.log(a)
    pairs = [{"layer l → l + 1": f"{l} → {l + 1}", "layers used": int((layer_of == l).sum()),
              "res_l (geometric mean)": float(np.exp(np.log(a[layer_of == l]).mean())),
              "log res_(l+1) / log res_l": (_pm(common.mean_se(ratio[layer_of == l]))
                                            if (layer_of == l).sum() > 1 else f"{ratio[layer_of == l].mean():.4g}")}
             for l in sorted(set(layer_of.tolist()))]
    return [(f"one attention layer near collapse ({config.draws} draws, ± SE)", rows),
            (f"pure attention, layer to layer ({config.draws} draws, ± SE): the log-ratio approaches 3", pairs),
            (f"residual scaling α = L^-β: res after the stack ({config.draws} draws, ± SE; input res "
             f"{_pm(common.mean_se(depth[min(config.depths), config.betas[0]][0][:, 0]))})", scan)]


def _charts(m, config, figures):
    layer, depth, pure = m
    fig, axes = common.figure(2, width=5.4, nrows=2)
    a1, a2, a3, a4 = axes
    r_in = layer["res_in"].mean(axis=0)
    for key, label, color in (("res_out", "res(out)", "C0"), ("dWQ", "|dL/dW_Q|", "C1"),
                              ("dWV", "|dL/dW_V|", "C2")):
        mean = np.exp(np.log(layer[key]).mean(axis=0))
        a1.loglog(r_in, mean, "o", color=color, label=f"{label} (geometric mean)")
    for power, color in ((3, "C0"), (2, "C1"), (0, "C2")):
        base = np.exp(np.log(layer[{3: "res_out", 2: "dWQ", 0: "dWV"}[power]][:, -1]).mean())
        a1.loglog(r_in, base * (r_in / r_in[-1]) ** power, "--", color=color, lw=1, label=f"∝ res^{power}")
    common.label(a1, "one attention layer near collapse", "res(in) (unitless)", "res(out), gradient norm",
                 legend="lower right")
    a, b, _ = layer_pairs(pure[0])
    a2.loglog(a, b, "o", ms=3, label="pure attention: one layer to the next")
    grid = np.geomspace(a.min(), a.max(), 50)
    slope, _, _ = common.fit_slope(np.log(a), np.log(b))
    c = np.exp(np.mean(np.log(b) - 3 * np.log(a)))
    a2.loglog(grid, c * grid ** 3, "k--", lw=1, label="∝ res³ (Dong et al.)")
    common.label(a2, f"layer to layer, fitted exponent {slope:.2f}", "res_l (unitless)",
                 "res_(l+1) (unitless)", legend="upper left")
    L = max(config.depths)
    for i, beta in enumerate(config.betas):
        for ax, part in ((a3, 0), (a4, 1)):
            mean, se = common.mean_se(depth[L, beta][part])
            layers = np.arange(L + 1)
            ax.plot(layers, mean, "-", lw=1.2, color=f"C{i}", label=f"α = L^-{beta:g}" if beta else "α = 1")
            ax.fill_between(layers, np.maximum(mean - 3 * se, 1e-17), mean + 3 * se, color=f"C{i}", alpha=0.2)
    for ax, part in ((a3, 0), (a4, 1)):
        mean, _ = common.mean_se(pure[part])
        ax.plot(np.arange(len(mean)), np.maximum(mean, 1e-17) if part == 0 else mean, "ks:", ms=3,
                lw=1, label="no residual path")
    a3.set_xscale("symlog", linthresh=1)
    a3.set_yscale("log")
    common.label(a3, f"res through a stack of L = {L} (±3 SE)", "layer l", "res (unitless)",
                 legend="lower left")
    a4.set_xscale("symlog", linthresh=1)
    common.label(a4, f"mean token cosine through L = {L} (±3 SE)", "layer l", "cosine (unitless)",
                 legend="center left")
    common.save(fig, NAME, "rank_collapse.png",
                "Top left: one attention layer applied to nearly equal tokens: the output's residual falls "
                "as the cube of the input's, the gradient reaching W_Q as its square, the one reaching W_V "
                "not at all. Top right: pure attention, each layer's residual against the previous one's: "
                "the cube law (Dong et al.) layer after layer, down to rank one. Bottom: res and the mean "
                "token cosine through a stack of 64 layers for residual scalings α = L^-β (as in Noci et "
                "al.'s cosine against depth): β ≥ 1/2 keeps the tokens apart, β < 1/2 merges them with "
                "depth, no residual path merges them within a few layers.", figures)
    fig, (b1,) = common.figure(1, width=6.0)
    for i, beta in enumerate(config.betas):
        stats = [common.mean_se(depth[Ld, beta][0][:, -1]) for Ld in config.depths]
        b1.errorbar(config.depths, [v for v, _ in stats], yerr=[3 * e for _, e in stats], fmt="o-",
                    color=f"C{i}", capsize=3, label=f"α = L^-{beta:g}" if beta else "α = 1")
    b1.axhline(float(depth[min(config.depths), config.betas[0]][0][:, 0].mean()), color="k", ls=":",
               lw=1, label="input res (mean)")
    b1.set_xscale("log")
    b1.set_xticks(config.depths, [str(Ld) for Ld in config.depths])
    b1.minorticks_off()
    common.label(b1, "output res against depth, same inputs at every L (±3 SE)", "depth L",
                 "res after the stack (unitless)", legend="lower left")
    common.save(fig, NAME, "depth_limit.png",
                "The β-scan on a linear axis: the output's residual after L layers with the residual "
                "branch scaled by L^-β. At β = 1/2 (Noci et al.) it is the same at every depth; below, "
                "it falls with depth; above, it climbs back towards the input's.", figures)


def _rows(m, config):
    layer, depth, pure = m
    rows = [{"part": "one layer", "draw": i, "epsilon": eps, **{k: float(v[i, j]) for k, v in layer.items()}}
            for i in range(config.draws) for j, eps in enumerate(config.epsilons)]
    rows += [{"part": "stack", "L": L, "beta": beta, "layer": l, "res_mean": float(r[:, l].mean()),
              "cosine_mean": float(c[:, l].mean())} for (L, beta), (r, c) in depth.items()
             for l in range(r.shape[1])]
    rows += [{"part": "pure attention", "layer": l, "res_mean": float(pure[0][:, l].mean()),
              "cosine_mean": float(pure[1][:, l].mean())} for l in range(pure[0].shape[1])]
    return rows


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, _headlines, _charts, _rows, tables=_tables)
