"""precision: how far float32 and finite differences can be trusted.

1. float32 error of the lab's kernels against the same kernels in float64, on the same (float32-
   representable) inputs, as the reduction length n grows: the linear layer's forward (x W, a
   dot product of length n) and weight gradient (x^T dy, summed over n tokens), the RMS norm and
   the softmax over n features, forward and backward.  Drawn beside them: Higham's worst-case
   bound gamma_n = n u / (1 - n u) and the probabilistic sqrt(n) u (Higham & Mary 2019), u = 2^-24;
   and, for reference, plain recursive summation (np.cumsum) of n positive terms, the case those
   bounds describe.  Errors of x W and x^T dy are measured componentwise against |x| |W|, the
   others normwise (max |error| / max |exact|).
2. Central finite differences of L(x) = <softmax(x), g> along a direction v against the exact
   derivative (the hand backward in float64), over step sizes h: truncation h^2 |L'''| / 6 and
   rounding u |L| / h balance near h = u^(1/3), where the error is about u^(2/3).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

import kernels
from experiments import common

NAME = "precision"
U = {"float32": 2.0 ** -24, "float64": 2.0 ** -53}
RECURSIVE = "recursive sum (np.cumsum), reference"
SOURCE_BOUNDS = "Higham 2002 (gamma_n); Higham & Mary 2019 (sqrt(n) u)"


@dataclasses.dataclass(frozen=True)
class Config:
    lengths: tuple[int, ...] = (16, 64, 256, 1024, 4096, 16384, 65536)
    rows: int = 32                 # independent outputs per length
    trials: int = 4
    fd_width: int = 16             # softmax width for the finite-difference study
    fd_draws: int = 32             # random (x, v, g) triples, errors averaged
    fd_steps: int = 49             # step sizes, log-spaced from 1e-12 to 1
    seed: int = 0

    def __post_init__(self):
        common.validate(self, ints={"rows": 1, "trials": 1, "fd_width": 2, "fd_draws": 1,
                                 "fd_steps": 3, "seed": 0}, tuples={"lengths": 2})


def gamma(n, u=U["float32"]):
    """Higham's gamma_n = n u / (1 - n u): the worst-case relative error of a sum of n terms."""
    n = np.asarray(n, float)
    return n * u / (1 - n * u)


def normwise(a32, a64):
    return float(np.abs(a32.astype(np.float64) - a64).max() / np.abs(a64).max())


def componentwise(a32, a64, scale):
    return float((np.abs(a32.astype(np.float64) - a64) / scale).max())


def kernel_errors(rng, n, rows):
    """float32 error of each kernel at reduction length n: dict name -> error.  Inputs are drawn
    in float32 and upcast exactly, so the error is the float32 arithmetic's alone."""
    x = rng.standard_normal((rows, n)).astype(np.float32)                   # (R, n) features
    W = rng.standard_normal((n, rows)).astype(np.float32)                   # (n, R)
    dy = rng.standard_normal((rows, n)).astype(np.float32)                  # (R, n)
    xt = rng.standard_normal((n, rows)).astype(np.float32)                  # (n, R) n tokens
    dyt = rng.standard_normal((n, rows)).astype(np.float32)                 # (n, R)
    Wsq = rng.standard_normal((rows, rows)).astype(np.float32)              # (R, R)
    terms = rng.random((rows, n)).astype(np.float32)                        # (R, n) positive

    def forward(dt):
        return kernels.linear_forward(x.astype(dt), {"W": W.astype(dt), "b": np.zeros(rows, dt)})[0]

    def weight_grad(dt):
        cache = kernels.linear_forward(xt.astype(dt), {"W": Wsq.astype(dt), "b": np.zeros(rows, dt)})[1]
        return kernels.linear_backward(dyt.astype(dt), cache)[1]["W"]      # (R, R) sum over n tokens

    def a64(a):
        return np.abs(a.astype(np.float64))

    out = {"linear forward (x W)": componentwise(forward(np.float32), forward(np.float64),
                                                 a64(x) @ a64(W)),
           "linear backward (x^T dy)": componentwise(weight_grad(np.float32), weight_grad(np.float64),
                                                     a64(xt).T @ a64(dyt))}
    for name, fwd, bwd in (("rms_norm", kernels.rms_norm_forward, kernels.rms_norm_backward),
                           ("softmax", kernels.softmax_forward, kernels.softmax_backward)):
        y32, k32 = fwd(x, {})
        y64, k64 = fwd(x.astype(np.float64), {})
        out[f"{name} forward"] = normwise(y32, y64)
        out[f"{name} backward"] = normwise(bwd(dy, k32)[0], bwd(dy.astype(np.float64), k64)[0])
    out[RECURSIVE] = normwise(np.cumsum(terms, axis=1)[:, -1], terms.astype(np.float64).sum(axis=1))
    return out


