"""half_precision: what float16 and bfloat16 do to sums, gradients, softmax and Adam.

float16 has 11 significand bits (u = 2^-11) and the range 6.1e-5 (smallest normal, 2^-14) to
65504; bfloat16 has 8 bits (u = 2^-8) and float32's range.  The lab's kernels take both with
float32 inside (kernels.precision): products of half-precision values are exact in float32, sums
accumulate in float32 and what a kernel returns is rounded once.  Four consequences are measured.

1. Reductions.  Dot products of n positive terms (x uniform on [0, 1) times a per-trial 2^s,
   s uniform on [0, 1), y uniform on [0, 1), both rounded to the format) against the exact float64
   value, relative error, over trials.  Accumulated in the half format (each product and each
   partial sum rounded: NumPy's float16 cumsum rounds every partial sum; np.sum on float16 does
   not, it sums pairwise in float32 — ml_dtypes' bfloat16 rounds in both), Higham's worst case
   gamma_n = n u / (1 - n u) bounds the error only while n u < 1 (n < 2048 in float16, n < 256 in
   bfloat16) and says nothing for a relative error once n u >= 1/2.  Higham & Mary 2019
   (Theorem 2.4 per product of n rounding factors, probability at least 1 - 2 exp(-lambda^2
   (1 - u)^2 / 2); Theorem 3.1 for the dot product, at least 1 - 2n exp(...)) give gamma~_n(lambda)
   = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1 when the rounding errors are independent with mean
   zero.  A running sum of ones in the format stalls exactly at 1/u (2048 and 256), where 1 is half
   a unit in the last place and ties round to even.  The lab's kernel (kernels.linear_forward,
   float32 accumulation) is rounded once: its error is at most u + gamma_n(float32) (1 + u), and
   with the result's significand log-uniform (the 2^s) the mean relative error of one rounding to
   nearest is u / (4 ln 2) at every n.

2. Gradient underflow.  The article-size model (kernels.model) on one palindrome batch at
   initialisation, float32 and float16, the upstream gradient of the loss set to 2^e (e = 0 is the
   loss itself; e < 0 is a loss weighted down, the mean over 2^-e times more positions, or the
   small gradients of a model late in training; e > 0 is a loss scale).  A float32 value rounds to
   0 in float16 when |g| <= 2^-25 (half the smallest subnormal 2^-24, the tie rounding to the even
   0), so the fraction of float16 gradient elements that are zero is predicted by the fraction of
   float32 gradients at or below 2^-25 — as long as only the parameter gradients underflow.  The
   per-position gradients inside the backward are 1/(B (T + 1)) of the loss's and underflow first:
   then whole chains are zero and the prediction fails (shown).  Loss scaling (Micikevicius et al.
   2018) multiplies the upstream gradient by S and divides the float16 gradients by S in float32
   (exact for S a power of two): the zero fraction is predicted by float32 gradients at or below
   2^-25 / S.

3. Softmax overflow.  exp in a half format overflows when exp(x) reaches the midpoint between the
   largest finite value and the next power of two (65520 in float16: x > ln 65520 = 11.09; 88.7 in
   bfloat16).  A naive softmax (exp of the unshifted logits in the format) of rows (x, 0, ..., 0)
   over every value x of the format is non-finite from the predicted grid value on, exactly; the
   lab's kernel (max shift in float32) is finite everywhere.

4. Adam's eps.  1e-8 rounds to 0 in float16 (below 2^-25 = 3.0e-8, half the smallest subnormal)
   and to 1.0012e-8 in bfloat16.  So a float16 Adam step from zero moments divides by
   sqrt(v) + 0: a zero gradient gives 0/0 = NaN, and every |g| whose v = (1 - beta2) g^2 underflows
   (|g| <= sqrt(2^-25 / (1 - beta2)) = 5.5e-3 for beta2 = 0.999) gives m / 0 = inf.  float32 and
   bfloat16 take finite steps.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

import kernels
from checks.legs import normwise
from checks.tolerances import unit_roundoff
from experiments import common, tasks
from experiments.precision import LAMBDA, failure_probability, gamma, gamma_tilde
from kernels import model as model_kernels
from kernels.optim import adam_init, adam_step
from kernels.precision import BFLOAT16, FLOAT16

NAME = "half_precision"
FORMATS = {"float16": FLOAT16, "bfloat16": BFLOAT16}
U = {name: unit_roundoff(dt) for name, dt in FORMATS.items()}
U32 = unit_roundoff(np.float32)
UNDERFLOW = 2.0 ** -25   # float32 values at or below this round to 0 in float16
BETA2 = 0.999            # Adam's default (kernels.optim.adam_step)
EPS = 1e-8               # Adam's default eps


@dataclasses.dataclass(frozen=True)
class Config:
    lengths: tuple[int, ...] = tuple(2 ** k for k in range(4, 15))  # reduction lengths n
    trials: int = 64               # dot products per length and format
    ones: int = 4096               # length of the running sums of ones (past float16's 2048)
    batch: int = 64                # palindrome sequences in the gradient batch
    tokens: int = 16               # tokens per sequence (even: the palindrome task)
    exponents: tuple[int, ...] = tuple(range(-18, 15, 2))  # upstream gradients 2^e of the loss
    weight: int = -6               # e where the underflow prediction is tested
    small_weight: int = -14        # e of a loss weighted down where float16 loses its gradients
    loss_scale: int = 10           # log2 of the loss scale applied at small_weight
    seed: int = 0                  # seed of every draw

    def __post_init__(self):
        common.validate(self, ints={"trials": 2, "ones": 2049, "batch": 1, "tokens": 2,
                                    "loss_scale": (0, 40), "seed": 0},
                        tuples={"lengths": 2, "exponents": (-60, 60)})
        tasks.get("palindrome").check_tokens(self.tokens)
        for field in ("weight", "small_weight"):
            if getattr(self, field) not in self.exponents:
                raise ValueError(f"{field}: expected one of exponents, got {getattr(self, field)!r}")
        if self.small_weight + self.loss_scale not in self.exponents:
            raise ValueError(f"loss_scale: expected small_weight + loss_scale in exponents, got "
                             f"{self.small_weight} + {self.loss_scale}")


def binomial(k, n):
    """A fraction k/n and its standard error, Agresti-Coull ((k + 2)/(n + 4)), so that 0 of n
    still has an uncertainty."""
    p = (k + 2) / (n + 4)
    return k / n, math.sqrt(p * (1 - p) / (n + 4))


# --- 1. reductions -------------------------------------------------------------------------

def half_dot(x, y):
    """Dot products accumulated in the format of x and y: each product rounded (NumPy computes a
    half product in float32 and rounds it: correctly rounded, 24 >= 2 p + 2 bits), then a running
    sum whose every partial sum is rounded (cumsum).  x, y: (trials, n) -> (trials,) float64."""
    return np.cumsum(x * y, axis=1)[:, -1].astype(np.float64)            # (trials,)


def lab_dot(x, y):
    """The lab's linear kernel: x (trials, n) times each row's own y, float32 accumulation, the
    result rounded once to the format.  One product per trial would cost a call each, so the
    (trials, n) x (n, trials) product's diagonal is taken: the same float32 dot products."""
    W = np.ascontiguousarray(y.T)                                        # (n, trials)
    out, _ = kernels.linear_forward(x, {"W": W, "b": np.zeros(len(x), x.dtype)})
    return np.diagonal(out).astype(np.float64)                           # (trials,)


