"""precision: how far float32 and finite differences can be trusted.

1. Summation.  Plain recursive summation (np.cumsum) of n positive float32 terms has a rounding
   model that predicts its error, not only bounds it: each partial sum s_k is rounded to its own
   float32 spacing ulp(s_k), an error close to uniform on +- ulp/2 and independent from step to
   step, so the squared error of the total has expectation sum_k ulp(s_k)^2 / 12.  Test: the
   measured mean squared error over that prediction (1), pooled over every row, trial and length.
   Bounds, for any summation order (each term meets at most n - 1 roundings): Higham's worst case
   |error| <= gamma_{n-1} sum|x_i|, gamma_k = k u / (1 - k u); and Higham & Mary 2019 (Theorem 3.1,
   rounding errors independent with mean zero), |error| <= gamma~_{n-1}(lambda) sum|x_i| with
   gamma~_k(lambda) = exp(lambda sqrt(k) u + k u^2 / (1 - u)) - 1, which holds with probability at
   least 1 - 2k exp(-lambda^2 (1 - u)^2 / 2); here lambda = 7, a failure probability of at most
   3e-6 per sum at n = 65536.  The bounds are checked on the largest error over every row and trial.

2. The lab's kernels in float32 against the same kernels in float64 on the same inputs: the
   linear layer's forward (x W, dot products of length n) and weight gradient (x^T dy, summed over
   n tokens), componentwise against |x| |W|, under the inner-product bounds gamma_n and
   gamma~_n (n products and n - 1 additions: n roundings on a term's path); the RMS norm and the softmax over n features, forward
   and backward, normwise (the checker's error norm).  BLAS blocks its dot products and NumPy sums
   pairwise, in orders the lab does not control, so the linear layer is held to the order-free
   bounds only, and the normalisations are shown without a bound.

3. Central finite differences of L(x) = <softmax(x), g> along a unit direction v, by the checker's
   own finite differences (checks.legs.FiniteDifferences), against the exact derivative (the hand
   backward in float64), over step sizes h: truncation h^2 |L'''| / 6 and rounding u sum|p g| / h
   balance at h* = (3 u sum|pg| / |L'''|)^(1/3).  The error curve is flat at its minimum, so an
   argmin of it flips with the machine's noise; instead each branch is fitted with its slope
   fixed (2 on the right, -1 on the left) on the points where the model's term dominates the
   other ten-fold: the truncation coefficient is tested against |L'''|/6 (two-sided), the rounding
   coefficient against its bound u sum|p g| (one-sided: rounding errors typically cancel in part),
   and the fitted curve's optimum (B / 2A)^(1/3) is shown against h*.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

import kernels
from checks.legs import FiniteDifferences, normwise
from checks.tolerances import unit_roundoff
from experiments import common

NAME = "precision"
U = {name: unit_roundoff(np.dtype(name)) for name in ("float32", "float64")}
RECURSIVE = "recursive sum (np.cumsum)"
LINEAR = ("linear forward (x W)", "linear backward (x^T dy)")
LAMBDA = 7.0  # Higham & Mary's lambda


@dataclasses.dataclass(frozen=True)
class Config:
    lengths: tuple[int, ...] = (16, 64, 256, 1024, 4096, 16384, 65536)  # reduction lengths n
    rows: int = 32                 # independent outputs per length
    trials: int = 4                # trials per length (the summation test pools rows and trials)
    fd_width: int = 16             # softmax width for the finite-difference study
    fd_draws: int = 32             # random (x, v, g) triples, errors averaged geometrically
    fd_steps: int = 49             # step sizes, log-spaced from 1e-12 to 1
    seed: int = 0                  # seed of every draw

    def __post_init__(self):
        common.validate(self, ints={"rows": 1, "trials": 1, "fd_width": 2, "fd_draws": 1,
                                    "fd_steps": 3, "seed": 0}, tuples={"lengths": 2})


def gamma(k, u=U["float32"]):
    """Higham's gamma_k = k u / (1 - k u): the worst-case relative error of k roundings."""
    k = np.asarray(k, float)
    return k * u / (1 - k * u)


def gamma_tilde(k, lam=LAMBDA, u=U["float32"]):
    """Higham & Mary's probabilistic gamma~_k(lambda) = exp(lambda sqrt(k) u + k u^2/(1 - u)) - 1."""
    k = np.asarray(k, float)
    return np.expm1(lam * np.sqrt(k) * u + k * u * u / (1 - u))


