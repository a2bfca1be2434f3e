"""rank_collapse: how fast self-attention merges its tokens, what reaches W_Q as they merge, and
the 1/sqrt(L) residual scaling.

Tokens X (T x d) are written as their mean plus a residual: X = 1 xbar^T + R.  The measure of
collapse is res(X) = ||X - 1 xbar^T||_F / ||X||_F (0: every token the same).  Attention layers are
the lab's kernel (kernels.mha_forward, one head), weights N(0, 1/fan_in), no norm, no feed-forward.

Rate (Dong et al. 2021).  Pure attention loses rank doubly exponentially: the residual after one
layer is bounded by a constant times the cube of the residual before it.  Expanding the softmax
around equal tokens gives the same order: the logit differences between keys are O(|R|), the part
of A X that differs between queries is the product of the query's residual, the key's residual
and the value's residual, O(|R|^3).  Test: inputs X = 1 xbar^T + eps R0 for eps from 1e-3 to 1e-1,
slope of log res(out) against log res(in), predicted 3, over independent draws (t-quantiles).

Gradient (Noci et al. 2022).  As the tokens merge the gradient reaching W_Q vanishes: the logit
gradient J g is O(|R|) (J removes what is common to the keys, and the values differ by O(|R|)),
and the query gradient multiplies it by the keys' spread, O(|R|): |dL/dW_Q| = O(res^2), for a
random upstream gradient.  |dL/dW_V| stays O(1).  Test: the slopes of log |dW_Q| and log |dW_V|
against log res(in), predicted 2 and 0.

Depth (Noci et al. 2022).  Stacks X <- X + alpha SA(X) of L attention layers, with alpha = 1 and
alpha = 1/sqrt(L), from tokens that share a common part (X = 2 m + R, m and the rows of R N(0, 1),
R centred: res(X) about 0.45); the same inputs enter every depth.  With alpha = 1/sqrt(L) the
layers' random increments add up to a variance independent of L, so the output's res is
predicted to be the same at the two depths compared (their paired difference 0 within its SE),
although the stack lowers it; with alpha = 1, and without the residual path, it falls with depth.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

import kernels
from experiments import common

NAME = "rank_collapse"


@dataclasses.dataclass(frozen=True)
class Config:
    width: int = 32                # d, the token width
    tokens: int = 16               # T
    draws: int = 16                # independent weight (and input) draws
    epsilons: tuple[float, ...] = (1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 1e-1)  # input residual sizes
    depths: tuple[int, ...] = (4, 16, 64)  # stack depths L of the residual-scaling test
    seed: int = 0                  # seed of every draw

    def __post_init__(self):
        common.validate(self, ints={"width": 2, "tokens": 3, "draws": 3, "seed": 0},
                        tuples={"depths": 1})
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
    """res after each of L layers of X <- X + alpha SA(X) (or SA(X) without the residual path),
    per draw, from the given inputs (draws, 1, T, d): (draws, L + 1)."""
    d = config.width
    res = np.empty((config.draws, L + 1))
    for i in range(config.draws):
        x = inputs[i]                                                # (1, T, d)
        res[i, 0] = residual(x)[0]
        for l in range(L):
            y, _ = kernels.mha_forward(x, attention_params(rng, d))
            x = x + alpha * y if residual_path else y
            res[i, l + 1] = residual(x)[0]
    return res


def measure(config):
    rng = np.random.default_rng(config.seed)
    layer = one_layer(rng, config)
    depth, inputs = {}, stack_inputs(rng, config)
    for L in common.progress(config.depths, desc=NAME):
        depth[L, "1/sqrt(L)"] = stack(rng, config, inputs, L, 1 / math.sqrt(L))
        depth[L, "1"] = stack(rng, config, inputs, L, 1.0)
    depth[max(config.depths), "no residual"] = stack(rng, config, inputs, max(config.depths), 1.0, False)
    return layer, depth


def _headlines(m, config):
    layer, depth = m
    df = config.draws - 1
    heads = [common.test("exponent of res(out) against res(in), one attention layer",
                         *common.mean_se(slopes(layer, "res_out")), 3.0,
                         "Dong et al. 2021: cubic per layer (doubly exponential in depth)", df=df),
             common.test("exponent of |dL/dW_Q| against res(in)", *common.mean_se(slopes(layer, "dWQ")),
                         2.0, "Noci et al. 2022 (vanishing query gradient); order from the expansion",
                         df=df),
             common.test("exponent of |dL/dW_V| against res(in)", *common.mean_se(slopes(layer, "dWV")),
                         0.0, "Noci et al. 2022: the value gradient does not vanish (W_V enters "
                         "linearly: 0 by the algebra)", df=df, kind="identity")]
    shallow, deep = min(config.depths), max(config.depths)
    diff = depth[deep, "1/sqrt(L)"][:, -1] - depth[shallow, "1/sqrt(L)"][:, -1]   # paired by input
    heads.append(common.test(f"1/sqrt(L) residual: res at L = {deep} minus res at L = {shallow} "
                             "(same inputs)", *common.mean_se(diff), 0.0,
                             "Noci et al. 2022: a depth limit independent of L", df=df))
    heads.append(common.shown(f"res after {deep} layers without residual scaling (α = 1)",
                              *common.mean_se(depth[deep, "1"][:, -1]), "no number", "for comparison"))
    return heads


def _pm(mean_se):
    return f"{mean_se[0]:.4g} ± {mean_se[1]:.2g}"


def _tables(m, config):
    layer, depth = m
    rows = [{"ε": eps, "res(in)": _pm(common.mean_se(layer["res_in"][:, j])),
             "res(out)": _pm(common.mean_se(layer["res_out"][:, j])),
             "|dW_Q|": _pm(common.mean_se(layer["dWQ"][:, j])),
             "|dW_V|": _pm(common.mean_se(layer["dWV"][:, j]))} for j, eps in enumerate(config.epsilons)]
    deep = [{"L": L, "wiring": w, "res(in)": _pm(common.mean_se(r[:, 0])), "res(out)": _pm(common.mean_se(r[:, -1]))}
            for (L, w), r in depth.items()]
    return [(f"one attention layer near collapse ({config.draws} draws, ± SE)", rows),
            ("residual after the stack", deep)]


def _charts(m, config, figures):
    layer, depth = m
    fig, (a1, a2) = common.figure(2, width=5.4)
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
    for i, ((L, w), r) in enumerate(depth.items()):
        if L != max(config.depths) and w != "1/sqrt(L)":
            continue
        a2.semilogy(np.arange(L + 1) / L, np.maximum(r.mean(axis=0), 1e-17), "o-" if w != "no residual" else "s:",
                    ms=2, lw=1, color=f"C{i}", label=f"L = {L}, {'no residual' if w == 'no residual' else 'α = ' + w}")
    common.label(a2, "res through stacks (depth as a fraction of L)", "layer l / L", "res (unitless)",
                 legend="lower left")
    common.save(fig, NAME, "rank_collapse.png",
                "Left: one attention layer applied to nearly equal tokens: the output's residual falls as "
                "the cube of the input's, the gradient reaching W_Q as its square, the one reaching W_V not "
                "at all. Right: pure attention without a residual path reaches res ≈ 0 (rank one) within a "
                "few layers; with the residual scaled by 1/sqrt(L) the curves for different L end at the "
                "same residual, below the input's; with an unscaled residual (α = 1) the residual falls steadily through "
                "the deepest stack: the residual path slows the collapse but does not stop it.", figures)


def _rows(m, config):
    layer, depth = m
    rows = [{"part": "one layer", "draw": i, "epsilon": eps, **{k: float(v[i, j]) for k, v in layer.items()}}
            for i in range(config.draws) for j, eps in enumerate(config.epsilons)]
    rows += [{"part": "stack", "L": L, "wiring": w, "layer": l, "res_mean": float(r[:, l].mean())}
             for (L, w), r in depth.items() for l in range(r.shape[1])]
    return rows


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, _headlines, _charts, _rows, tables=_tables)