def reduction_errors(config, rng, dtype):
    """Per length the relative errors (trials,) of the half-format recursion and of the lab's
    kernel, each against the exact (float64) dot product."""
    out = {"half": [], "lab": []}
    for n in config.lengths:
        scale = 2.0 ** rng.random((config.trials, 1))                    # (trials, 1) log-uniform
        x = (rng.random((config.trials, n)) * scale).astype(dtype)       # (trials, n)
        y = rng.random((config.trials, n)).astype(dtype)                 # (trials, n)
        exact = (x.astype(np.float64) * y.astype(np.float64)).sum(axis=1)  # (trials,) 53 bits
        out["half"].append(np.abs(half_dot(x, y) - exact) / exact)
        out["lab"].append(np.abs(lab_dot(x, y) - exact) / exact)
    return {k: np.array(v) for k, v in out.items()}                      # (lengths, trials) each


def running_ones(length, dtype):
    """A running sum of ones in the format: (length,) float64 partial sums, and where it stops
    growing (the value it stalls at)."""
    partial = np.cumsum(np.ones(length, dtype)).astype(np.float64)       # (length,)
    stuck = np.flatnonzero(np.diff(partial) == 0)
    return partial, float(partial[stuck[0]]) if len(stuck) else math.nan


# --- 2. gradient underflow -------------------------------------------------------------------