def failure_probability(k, lam=LAMBDA, u=U["float32"]):
    """Higham & Mary 2019: the probabilistic bound fails with probability at most this."""
    return float(min(1.0, 2 * k * math.exp(-lam ** 2 * (1 - u) ** 2 / 2)))


def componentwise(a32, a64, scale):
    """max |a32 - a64| / scale with an elementwise scale (|x| |W|): an error norm the checker does
    not have (it compares normwise), so it lives here."""
    return float((np.abs(a32.astype(np.float64) - a64) / scale).max())


def recursive_sum(terms):
    """np.cumsum of float32 terms (R, n): the float32 total, the exact total and the rounding
    model's expected squared error sum_k ulp(s_k)^2 / 12, each (R,)."""
    partial = np.cumsum(terms, axis=1)                                      # (R, n) float32
    exact = terms.astype(np.float64).sum(axis=1)                            # (R,) exact: 53 bits hold it
    model = (np.spacing(partial[:, 1:]).astype(np.float64) ** 2).sum(axis=1) / 12   # (R,)
    return partial[:, -1].astype(np.float64), exact, model


def kernel_errors(rng, n, rows):
    """float32 error of each kernel at reduction length n (name -> error), and the recursive
    sums' squared errors, model and relative errors per row.  Inputs are drawn in float32 and
    upcast exactly, so the error is the float32 arithmetic's alone."""
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

    out = {LINEAR[0]: componentwise(forward(np.float32), forward(np.float64), a64(x) @ a64(W)),
           LINEAR[1]: componentwise(weight_grad(np.float32), weight_grad(np.float64),
                                    a64(xt).T @ a64(dyt))}
    for name, fwd, bwd in (("rms_norm", kernels.rms_norm_forward, kernels.rms_norm_backward),
                           ("softmax", kernels.softmax_forward, kernels.softmax_backward)):
        y32, k32 = fwd(x, {})
        y64, k64 = fwd(x.astype(np.float64), {})
        out[f"{name} forward"] = normwise(y32.astype(np.float64), y64)
        out[f"{name} backward"] = normwise(bwd(dy, k32)[0].astype(np.float64),
                                           bwd(dy.astype(np.float64), k64)[0])
    total, exact, model = recursive_sum(terms)
    relative = np.abs(total - exact) / exact                                # positive: sum|x| = exact
    out[RECURSIVE] = float(relative.max())
    return out, ((total - exact) ** 2 / exact ** 2, model / exact ** 2, relative)


def reduction_errors(config, rng):
    """Per length the largest error of each kernel over its trials (a bound needs the maximum),
    and per length the recursive sums' (squared relative error, model, relative error) per row."""
    worst, sums = [], {}
    for n in common.progress(config.lengths, desc=f"{NAME} lengths"):
        runs = [kernel_errors(rng, n, config.rows) for _ in range(config.trials)]
        worst.append({k: max(r[0][k] for r in runs) for k in runs[0][0]})
        sums[n] = tuple(np.concatenate([r[1][i] for r in runs]) for i in range(3))
    return {k: np.array([e[k] for e in worst]) for k in worst[0]}, sums


def fd_errors(config, rng):
    """Central differences (the checker's) of L(x) = <softmax(x), g> along a unit v against the
    exact derivative.  Returns the steps (S,), dict dtype -> relative error (S,) (geometric mean
    over draws), and the float64 ratios |L'''| / |L'| and sum|p g| / |L'| (geometric means)."""
    steps = np.logspace(-12, 0, config.fd_steps)                             # (S,)
    shape = (config.fd_draws, config.fd_width)
    x, v, g = (rng.standard_normal(shape) for _ in range(3))                 # (draws, n) each
    v /= np.linalg.norm(v, axis=1, keepdims=True)

    def exact(xx):                                                           # (draws,) <grad L, v>
        _, cache = kernels.softmax_forward(xx, {})
        return (kernels.softmax_backward(g, cache)[0] * v).sum(axis=-1)

    d = exact(x)                                                             # (draws,) float64
    errors = {}
    for name in U:
        dt = np.dtype(name)
        rel = np.empty((len(steps), config.fd_draws))                        # (S, draws)
        for j in range(config.fd_draws):
            xj = x[j].astype(dt)
            fd = FiniteDifferences(kernels.softmax_forward, [xj], {}, {}, g[j], u=U[name])
            rel[:, j] = [abs(fd.central(0, xj.astype(np.float64), v[j], h)[0] - d[j]) / abs(d[j])
                         for h in steps]
        errors[name] = np.exp(np.log(np.maximum(rel, 1e-300)).mean(axis=1))  # (S,)
    h = 1e-3                                                                 # L''' from L' (float64)
    third = np.abs(exact(x + h * v) - 2 * d + exact(x - h * v)) / h ** 2     # (draws,)
    rounding = np.abs(kernels.softmax_forward(x, {})[0] * g).sum(axis=-1)    # (draws,) sum |p g|
    geo = lambda a: float(np.exp(np.mean(np.log(a / np.abs(d)))))           # noqa: E731
    return steps, errors, geo(third), geo(rounding)