def reduction_errors(config, rng):
    """Mean over trials of each kernel's error: dict name -> (lengths,) array."""
    per_n = []
    for n in common.progress(config.lengths, desc=f"{NAME} lengths"):
        runs = [kernel_errors(rng, n, config.rows) for _ in range(config.trials)]
        per_n.append({k: float(np.mean([r[k] for r in runs])) for k in runs[0]})
    return {k: np.array([e[k] for e in per_n]) for k in per_n[0]}         # name -> (lengths,)


def fd_errors(config, rng):
    """Central differences of L(x) = <softmax(x), g> along a unit v against the exact derivative.
    Returns the steps (S,), dict dtype -> relative error (S,) (geometric mean over draws), and the
    float64 ratios |L'''| / |L'| and sum|p g| / |L'| (geometric means) for the error model."""
    steps = np.logspace(-12, 0, config.fd_steps)                             # (S,)
    shape = (config.fd_draws, config.fd_width)
    x, v, g = (rng.standard_normal(shape) for _ in range(3))                 # (draws, n) each
    v /= np.linalg.norm(v, axis=1, keepdims=True)

    def loss(xx, gg):                                                        # (..., n) -> (...)
        return (kernels.softmax_forward(xx, {})[0] * gg).sum(axis=-1)

    def exact(xx):                                                           # (draws,) <grad L, v>
        _, cache = kernels.softmax_forward(xx, {})
        return (kernels.softmax_backward(g, cache)[0] * v).sum(axis=-1)

    d = exact(x)                                                             # (draws,) float64
    errors = {}
    for name in U:
        dt = np.dtype(name).type
        xs, vs, gs = x.astype(dt), v.astype(dt), g.astype(dt)
        hs = steps.astype(dt)[:, None, None]                                 # (S, 1, 1)
        fd = (loss(xs + hs * vs, gs) - loss(xs - hs * vs, gs)) / (2 * hs[..., 0])  # (S, draws)
        rel = np.abs(fd.astype(np.float64) - d) / np.abs(d)                  # (S, draws)
        errors[name] = np.exp(np.log(np.maximum(rel, 1e-300)).mean(axis=1))  # (S,)
    h = 1e-3                                                                 # L''' from L' (float64)
    third = np.abs(exact(x + h * v) - 2 * d + exact(x - h * v)) / h ** 2     # (draws,)
    rounding = np.abs(kernels.softmax_forward(x, {})[0] * g).sum(axis=-1)    # (draws,) sum |p g|
    geo = lambda a: float(np.exp(np.mean(np.log(a / np.abs(d)))))           # noqa: E731
    return steps, errors, geo(third), geo(rounding)


def error_model(h, u, third, rounding):
    """Relative error of a central difference: h^2 |L'''| / 6 + u sum|p g| / h (both over |L'|)."""
    return h ** 2 * third / 6 + u * rounding / h


def optimal_step(u, third, rounding):
    """The minimum of error_model: h* = (3 u rounding / third)^(1/3)."""
    return (3 * u * rounding / third) ** (1 / 3)


def measure(config):
    rng = np.random.default_rng(config.seed)
    return reduction_errors(config, rng), fd_errors(config, rng)