def gradients(config):
    """Every parameter gradient of one palindrome batch at initialisation (flattened, float64):
    float32 at upstream gradient 1 and float16 at each 2^e of config.exponents (one forward, a
    backward per e).  float32 gradients at 2^e are 2^e times those at 1 exactly (no float32
    underflow at these sizes), so one float32 backward serves every e."""
    c = model_kernels.ModelConfig()
    data = tasks.make_dataset("palindrome", batches=1, batch=config.batch, T=config.tokens,
                              seed=config.seed)
    src, tgt = data[0, 0], data[0, 1]                                    # (B, T) each
    table = model_kernels.embedding_table(c)

    def backward(dtype, exponents):
        params = model_kernels.init_params(c, seed=config.seed, dtype=dtype)
        loss, cache = model_kernels.model_forward(src, tgt, params, embedding=table.astype(dtype))
        out = []
        for e in exponents:
            _, grads = model_kernels.model_backward(np.asarray(2.0 ** e, dtype), cache)
            out.append(np.concatenate([g.ravel() for g in grads.values()]).astype(np.float64))
        return float(loss), np.array(out)                                # (E, P)

    loss32, g32 = backward(np.float32, [0])
    loss16, g16 = backward(np.float16, config.exponents)
    return {"loss32": loss32, "loss16": loss16, "g32": g32[0], "g16": g16,
            "exponents": tuple(config.exponents), "positions": config.batch * (config.tokens + 1)}


# --- 3. softmax overflow ---------------------------------------------------------------------

def format_grid(dtype, lo, hi):
    """Every value of a format in [lo, hi] (lo >= 0), ascending, by walking its bit patterns."""
    bits = np.dtype(f"u{np.dtype(dtype).itemsize}")
    a, b = (np.array([v], dtype).view(bits)[0] for v in (lo, hi))
    return np.arange(a, b + 1, dtype=bits).view(dtype)                   # (G,)


def exp_overflow_threshold(dtype):
    """The smallest value x of the format whose exp rounds to inf: exp(x) at or above the midpoint
    between the largest finite value and the next power of two (a tie rounds to the even one,
    which is inf).  Computed in float64."""
    info = np.finfo(dtype)
    biggest = float(info.max)
    midpoint = (biggest + 2.0 ** (info.maxexp)) / 2                      # 65520 in float16
    grid = format_grid(dtype, 0.0, 2 * math.log(midpoint))
    return float(grid[np.searchsorted(grid.astype(np.float64), math.log(midpoint))])


def naive_softmax(x):
    """exp of the unshifted logits in x's own format, divided by their sum: (..., N)."""
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)                                                    # (..., N) in the format
        return e / e.sum(axis=-1, keepdims=True)


def softmax_overflow(dtype, width=8):
    """Rows (x, 0, ..., 0) of width for every value x >= 0 of the format up to twice the predicted
    threshold: x (G,), whether the naive and the lab's softmax rows are non-finite (G,) each,
    and the lab kernel's normwise error against float64."""
    predicted = exp_overflow_threshold(dtype)
    x = format_grid(dtype, 0.0, 2 * predicted)                           # (G,)
    rows = np.zeros((len(x), width), dtype)                              # (G, width)
    rows[:, 0] = x
    naive = ~np.isfinite(naive_softmax(rows).astype(np.float64)).all(axis=1)      # (G,)
    lab, _ = kernels.softmax_forward(rows, {})
    lab = lab.astype(np.float64)                                         # (G, width)
    r64 = rows.astype(np.float64)
    ref = np.exp(r64 - r64.max(axis=1, keepdims=True))
    ref /= ref.sum(axis=1, keepdims=True)
    return {"x": x.astype(np.float64), "naive": naive, "lab": ~np.isfinite(lab).all(axis=1),
            "predicted": predicted, "lab_error": normwise(lab, ref)}


# --- 4. Adam's eps ---------------------------------------------------------------------------

def adam_first_step(g, dtype, rate=1e-3):
    """kernels.optim.adam_step from zero moments and zero parameters, gradient g (G,) cast to
    the format: the update (G,) float64."""
    params = {"p": np.zeros(len(g), dtype)}
    with np.errstate(divide="ignore", invalid="ignore", under="ignore"):
        new, _ = adam_step(params, {"p": g.astype(dtype)}, adam_init(params), rate)
    return new["p"].astype(np.float64)


def adam_eps():
    """|g| over every non-negative float16 value up to 1, the first Adam step's update in
    float16, bfloat16 and float32 for each, and eps as each format stores it."""
    g = format_grid(FLOAT16, 0.0, 1.0)                                   # (G,) 0, subnormals, ..., 1
    steps = {name: adam_first_step(g, dt) for name, dt in
             (("float16", FLOAT16), ("bfloat16", BFLOAT16), ("float32", np.float32))}
    stored = {name: float(np.asarray(EPS, dt).astype(np.float64))
              for name, dt in (("float16", FLOAT16), ("bfloat16", BFLOAT16))}
    return {"g": g.astype(np.float64), "steps": steps, "eps": stored}