def error_model(h, u, third, rounding):
    """Relative error of a central difference: h^2 |L'''| / 6 + u sum|p g| / h (both over |L'|)."""
    return h ** 2 * third / 6 + u * rounding / h


# |L'''| comes from a float64 central second difference of L' at h = 1e-3: its own relative
# truncation error is of order h^2 = 1e-6, far below the branch fit's scatter; 1e-4 is its
# allowance (a hundred-fold margin)
TRUNCATION_REL_SE = 1e-4


def optimal_step(u, third, rounding):
    """The minimum of error_model: h* = (3 u rounding / third)^(1/3)."""
    return (3 * u * rounding / third) ** (1 / 3)


def measure(config):
    rng = np.random.default_rng(config.seed)
    return reduction_errors(config, rng), fd_errors(config, rng)


def branch_fits(steps, errors, u, third, rounding):
    """Fit the error curve's two branches with fixed slopes: on the truncation branch the ratio
    error / (h^2 |L'''| / 6), on the rounding branch error / (u sum|pg| / h), each the geometric
    mean over the branch's points (where that term of error_model is ten times the other and the
    error is below 0.1: no saturation), with the standard error of the log mean from the points'
    scatter (points - 1 df).  Returns {"truncation": (ratio, se, df), "rounding": (ratio, se,
    df), "optimum": (h_fit / h*, se)}: the fitted curve's optimum (B / 2A)^(1/3) over h* is
    (rounding ratio / truncation ratio)^(1/3)."""
    trunc, rnd = steps ** 2 * third / 6, u * rounding / steps                # (S,), (S,)
    out = {}
    for name, term, other in (("truncation", trunc, rnd), ("rounding", rnd, trunc)):
        on = (term >= 10 * other) & (errors <= 0.1)
        if on.sum() < 2:
            raise ValueError(f"fd_steps: the {name} branch has {int(on.sum())} steps, expected at "
                             "least 2 (use more steps)")
        mean, se = common.mean_se(np.log(errors[on] / term[on]))             # log ratio
        out[name] = (math.exp(mean), math.exp(mean) * se, int(on.sum()) - 1)
    (r, r_se, _), (t, t_se, _) = out["rounding"], out["truncation"]
    opt = (r / t) ** (1 / 3)
    out["optimum"] = (opt, opt * math.hypot(r_se / r, t_se / t) / 3)
    return out