def _headlines(m, config):
    red, (steps, errors, third, rounding) = m
    n = np.array(config.lengths, float)
    kernel_names = [k for k in red if k != RECURSIVE]
    worst = max(float((red[k] / gamma(n)).max()) for k in kernel_names)
    prob = max(float((red[k] / (np.sqrt(n) * U["float32"])).max()) for k in kernel_names)
    heads = [common.headline("largest float32 kernel error / gamma_n (any kernel, any n)", worst,
                          "<= 1 (worst-case bound)", SOURCE_BOUNDS, worst <= 1),
             common.headline("largest float32 kernel error / (sqrt(n) u)", prob,
                          "<= 1 (holds with high probability)", SOURCE_BOUNDS, prob <= 1)]
    if len(n) >= 3:
        slope, se = common.loglog_fit(n, red[RECURSIVE])
        heads.append(common.headline("exponent of recursive-summation error vs n", slope, 0.5,
                                  "Higham & Mary 2019 (rounding errors as a random walk)",
                                  abs(slope - 0.5) <= 3 * se))
    grid = steps[1] / steps[0]
    for name, u in U.items():
        best = float(steps[np.argmin(errors[name])])
        model = optimal_step(u, third, rounding)
        # the measured optimum is known to one grid step of the log-spaced steps
        heads.append(common.headline(f"best finite-difference step, {name}", best, round(model, 8),
                                  "u^(1/3) (3 sum|pg| / |L'''|)^(1/3), from truncation vs rounding",
                                  1 / grid <= best / model <= grid))
    return heads


def _charts(m, config, figures):
    red, (steps, errors, third, rounding) = m
    n = np.array(config.lengths, float)
    grid = np.geomspace(n.min(), n.max(), 100)                               # (100,)
    fig, (a1,) = common.figure(1, width=7.5, height=4.8)
    for i, (name, err) in enumerate(red.items()):
        style = "k^-" if name == RECURSIVE else f"C{i}o-"
        a1.loglog(n, err, style, ms=4, lw=1, label=name)
    a1.loglog(grid, gamma(grid), "r--", lw=1.5, label="γ_n = nu/(1−nu) (worst case)")
    a1.loglog(grid, np.sqrt(grid) * U["float32"], "r:", lw=1.5, label="√n·u (probabilistic)")
    a1.axhline(U["float32"], color="0.5", lw=1, label="u = 2⁻²⁴")
    common.label(a1, "float32 error of the kernels against float64", "reduction length n",
              "relative error (unitless)", legend="upper left")
    common.save(fig, NAME, "reduction.png",
             "float32 error of the lab's kernels (same inputs run in float64 as the reference) as the "
             "reduction length grows, against Higham's worst-case γ_n and the probabilistic √n·u. "
             "NumPy's blocked BLAS dot products and pairwise sums stay near u; plain recursive "
             "summation of positive terms follows √n·u.", figures)
    fig, (b1,) = common.figure(1, width=7.5, height=4.8)
    for i, (name, u) in enumerate(U.items()):
        b1.loglog(steps, errors[name], "o-", color=f"C{i}", ms=3, lw=1, label=f"{name}, measured")
        b1.loglog(steps, error_model(steps, u, third, rounding), "--", color=f"C{i}", lw=1,
                  label=f"{name}, h²|L‴|/6 + u·Σ|pg|/h")
        b1.axvline(u ** (1 / 3), color=f"C{i}", ls=":", lw=1.5, label=f"u^(1/3) = {u ** (1 / 3):.1e}")
    b1.set_ylim(1e-12, 10)
    common.label(b1, f"central differences of ⟨softmax(x), g⟩, n = {config.fd_width}",
              "step h (input units)", "relative error of the derivative", legend="lower left")
    common.save(fig, NAME, "finite_differences.png",
             "Relative error of a central difference against the exact derivative (hand backward, "
             "float64) as the step shrinks: truncation (slope 2) on the right, rounding (slope −1) "
             "on the left; the optimum sits near u^(1/3) (dotted) times a problem constant, where "
             "the error model (dashed) puts it.", figures)


def _rows(m, config):
    red, (steps, errors, third, rounding) = m
    rows = [{"part": "reduction", "n": n, "kernel": k, "float32_error": e[i],
             "gamma_n": gamma(n), "sqrt_n_u": math.sqrt(n) * U["float32"]}
            for k, e in red.items() for i, n in enumerate(config.lengths)]
    rows += [{"part": "finite differences", "step": h, "kernel": f"softmax {name}",
              "relative_error": errors[name][i],
              "model": error_model(h, U[name], third, rounding)}
             for name in U for i, h in enumerate(steps)]
    return rows


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, _headlines, _charts, _rows)