def adam_threshold():
    """The |g| below which float16 Adam's v = (1 - beta2) g^2 underflows to 0 (to first order:
    (1 - beta2) g^2 <= 2^-25), and its relative uncertainty: the rounding of 1 - beta2 to float16
    and of g^2 (a subnormal there, spacing 2^-24), each moving g by at most half its own."""
    g = math.sqrt(UNDERFLOW / (1 - BETA2))
    stored = float(np.float16(1 - BETA2))
    relative = abs(stored / (1 - BETA2) - 1) / 2 + (2.0 ** -24 / g ** 2) / 2
    return g, relative


# --- the study -------------------------------------------------------------------------------

def measure(config):
    rng = np.random.default_rng(config.seed)
    red = {name: reduction_errors(config, rng, dt) for name, dt in FORMATS.items()}
    ones = {name: running_ones(config.ones, dt) for name, dt in FORMATS.items()}
    soft = {name: softmax_overflow(dt) for name, dt in FORMATS.items()}
    return {"reductions": red, "ones": ones, "grads": gradients(config), "softmax": soft,
            "adam": adam_eps()}


def exact_threshold(x, bad):
    """The smallest x (ascending) from which every row is bad, and whether bad is exactly a step
    (good below, bad from there on)."""
    first = int(np.argmax(bad)) if bad.any() else len(x)
    return (float(x[first]) if first < len(x) else math.inf), bool(bad[first:].all() and not bad[:first].any())


def underflow_fractions(m, e, scale=0):
    """At upstream gradient 2^e with loss scale 2^scale: the float16 zero fraction (measured
    after unscaling, which keeps zeros zero) and the float32 prediction, each (fraction, SE)."""
    grads = m["grads"]
    i = list(grads["exponents"]).index(e + scale)
    g16, g32 = grads["g16"][i], grads["g32"] * 2.0 ** (e + scale)
    n = g32.size
    return binomial(int((g16 == 0).sum()), n), binomial(int((np.abs(g32) <= UNDERFLOW).sum()), n)


def paired_zeros(m, e, scale=0):
    """The same elements judged twice (float16 zero; float32 |g| at or below 2^-25): McNemar's
    paired comparison.  Returns the difference of the two fractions, its standard error from the
    discordant elements, sqrt(b + c - (b - c)^2 / N) / N, and the counts b (zero in float16 only)
    and c (predicted only)."""
    grads = m["grads"]
    i = list(grads["exponents"]).index(e + scale)
    z16 = grads["g16"][i] == 0
    z32 = np.abs(grads["g32"] * 2.0 ** (e + scale)) <= UNDERFLOW
    N, b, c = z16.size, int((z16 & ~z32).sum()), int((~z16 & z32).sum())
    return (b - c) / N, math.sqrt(max(b + c - (b - c) ** 2 / N, 0.0)) / N, b, c


def stagnation_exponent(m, config, name="float16"):
    """Slope of log mean error against log n for n >= 1/u (the running sum has reached the size
    where terms below half an ulp start to vanish), with its SE (0 with two lengths)."""
    n = np.array(config.lengths, float)
    late = n >= 1 / U[name]
    if late.sum() < 2:
        return math.nan, math.nan
    slope, se, _ = common.fit_slope(np.log(n[late]), np.log(m["reductions"][name]["half"][late].mean(axis=1)))
    return slope, se