def _headlines(m, config):
    (worst, sums), (steps, errors, third, rounding) = m
    n = np.array(config.lengths, float)
    # pooled over lengths: each row's squared error over its own length's mean model
    per_row = np.concatenate([sums[k][0] / sums[k][1].mean() for k in config.lengths])
    heads = [common.test("recursive summation: mean squared error / the rounding model's prediction, "
                         "all lengths", *common.mean_se(per_row), 1.0,
                         "independent rounding errors uniform on ± ulp(s_k)/2: Σ ulp(s_k)²/12")]
    rel = np.array([sums[k][2].max() for k in config.lengths])
    heads.append(common.bound("recursive summation: largest error / γ_{n−1}, any n", float((rel / gamma(n - 1)).max()),
                              1.0, "Higham 2002 (worst case, any order)", "max over rows and trials ≤ 1"))
    heads.append(common.bound(f"recursive summation: largest error / γ̃_{{n−1}}(λ = {LAMBDA:g}), any n",
                              float((rel / gamma_tilde(n - 1)).max()), 1.0,
                              f"Higham & Mary 2019, Theorem 3.1 (fails with probability ≤ "
                              f"{failure_probability(n.max() - 1):.0e} per sum)", "max over rows and trials ≤ 1"))
    lin = np.max([worst[k] for k in LINEAR], axis=0)                          # (lengths,)
    # an inner product of length n: n products and n - 1 additions, n roundings on each term's path
    heads.append(common.bound("linear layer, forward and weight gradient (inner products of length "
                              "n): largest componentwise error / γ_n", float((lin / gamma(n)).max()), 1.0,
                              "Higham 2002, inner products: γ_n (worst case, any order)",
                              "max over outputs and trials ≤ 1"))
    heads.append(common.bound(f"linear layer: largest componentwise error / γ̃_n(λ = {LAMBDA:g})",
                              float((lin / gamma_tilde(n)).max()), 1.0,
                              "Higham & Mary 2019, Theorem 3.1, inner products", "max over outputs and trials ≤ 1"))
    for name, u in U.items():
        fits = branch_fits(steps, errors[name], u, third, rounding)
        ratio, se, df = fits["truncation"]
        heads.append(common.test(f"finite differences, {name}: truncation branch / (h²|L‴|/6), "
                                 f"slope 2 fixed, {df + 1} steps", ratio, se, 1.0,
                                 "Taylor: the central difference's leading error h²L‴/6",
                                 predicted_se=TRUNCATION_REL_SE, df=df))
        ratio, se, df = fits["rounding"]
        heads.append(common.bound(f"finite differences, {name}: rounding branch / (u Σ|pg| / h), "
                                  f"slope −1 fixed, {df + 1} steps", ratio, 1.0,
                                  "each evaluation errs by at most about u Σ|p g|; their difference "
                                  "over 2h", "geometric mean over the branch ≤ 1", se=se))
        opt, opt_se = fits["optimum"]
        heads.append(common.shown(f"finite differences, {name}: optimum of the fitted curve / h*",
                                  opt, opt_se, "(rounding ratio / truncation ratio)^(1/3): below 1 "
                                  "as far as rounding errors cancel", "h* = (3u Σ|pg| / |L‴|)^(1/3), "
                                  "from the rounding bound"))
    return heads


def _tables(m, config):
    (worst, sums), _ = m
    rows = []
    for i, k in enumerate(config.lengths):
        sq, model, rel = sums[k]
        r = sq / model.mean()
        rows.append({"n": k, "rms relative error, measured": math.sqrt(sq.mean()),
                     "rms, rounding model": math.sqrt(model.mean()),
                     "mean sq. error / model": f"{r.mean():.3f} ± {r.std(ddof=1) / math.sqrt(len(r)):.2g}",
                     "largest error": float(rel.max()), "γ_{n−1}": float(gamma(k - 1)),
                     f"γ̃_{{n−1}}(λ = {LAMBDA:g})": float(gamma_tilde(k - 1)),
                     "linear fwd / bwd (largest)": f"{worst[LINEAR[0]][i]:.2g} / {worst[LINEAR[1]][i]:.2g}",
                     "rms_norm fwd / softmax fwd": f"{worst['rms_norm forward'][i]:.2g} / {worst['softmax forward'][i]:.2g}"})
    return [(f"float32 summation and kernels per length ({config.rows} rows × {config.trials} trials)", rows)]