def _headlines(m, config):
    heads = []
    for name in FORMATS:
        heads.append(common.exact(f"running sum of ones in {name}: the value it stalls at",
                                  m["ones"][name][1], 1 / U[name],
                                  f"1/u = 2^{-round(math.log2(U[name]))}: adding 1 is half an ulp, "
                                  "the tie rounds to the even value"))
    n = np.array(config.lengths, float)
    ratios, ratios_t = [], []
    for name in FORMATS:
        worst = m["reductions"][name]["half"].max(axis=1)                # (lengths,)
        live = n * U[name] < 1
        ratios.append((worst[live] / gamma(n[live], U[name])).max())
        ratios_t.append((worst[live] / gamma_tilde(n[live], LAMBDA, U[name])).max())
    heads.append(common.bound("dot products accumulated in the half format: largest error / γ_n, "
                              "n u < 1, float16 and bfloat16", max(ratios), 1.0,
                              "Higham 2002, γ_n = nu/(1 − nu) (worst case)", "max over trials and n < 1/u ≤ 1"))
    heads.append(common.bound(f"dot products accumulated in the half format: largest error / "
                              f"γ̃_n(λ = {LAMBDA:g}), n u < 1, float16 and bfloat16", max(ratios_t), 1.0,
                              f"Higham & Mary 2019, Theorem 3.1 (independent mean-zero rounding errors; "
                              f"fails with probability ≤ {failure_probability(n.max(), LAMBDA, U['bfloat16']):.0e} per sum)",
                              "max over trials and n < 1/u ≤ 1"))
    slope16, se16 = stagnation_exponent(m, config)
    heads.append(common.shown("dot products accumulated in float16: exponent of the mean error in n, "
                              "n ≥ 1/u", slope16, se16, "0.5 if the rounding errors stayed independent "
                              "with mean zero", "stagnation: terms below half an ulp of the sum are lost"))
    lab_bound = max((m["reductions"][name]["lab"].max(axis=1)
                     / (U[name] + gamma(n - 1, U32) * (1 + U[name]))).max() for name in FORMATS)
    heads.append(common.bound("lab's kernel (float32 accumulation, one rounding): largest error / "
                              "(u + γ_{n−1}(float32)(1 + u))", lab_bound, 1.0,
                              "one rounding to the format after a float32 sum", "max over trials, n and formats ≤ 1"))
    pooled = np.concatenate([m["reductions"][name]["lab"].ravel() / (U[name] / (4 * math.log(2)))
                             for name in FORMATS])
    heads.append(common.test("lab's kernel: mean relative error / (u / (4 ln 2)), every n, both formats",
                             *common.mean_se(pooled), 1.0,
                             "one rounding to nearest of a log-uniform significand: E|δ|/x = u/(4 ln 2)"))
    per_n = np.mean([m["reductions"][name]["lab"] / U[name] for name in FORMATS], axis=0)  # (lengths, trials)
    slope, se, df = common.fit_slope(np.log2(n), per_n.mean(axis=1))
    heads.append(common.test("lab's kernel: slope of the mean error / u against log2 n", slope, se, 0.0,
                             "float32 accumulation: the final rounding dominates at every n", df=df))
    (z16, _), (z32, _) = underflow_fractions(m, config.weight)
    diff, diff_se, b, c = paired_zeros(m, config.weight)
    heads.append(common.test(f"float16 gradients equal to 0 minus float32 gradients with |g| ≤ 2^-25, "
                             f"upstream gradient 2^{config.weight} (paired by element)", diff, diff_se,
                             0.0, f"rounding to float16 alone: fractions {z16:.4g} and {z32:.4g}; McNemar "
                             f"SE from the {b} + {c} discordant elements"))
    (s16, s16_se), (s32, s32_se) = underflow_fractions(m, config.small_weight)
    heads.append(common.shown(f"float16 gradients equal to 0, upstream gradient 2^{config.small_weight}, "
                              "no loss scale", s16, s16_se,
                              f"float32 |g| ≤ 2^-25: {s32:.3g} (per-position gradients underflow first)",
                              "the rounding of the float32 gradient alone"))
    (l16, _), (l32, _) = underflow_fractions(m, config.small_weight, config.loss_scale)
    diff, diff_se, b, c = paired_zeros(m, config.small_weight, config.loss_scale)
    heads.append(common.test(f"float16 gradients equal to 0 minus float32 gradients with |g| ≤ 2^-25 / S, "
                             f"upstream gradient 2^{config.small_weight}, loss scale S = 2^{config.loss_scale} "
                             "(paired by element)", diff, diff_se, 0.0,
                             f"Micikevicius et al. 2018: the scale undoes the underflow; fractions "
                             f"{l16:.4g} and {l32:.4g}; McNemar SE from the {b} + {c} discordant elements"))
    for name in FORMATS:
        s = m["softmax"][name]
        first, step = exact_threshold(s["x"], s["naive"])
        heads.append(common.exact(f"naive {name} softmax (no max shift): smallest non-finite logit"
                                  + ("" if step else " (not a clean step)"), first if step else math.nan,
                                  s["predicted"], "the first value of the format with exp(x) ≥ the "
                                  "midpoint above its largest finite value"))
    heads.append(common.exact("lab's softmax kernel: non-finite rows over both sweeps",
                              sum(int(s["lab"].sum()) for s in m["softmax"].values()), 0,
                              "max shift in float32 (kernels.precision): exp ≤ 1 by construction",
                              kind="identity"))
    heads.append(common.exact("Adam's eps = 1e-8 stored in float16", m["adam"]["eps"]["float16"], 0.0,
                              "1e-8 < 2^-25 (half the smallest subnormal): rounds to 0", kind="identity"))
    a = m["adam"]
    bad16 = ~np.isfinite(a["steps"]["float16"])
    g_star, rel = adam_threshold()
    largest_bad = float(a["g"][bad16].max()) if bad16.any() else math.nan
    step = float(np.spacing(np.float16(g_star)))
    heads.append(common.in_interval("float16 Adam, first step from zero moments: largest |g| with a "
                                    "non-finite update", largest_bad, 0.0, g_star * (1 - rel) - step,
                                    g_star * (1 + rel), "(1 − β2) g² ≤ 2^-25 underflows v and eps is 0: "
                                    "m / 0 (0 / 0 at g = 0); ± the rounding of 1 − β2 and g², − one "
                                    "grid step"))
    heads.append(common.exact("float32 and bfloat16 Adam, same steps: non-finite updates",
                              int((~np.isfinite(a["steps"]["float32"])).sum()
                                  + (~np.isfinite(a["steps"]["bfloat16"])).sum()), 0,
                              "eps stays positive (bfloat16: 1.0012e-8), v does not underflow",
                              kind="identity"))
    return heads


def _grad_rows(m):
    """Per upstream gradient 2^e: float16 zero, subnormal and non-finite fractions, the float32
    prediction of the zeros and the normwise error of the unscaled float16 gradients."""
    grads, rows = m["grads"], []
    for i, e in enumerate(grads["exponents"]):
        g16, g32 = grads["g16"][i], grads["g32"] * 2.0 ** e                # (P,) each
        a32, finite = np.abs(g32), np.isfinite(g16)
        rows.append({"e": e, "float16 zero": float((g16 == 0).mean()),
                     "float32 |g| ≤ 2^-25": float((a32 <= UNDERFLOW).mean()),
                     "float16 subnormal": float(((g16 != 0) & (np.abs(g16) < 2.0 ** -14)).mean()),
                     "float32 2^-25 < |g| < 2^-14": float(((a32 > UNDERFLOW) & (a32 < 2.0 ** -14)).mean()),
                     "float16 non-finite": float((~finite).mean()),
                     "normwise error of 2^-e g16": normwise(g16 / 2.0 ** e, grads["g32"]) if finite.all() else math.inf})
    return rows


def _tables(m, config):
    n_rows = []
    for i, n in enumerate(config.lengths):
        row = {"n": n}
        for name in FORMATS:
            r = m["reductions"][name]
            mean, se = common.mean_se(r["half"][i] / U[name])
            row[f"{name} half-format: mean ± SE / max (units of u)"] = \
                f"{mean:.3g} ± {se:.2g} / {r['half'][i].max() / U[name]:.3g}"
            row[f"{name} γ_n / γ̃_n(λ = {LAMBDA:g}) (u)"] = \
                (f"{gamma(n, U[name]) / U[name]:.3g}" if n * U[name] < 1 else "vacuous") + \
                f" / {gamma_tilde(n, LAMBDA, U[name]) / U[name]:.3g}"
            mean, se = common.mean_se(r["lab"][i] / U[name])
            row[f"{name} lab kernel: mean ± SE / max (u)"] = \
                f"{mean:.3f} ± {se:.2g} / {r['lab'][i].max() / U[name]:.3f}"
        n_rows.append(row)
    grads = [{**row, "zero − prediction ± paired SE": "{:.3g} ± {:.2g}".format(*paired_zeros(m, row["e"])[:2])}
             for row in _grad_rows(m)]
    return [(f"dot products of n positive terms, relative error in units of each format's u "
             f"({config.trials} trials; u/(4 ln 2) = 0.361 u)", n_rows),
            (f"gradient elements of the article-size model, one palindrome batch, upstream "
             f"gradient 2^e ({m['grads']['g32'].size} elements; the fractions are of all of them, the "
             f"difference's SE is McNemar's)", grads)]


def steps(x, y):
    """A step function by its change points only (x, y each (K,)), for a cheap steps-post line."""
    keep = np.r_[True, np.diff(y) != 0]
    keep[-1] = True
    return x[keep], y[keep]