def _charts(m, config, figures):
    (worst, sums), (steps, errors, third, rounding) = m
    n = np.array(config.lengths, float)
    grid = np.geomspace(n.min(), n.max(), 100)                               # (100,)
    fig, (a1, a2) = common.figure(2, width=6.0, height=4.8)
    # componentwise errors (against |x||W| or sum|x|) under their bounds; normwise ones apart
    a1.loglog(n, worst[RECURSIVE], "k^-", ms=4, lw=1, label=f"{RECURSIVE}, largest")
    for i, name in enumerate(LINEAR):
        a1.loglog(n, worst[name], f"C{i}o-", ms=4, lw=1, label=f"{name}, largest")
    a1.loglog(n, [math.sqrt(sums[k][1].mean()) for k in config.lengths], "k:", lw=1.5,
              label="recursive sum, rounding model (rms)")
    a1.loglog(grid, gamma(grid - 1), "r--", lw=1.2, label="γ_{n−1} (sums of n terms)")
    a1.loglog(grid, gamma(grid), "m--", lw=1, label="γ_n (inner products of length n)")
    a1.loglog(grid, gamma_tilde(grid - 1), "r-.", lw=1.2, label=f"γ̃_{{n−1}}(λ = {LAMBDA:g})")
    a1.loglog(grid, gamma_tilde(grid), "m-.", lw=1, label=f"γ̃_n(λ = {LAMBDA:g})")
    a1.axhline(U["float32"], color="0.5", lw=1, label="u = 2⁻²⁴")
    common.label(a1, "componentwise float32 error and its bounds", "reduction length n",
                 "relative error (unitless)", legend="upper left")
    normwise_names = [k for k in worst if k != RECURSIVE and k not in LINEAR]
    for i, name in enumerate(normwise_names):
        a2.loglog(n, worst[name], f"C{i + 2}s-", ms=4, lw=1, label=f"{name}, largest")
    a2.axhline(U["float32"], color="0.5", lw=1, label="u = 2⁻²⁴")
    common.label(a2, "normwise float32 error (no bound drawn)", "reduction length n",
                 "normwise relative error (unitless)", legend="upper left")
    common.save(fig, NAME, "reduction.png",
                "Left: componentwise errors, largest over rows and trials. Recursive summation of "
                "positive terms grows like √n·u, its rms follows the rounding model (dotted), and it "
                "stays under γ_{n−1} and γ̃_{n−1}; the linear layer's inner products (BLAS's blocked "
                "dot products) stay near u, under γ_n and γ̃_n. Right: the normalisations' normwise "
                "errors (the checker's error norm), which the componentwise bounds do not cover: "
                "shown without a bound.", figures)
    fig, (b1,) = common.figure(1, width=7.5, height=4.8)
    for i, (name, u) in enumerate(U.items()):
        fits = branch_fits(steps, errors[name], u, third, rounding)
        b1.loglog(steps, errors[name], "o", color=f"C{i}", ms=3, label=f"{name}, measured")
        tr, ro = fits["truncation"][0], fits["rounding"][0]
        fitted = tr * steps ** 2 * third / 6 + ro * u * rounding / steps
        b1.loglog(steps, fitted, "-", color=f"C{i}", lw=1.2,
                  label=f"{name}, fitted branches: {tr:.3g} × h²|L‴|/6 + {ro:.3g} × u·Σ|pg|/h")
        b1.loglog(steps, error_model(steps, u, third, rounding), "--", color=f"C{i}", lw=0.8,
                  label=f"{name}, bound model h²|L‴|/6 + u·Σ|pg|/h")
        h_star = optimal_step(u, third, rounding)
        b1.axvline(h_star, color=f"C{i}", ls=":", lw=1.2, label=f"h* = {h_star:.1e}")
        b1.axvline(fits["optimum"][0] * h_star, color=f"C{i}", ls="-.", lw=1.2,
                   label=f"fitted optimum = {fits['optimum'][0]:.2f} h*")
    b1.set_ylim(1e-12, 10)
    common.label(b1, f"central differences of ⟨softmax(x), g⟩, n = {config.fd_width}",
                 "step h (input units)", "relative error of the derivative", legend=False)
    b1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    common.save(fig, NAME, "finite_differences.png",
                "Relative error of the checker's central difference against the exact derivative "
                "(hand backward, float64) as the step shrinks: truncation (slope 2) on the right, "
                "rounding (slope −1) on the left. Each branch is fitted with its slope fixed (solid): "
                "the truncation branch sits on h²|L‴|/6, the rounding branch below its bound u·Σ|pg|/h "
                "(dashed), so the fitted optimum (dash-dotted) lies below the bound's h* (dotted).", figures)


def _rows(m, config):
    (worst, sums), (steps, errors, third, rounding) = m
    rows = [{"part": "reduction", "n": n, "kernel": k, "float32_error_max": e[i],
             "gamma_n_minus_1": gamma(n - 1), "gamma_tilde": gamma_tilde(n - 1)}
            for k, e in worst.items() for i, n in enumerate(config.lengths)]
    rows += [{"part": "recursive sum", "n": n, "row": j, "squared_relative_error": sq,
              "model": mo} for n, (sqs, mos, _) in sums.items() for j, (sq, mo) in enumerate(zip(sqs, mos))]
    rows += [{"part": "finite differences", "step": h, "kernel": f"softmax {name}",
              "relative_error": errors[name][i], "model": error_model(h, U[name], third, rounding)}
             for name in U for i, h in enumerate(steps)]
    return rows


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, _headlines, _charts, _rows, tables=_tables)