def _charts(m, config, figures):
    n = np.array(config.lengths, float)
    fig, axes = common.figure(3, width=4.6, height=4.0)
    for ax, name in zip(axes, FORMATS):
        u, r = U[name], m["reductions"][name]
        grid = np.geomspace(n.min(), n.max(), 200)                          # (200,)
        live = grid * u < 1
        ax.loglog(n, r["half"].max(axis=1), "C0o-", ms=4, lw=1, label="half-format sum, largest")
        ax.loglog(n, r["half"].mean(axis=1), "C0o:", ms=3, lw=1, label="half-format sum, mean")
        ax.loglog(n, r["lab"].max(axis=1), "C1s-", ms=4, lw=1, label="lab kernel (float32 acc.), largest")
        ax.loglog(n, r["lab"].mean(axis=1), "C1s:", ms=3, lw=1, label="lab kernel, mean")
        ax.loglog(grid[live], gamma(grid[live], u), "r--", lw=1.2, label="γ_n (worst case)")
        ax.loglog(grid, gamma_tilde(grid, LAMBDA, u), "r-.", lw=1.2, label=f"γ̃_n(λ = {LAMBDA:g})")
        ax.axhline(u, color="0.4", lw=1, label=f"u = 2^{round(math.log2(u))}")
        ax.axvspan(1 / u, n.max() * 1.5, color="0.9", zorder=0, label="n u ≥ 1: γ_n vacuous")
        common.label(ax, f"{name}: dot products of n positive terms", "n", "relative error",
                     legend="upper left" if name == "float16" else False)
    for name in FORMATS:
        partial, stall = m["ones"][name]
        k = np.unique(np.geomspace(1, len(partial), 200).astype(int))       # (<= 200,) terms added
        axes[2].loglog(k, partial[k - 1], lw=1.5, label=f"{name} (stalls at {stall:g})")
        axes[2].axhline(1 / U[name], ls=":", color="0.4", lw=1)
    axes[2].loglog([1, config.ones], [1, config.ones], "k--", lw=1, label="exact")
    common.label(axes[2], "running sum of ones", "terms added", "sum", legend="upper left")
    common.save(fig, NAME, "reduction.png",
                f"Relative error of dot products of n positive terms against float64 ({config.trials} "
                f"trials per n). Accumulated in the half format the error grows until the partial sum "
                f"is 1/u times its terms, then faster (stagnation: terms below half an ulp are lost) "
                f"— beyond the probabilistic γ̃_n (λ = {LAMBDA:g}, Higham & Mary 2019, which assumes "
                f"independent mean-zero rounding errors; probability ≥ 1 − 2n exp(−λ²(1−u)²/2) = "
                f"{1 - failure_probability(n.max(), LAMBDA, U['bfloat16']):.7f} at n = {int(n.max())}) "
                f"and where the worst case γ_n = nu/(1 − nu) is no longer defined (grey). The lab's "
                f"kernels accumulate in float32 and round once: error under u at every n. Right: a "
                f"running sum of ones stalls at 1/u (2048, 256).", figures)

    rows = _grad_rows(m)
    e = np.array([r["e"] for r in rows])
    fig, (b1, b2) = common.figure(2, width=5.4, height=4.2)
    a32 = np.abs(m["grads"]["g32"])
    b1.hist(np.log2(a32[a32 > 0]), bins=60, color="C0", alpha=0.8)
    for k, style in ((-25, "r--"), (-14, "k:")):
        b1.axvline(k, color=style[0], ls=style[1:], lw=1.2, label=f"2^{k}" + (" (rounds to 0)" if k == -25 else " (smallest normal)"))
    common.label(b1, "float32 gradients at upstream gradient 1", "log2 |g|", "elements", legend="upper left")
    b2.plot(e, [r["float16 zero"] for r in rows], "C0o-", ms=4, label="float16: zero")
    b2.plot(e, [r["float32 |g| ≤ 2^-25"] for r in rows], "C0--", label="float32: |g| ≤ 2^-25 (prediction)")
    b2.plot(e, [r["float16 subnormal"] for r in rows], "C2s-", ms=3, label="float16: subnormal")
    b2.plot(e, [r["float16 non-finite"] for r in rows], "C3^-", ms=3, label="float16: non-finite")
    # the tested points, float16 zeros against the prediction, with the paired (McNemar) ±3 SE
    for weight, scale, marker in ((config.weight, 0, "D"), (config.small_weight, config.loss_scale, "*")):
        (z16, _), (z32, _) = underflow_fractions(m, weight, scale)
        _, se, _, _ = paired_zeros(m, weight, scale)
        b2.errorbar([weight + scale], [z16], yerr=[3 * se], fmt=marker, color="k", ms=7, capsize=4, zorder=5,
                    label=f"tested: e = {weight}" + (f", loss scale 2^{scale}" if scale else "")
                    + " (±3 paired SE)")
    b2.axvline(config.small_weight, color="0.5", ls=":", lw=1)
    b2.annotate("", xy=(config.small_weight + config.loss_scale, 0.3), xytext=(config.small_weight, 0.3),
                arrowprops={"arrowstyle": "->", "color": "0.3"})
    b2.text(config.small_weight + 0.3, 0.4, f"loss scale 2^{config.loss_scale}", fontsize=7)
    b2.set_yscale("symlog", linthresh=1e-3)   # linear below 0.1 %, logarithmic above: 0.02 is readable
    b2.set_ylim(0, 1.5)
    common.label(b2, "float16 gradient elements of the model", "log2 of the upstream gradient e",
                 "fraction of elements (symlog)", legend=False)
    b2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))   # beside the data, not on it
    common.save(fig, NAME, "underflow.png",
                f"Left: where the model's float32 gradients lie (one palindrome batch, initialisation). "
                f"Right: float16 gradients that are zero, subnormal or non-finite as the loss's gradient "
                f"2^e shrinks, against the fraction of float32 gradients at or below 2^-25 (which round "
                f"to 0). The two agree while only the parameter gradients underflow (here e ≥ −6; at −8 it depends on the draw); below, "
                f"the per-position gradients (1/{m['grads']['positions']} of the loss's) underflow "
                f"first and the float16 zeros exceed the prediction. A loss scale S moves a point "
                f"log2 S to the right (arrow).", figures)

    fig, (c1, c2) = common.figure(2, width=5.4, height=4.2)
    for i, name in enumerate(FORMATS):
        s = m["softmax"][name]
        c1.plot(*steps(s["x"], s["naive"] + 0.02 * i), drawstyle="steps-post", color=f"C{i}", lw=1.5, label=f"naive {name} (no max shift)")
        c1.plot(*steps(s["x"], s["lab"] - 0.02 * (i + 1)), drawstyle="steps-post", color=f"C{i}", ls=":", lw=1.5, label=f"lab kernel, {name}")
        c1.axvline(s["predicted"], color=f"C{i}", ls="--", lw=1, label=f"predicted {s['predicted']:g}")
    c1.set_xscale("symlog", linthresh=1)
    c1.set_xlim(0, 2 * m["softmax"]["bfloat16"]["predicted"])
    common.label(c1, "softmax of (x, 0, …, 0): non-finite rows", "x (every value of the format)",
                 "non-finite (1) or finite (0)", legend="center left")
    a = m["adam"]
    every = slice(None, None, 16)                                           # a line needs no more
    g = a["g"][every]
    for i, name in enumerate(("float16", "bfloat16", "float32")):
        step = np.abs(a["steps"][name][every])
        step[~np.isfinite(step) | (g == 0)] = np.nan                        # gaps where inf
        c2.loglog(g, step, "-", color=f"C{i}", lw=1.5 - 0.4 * i, label=f"{name}: |update|")
    bad = ~np.isfinite(a["steps"]["float16"]) & (a["g"] > 0)
    c2.fill_between([a["g"][bad].min(), a["g"][bad].max()], 1e-5, 1e-1, color="C3", alpha=0.15,
                    label="float16: update inf")
    c2.axvline(adam_threshold()[0], color="C3", ls="--", lw=1, label=f"√(2^-25/(1−β2)) = {adam_threshold()[0]:.2e}")
    common.label(c2, "Adam's first step from zero moments (rate 1e-3)", "|g|", "|update|", legend="lower right")
    common.save(fig, NAME, "range.png",
                "Left: a softmax computing exp in the half format without subtracting the row's max "
                "is non-finite from the first value whose exp rounds to inf (float16 11.09, bfloat16 "
                "89) on; the lab's kernel (max shift, float32) stays finite. Right: float16 stores "
                "Adam's eps = 1e-8 as 0, so the first step divides by √v alone: infinite wherever "
                "v = (1 − β2) g² underflows (NaN at g = 0); bfloat16 and float32 step by the rate.",
                figures)


def _rows(m, config):
    rows = []
    for name in FORMATS:
        r = m["reductions"][name]
        rows += [{"part": "dot product", "format": name, "n": n, "trial": t,
                  "half_format_error": r["half"][i, t], "lab_kernel_error": r["lab"][i, t],
                  "u": U[name], "gamma_n": gamma(n, U[name]) if n * U[name] < 1 else math.inf,
                  "gamma_tilde": gamma_tilde(n, LAMBDA, U[name])}
                 for i, n in enumerate(config.lengths) for t in range(config.trials)]
        rows.append({"part": "running sum of ones", "format": name, "stall": m["ones"][name][1]})
        s = m["softmax"][name]
        rows.append({"part": "softmax overflow", "format": name, "predicted": s["predicted"],
                     "measured": exact_threshold(s["x"], s["naive"])[0],
                     "lab_nonfinite_rows": int(s["lab"].sum()), "lab_normwise_error": s["lab_error"]})
        rows.append({"part": "adam eps", "format": name, "stored_eps": m["adam"]["eps"][name]})
    rows += [{"part": "gradients", **r} for r in _grad_rows(m)]
    a = m["adam"]
    bad = ~np.isfinite(a["steps"]["float16"])
    rows.append({"part": "adam first step", "format": "float16", "largest_nonfinite_g": float(a["g"][bad].max()),
                 "predicted": adam_threshold()[0], "update_at_g0": a["steps"]["float16"][0]})
    return rows


def _summary(m, heads, config):
    g = m["grads"]
    return "\n".join([f"float32 loss {g['loss32']:.4f}, float16 loss {g['loss16']:.4f} (one batch, "
                      f"initialisation)", *(h.sentence() for h in heads)])


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, _headlines, _charts, _rows, summary=_summary,
                          tables=_tables)
