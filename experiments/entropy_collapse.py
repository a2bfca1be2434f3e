"""entropy_collapse: attention entropy as the logits grow, the published lower bound, and QK-norm.

Sweep.  One head of width d = 64 over n = 64 tokens x ~ N(0, 1), W_Q and W_K N(0, 1/d), both
multiplied by sqrt(lambda) so that the logits x_i M x_j, M = lambda W_Q W_K^T / sqrt(d), grow
linearly in the logit scale lambda (as attention logits grow during an unstable run, Zhai et al.
2023; Wortsman et al. 2023).  Per scale and over independent weight draws: the mean entropy of the
attention rows, the largest |logit|, and the logit-gradient gain |J g|/|g| of the rows (J the
softmax Jacobian, g a random upstream gradient), without and with QK-norm: the queries and keys
RMS-normalised (the lab's rms_norm kernel) before the product, logits q^.k^/sqrt(d).

The entropy bound.  Zhai et al. 2023 (Theorem 3.1) bound an attention row's entropy from below
by a function of sigma = ||W_K W_Q^T||_2 that falls exponentially in sigma: the entropy of one key
at the top of the logits' range and the other n - 1 at its bottom,
f_1(Delta) = log(1 + (n - 1) e^-Delta) + Delta (n - 1) e^-Delta / (1 + (n - 1) e^-Delta), the
range Delta set by sigma and the inputs' norms (here, per row i: every logit lies within
+- ||M||_2 |x_i| max_j |x_j|, Delta_i twice that).  What the lab checks, in these terms:
- The exact smallest entropy over logits spanning at most Delta: the entropy is unimodal in each
  logit with its maximum inside the range (dH/dz_j = -p_j (z_j - sum p z)), so the minimum puts
  every logit at an end: k keys at the top, min over k of f_k(Delta) =
  log(k + (n - k) e^-Delta) + Delta (n - k) e^-Delta / (k + (n - k) e^-Delta).  One top key (f_1)
  is that minimum only for Delta above a threshold Delta_1(n) (3.37 at n = 16, 5.26 at n = 64);
  below it several top keys give less (n = 16, Delta = 1: five keys, 2.650 nats against f_1's
  2.721), so f_1 is a lower bound only for Delta >= Delta_1(n).  The exact minimum is the bound
  checked (Consistent), with its margin; the one-key form's excess below Delta_1 is shown.
- Tightness: the minimum is attained by its extremal logits (k keys at the top), checked through
  the lab's softmax kernel (an Identity), and measured on data as bound / entropy per row: near 0
  for random weights (the spans are wide, the bound vacuous), close to 1 in a trained run.
With QK-norm |q^| = |k^| = sqrt(d), so the logits stay within +- sqrt(d) whatever the weights; for
queries and keys of independent isotropic directions their mean square is exactly 1 (E (u.v)^2 =
|u|^2 |v|^2 / d) at every scale: an Identity of the normalisation, not a result.

Learning rates (Wortsman et al. 2023 observe, in models of 10^7-10^9 parameters, that attention
logits grow and training diverges as the learning rate rises, and that QK-layernorm prevents it).
At the lab's scale: the palindrome run for a few epochs at each of several peak rates, plain and
with the model's QK-norm (kernels/attention.py: per-head layer norm of queries and keys with
learned gains g_Q, g_K starting at one, so the logit scale stays learnable: every logit lies
within sqrt(P) max|g_Q g_K|), the two arms of a seed sharing data, shuffles and initial weights;
after the last epoch each attention layer's mean entropy and largest logit on the validation
batch, and the losses.  Tested: (plain) the runs that fail (valid loss above 1 nat) have a smaller
lowest-layer entropy than every run that learns; (QK-norm) its ceiling (an Identity of the norm),
its largest logit at every rate below the smallest largest logit of a failed plain run, and
whether it learns at the rates where the plain runs fail (both Consistent-kind inequalities that
can fail); with several seeds (sweep_seeds) the paired log-ratio of the arms' largest logits at
the highest rate.  Not shown at this scale: divergence to infinity (the failed runs stall near the
loss of guessing, they do not blow up).

Training.  The article's palindrome run (float32, seed 0) is trained again and after every epoch
the attention rows of a fixed validation batch are read from the model's caches: mean entropy
per attention layer against the uniform value (ln of the keys a row sees), the largest logit, and
the bound's margin for the unmasked layers (encoder self-attention, cross-attention).
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import numpy as np

import kernels
from experiments import checkpoint, common, tasks, train
from kernels import model

NAME = "entropy_collapse"


@dataclasses.dataclass(frozen=True)
class Config:
    CHOICES: ClassVar[dict] = {"train_dtype": ("float32", "float64")}
    width: int = 64                # head width d
    keys: int = 64                 # n tokens, so n keys per query
    draws: int = 16                # independent weight draws per logit scale
    scales: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)  # logit scales lambda
    train_epochs: int = 10         # epochs of the palindrome run whose attention is tracked (0: skip)
    train_dtype: str = "float32"   # floating-point type of that run
    sweep_rates: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3)  # peak learning rates of the rate sweep (empty: skip)
    sweep_epochs: int = 3          # epochs of each rate-sweep run
    seed: int = 0                  # seed of every draw
    sweep_qk_norm: bool = True     # run every rate also with QK-norm (the model's qk_norm option)
    sweep_seeds: int = 1           # seeds per rate and arm (seed, seed + 1, ...), paired across arms

    def __post_init__(self):
        common.validate(self, ints={"width": 2, "keys": 2, "draws": 2, "seed": 0})
        common.check_int("train_epochs", self.train_epochs, 0)
        common.check_int("sweep_epochs", self.sweep_epochs, 1)
        common.check_int("sweep_seeds", self.sweep_seeds, 1)
        if any(not (isinstance(r, float) and r > 0) for r in self.sweep_rates) \
                or list(self.sweep_rates) != sorted(self.sweep_rates):
            raise ValueError(f"sweep_rates: expected increasing positive rates, got {self.sweep_rates}")
        if not self.scales or any(s <= 0 for s in self.scales) or list(self.scales) != sorted(self.scales):
            raise ValueError(f"scales: expected increasing positive logit scales, got {self.scales}")
        if self.train_dtype not in ("float32", "float64"):
            raise ValueError(f"train_dtype: expected float32 or float64, got {self.train_dtype!r}")


def top_k_entropy(delta, n, k):
    """Entropy of n probabilities whose logits are k at delta and n - k at 0:
    log(k + (n-k) e^-delta) + delta (n-k) e^-delta / (k + (n-k) e^-delta)."""
    delta = np.asarray(delta, float)
    e = (n - k) * np.exp(-delta)
    return np.log(k + e) + delta * e / (k + e)


def zhai_bound(delta, n):
    """The one-top-key entropy f_1(delta), the form of Zhai et al. 2023's bound: a lower bound on
    the entropy of logits spanning at most delta only for delta >= one_key_threshold(n)."""
    return top_k_entropy(delta, n, 1)


def min_entropy(delta, n):
    """The exact smallest entropy of n probabilities whose logits span at most delta: the
    minimum over k = 1 ... n - 1 top keys of top_k_entropy (module docstring)."""
    delta = np.asarray(delta, float)
    return np.min([top_k_entropy(delta, n, k) for k in range(1, n)], axis=0)


def best_k(delta, n):
    """How many top keys give the smallest entropy at span delta."""
    return 1 + int(np.argmin([top_k_entropy(delta, n, k) for k in range(1, n)]))


def one_key_threshold(n, hi=40.0):
    """Delta_1(n): the span above which one top key gives the smallest entropy (f_1 is the exact
    minimum), by bisection on the sign of f_1 - min_k f_k (zero above the threshold)."""
    lo = 1e-6
    if best_k(hi, n) != 1:
        raise ValueError(f"keys: expected n with one top key minimal below span {hi}, got {n}")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if best_k(mid, n) != 1 else (lo, mid)
    return hi


def row_entropy(p):
    """Entropy (nats) of each row of probabilities: (..., n) -> (...)."""
    return -(p * np.log(np.maximum(p, 1e-300))).sum(axis=-1)


def head(x, WQ, WK, qk_norm):
    """Logits of one head: x (R, n, d) -> (R, n, n); with qk_norm the queries and keys are
    RMS-normalised first."""
    d = x.shape[-1]
    q, k = x @ WQ, x @ WK                                            # (R, n, d) each
    if qk_norm:
        q, _ = kernels.rms_norm_forward(q, {})
        k, _ = kernels.rms_norm_forward(k, {})
    return q @ k.transpose(0, 2, 1) / math.sqrt(d)                   # (R, n, n)


def sweep(rng, config):
    """{(scale, qk_norm): {quantity: (draws,)}} and the bound margins (one per draw and scale)."""
    d, n = config.width, config.keys
    off = ~np.eye(n, dtype=bool)
    out = {}
    for lam in config.scales:
        for qk in (False, True):
            out[lam, qk] = {k: [] for k in ("entropy", "max_logit", "gain", "mean_square", "margin",
                                            "span", "tightness")}
    for _ in common.progress(range(config.draws), desc=f"{NAME} draws"):
        WQ, WK = (rng.standard_normal((d, d)) / math.sqrt(d) for _ in range(2))   # (d, d)
        x = rng.standard_normal((1, n, d))                                          # (1, n, d)
        g = rng.standard_normal((n, n))                                             # (n, n) upstream
        norms = np.linalg.norm(x[0], axis=-1)                                       # (n,)
        for lam in config.scales:
            s = math.sqrt(lam)
            for qk in (False, True):
                logits = head(x, s * WQ, s * WK, qk)[0]                             # (n, n)
                p, cache = kernels.softmax_forward(logits, {})
                jg, _ = kernels.softmax_backward(g, cache)
                ent = row_entropy(p)                                                # (n,)
                m = out[lam, qk]
                m["entropy"].append(ent.mean())
                m["max_logit"].append(np.abs(logits).max())
                m["gain"].append(np.median(np.linalg.norm(jg, axis=-1) / np.linalg.norm(g, axis=-1)))
                m["mean_square"].append((logits[off] ** 2).mean())
                if not qk:  # the bound for the plain head: M = lambda W_Q W_K^T / sqrt(d)
                    spec = lam * np.linalg.norm(WQ @ WK.T, 2) / math.sqrt(d)
                    delta = 2 * spec * norms * norms.max()                          # (n,)
                    bound = min_entropy(delta, n)                                   # (n,)
                    m["margin"].append((ent - bound).min())
                    m["span"].append(delta.min())
                    m["tightness"].append(np.median(bound / ent))
    return {key: {k: np.array(v) for k, v in m.items()} for key, m in out.items()}


# --- the palindrome run ---------------------------------------------------------------------

LAYERS = {"encoder self": "enc0.attn", "decoder self (causal)": "dec0.self", "cross": "dec0.cross"}


def attention_layers(params, embedding, src, tgt, *, margins=True):
    """{layer: (probabilities (H, B, T, S), logits, (bound margin, largest bound / entropy) or
    None)} of one forward pass (margins False: none computed).  With QK-norm the cache's q and k are
    the normalised ones, so the logits are those the softmax saw."""
    _, cache = model.model_forward(src, tgt, params, embedding=embedding)
    out = {}
    caches = dict(zip(LAYERS, (cache.encoder.blocks[0].attn.layer, cache.decoder.blocks[0].self_attn.layer,
                               cache.decoder.blocks[0].cross.layer)))
    for name, c in caches.items():
        P = c.q.shape[-1]
        logits = c.q @ np.swapaxes(c.k, -1, -2) / math.sqrt(P)                    # (H, B, T, S)
        margin = None
        if margins and "causal" not in name:
            W = params[LAYERS[name] + ".WQ"], params[LAYERS[name] + ".WK"]         # (H, P, P) each
            spec = np.array([np.linalg.norm(W[0][h] @ W[1][h].T, 2) for h in range(len(W[0]))]) / math.sqrt(P)
            H, B, T, S = logits.shape
            nq = np.linalg.norm(c.xq_h.reshape(H, B, T, P), axis=-1)              # (H, B, T)
            nk = np.linalg.norm(c.xkv_h.reshape(H, B, S, P), axis=-1).max(axis=-1)  # (H, B)
            delta = 2 * spec[:, None, None] * nq * nk[:, :, None]                  # (H, B, T)
            ent, bound = row_entropy(c.a.astype(np.float64)), min_entropy(delta, S)  # (H, B, T) each
            # an entropy of 0 has a bound of 0 too: the ratio is then 0, not 0/0
            margin = (float((ent - bound).min()), float((bound / np.maximum(ent, 1e-300)).max()))
        out[name] = (c.a.astype(np.float64), logits, margin)
    return out


def validation_batch(tcfg):
    """The first validation batch of a training config's data: (src, tgt)."""
    data = tasks.make_dataset(tcfg.task, batches=tcfg.batches, batch=tcfg.batch, T=tcfg.max_tokens,
                              seed=tcfg.seed)
    _, valid = tasks.split(data, valid_fraction=tcfg.valid_fraction, seed=tcfg.seed)
    return valid[0, 0], valid[0, 1]


ARMS = {"plain": False, "QK-norm": True}   # arm of the rate sweep -> the model's qk_norm


def qk_logit_limit(params, prefix):
    """The QK-norm layer's logit ceiling sqrt(P) max_{h,j} |gq[h, j] gk[h, j]| (kernels/attention.py)."""
    gq, gk = params[prefix + ".gq"], params[prefix + ".gk"]                       # (H, P) each
    return float(math.sqrt(gq.shape[-1]) * np.abs(gq * gk).max())


def rate_sweep(config):
    """Wortsman et al. 2023's sweep at the lab's scale: the palindrome run at each peak rate for
    sweep_epochs, plain and (sweep_qk_norm) with QK-norm, sweep_seeds seeds each, the two arms of a
    seed sharing data, shuffles and initial weights; after the last epoch, per attention layer,
    the mean entropy and the largest |logit| of the validation batch (with QK-norm also the
    layer's logit ceiling), with the losses.  One row per (rate, seed, arm, layer)."""
    arms = [arm for arm, qk in ARMS.items() if config.sweep_qk_norm or not qk]
    runs = [(rate, seed, arm) for rate in config.sweep_rates
            for seed in range(config.seed, config.seed + config.sweep_seeds) for arm in arms]
    rows = []
    for rate, seed, arm in common.progress(runs, desc=f"{NAME} rates"):
        tcfg = train.Config(epochs=config.sweep_epochs, dtype=config.train_dtype, seed=seed,
                            start_rate=rate, qk_norm=ARMS[arm])
        src, tgt = validation_batch(tcfg)
        fit = train.fit(tcfg, common.results_dir(NAME) / "checkpoint-sweep.npz")
        last = fit.history[-1]
        layers = attention_layers(fit.params, fit.embedding, src, tgt, margins=False)
        for name, (a, logits, _) in layers.items():
            rows.append({"rate": rate, "seed": seed, "arm": arm, "layer": name,
                         "entropy": float(row_entropy(a).mean()),
                         "max_logit": float(np.abs(np.where(a > 0, logits, 0)).max()),
                         "logit_limit": qk_logit_limit(fit.params, LAYERS[name]) if ARMS[arm] else "",
                         "train_loss": last["train_loss"], "valid_loss": last["valid_loss"]})
    return rows


def track_training(config):
    """Train the article's palindrome run; after each epoch, the attention statistics of a fixed
    validation batch.  Returns one row per (epoch, layer)."""
    tcfg = train.Config(epochs=config.train_epochs, dtype=config.train_dtype, seed=config.seed)
    src, tgt = validation_batch(tcfg)
    path = common.results_dir(NAME) / "checkpoint.npz"
    embedding = model.embedding_table(tcfg.model_config(), np.dtype(tcfg.dtype))
    rows = []

    def record(epoch, params, valid_loss):
        for name, (a, logits, margin) in attention_layers(params, embedding, src, tgt).items():
            seen = (a > 0).sum(axis=-1) if "causal" in name else np.full(a.shape[:-1], a.shape[-1])
            rows.append({"epoch": epoch, "layer": name, "entropy": float(row_entropy(a).mean()),
                         "uniform": float(np.log(seen).mean()),
                         "max_logit": float(np.abs(np.where(a > 0, logits, 0)).max()),
                         "bound_margin": "" if margin is None else margin[0],
                         "bound_over_entropy": "" if margin is None else margin[1],
                         "valid_loss": valid_loss})

    record(0, model.init_params(tcfg.model_config(), seed=tcfg.seed, dtype=np.dtype(tcfg.dtype),
                                std=tcfg.init_std), "")
    # fit() writes the checkpoint before it calls on_epoch: read the epoch's parameters from it
    train.fit(tcfg, path, on_epoch=lambda epoch, row: record(epoch, checkpoint.load(path).params,
                                                             row["valid_loss"]))
    return rows


def measure(config):
    rng = np.random.default_rng(config.seed)
    return (sweep(rng, config), track_training(config) if config.train_epochs else [],
            rate_sweep(config) if config.sweep_rates else [])


# --- headlines, tables, charts ----------------------------------------------------------------

def extremal_rows(n, spans):
    """The minimising logits at each span (the best k keys at the top, the rest at 0) through the
    lab's softmax kernel: their entropies and the exact minimum's formula, each (len(spans),)."""
    spans = np.asarray(spans, float)
    logits = np.zeros((len(spans), n))                                   # (spans, n)
    for i, delta in enumerate(spans):
        logits[i, :best_k(delta, n)] = delta
    p, _ = kernels.softmax_forward(logits, {})
    return row_entropy(p), min_entropy(spans, n)


def _headlines(m, config):
    grid, runs, rates = m
    n = config.keys
    plain = [grid[lam, False] for lam in config.scales]
    margins = np.concatenate([g["margin"] for g in plain])
    spans, tight = np.concatenate([g["span"] for g in plain]), np.concatenate([g["tightness"] for g in plain])
    threshold = one_key_threshold(n)
    heads = [common.bound("sweep: largest excess of the exact smallest entropy for the row's logit span "
                          "over the row's entropy, every row, draw and scale", -margins.min(), 0.0,
                          "Zhai et al. 2023, Theorem 3.1's form, minimised over k top keys",
                          f"max(bound − entropy) ≤ 0; vacuous for these random weights: spans ≥ "
                          f"{spans.min():.3g}, median bound / entropy per draw ≤ {tight.max():.2g}")]
    got, want = extremal_rows(n, np.linspace(0.25, 3 * threshold, 24))
    heads.append(common.exact(f"extremal logits (the best k of n = {n} keys at the top of the span, "
                              "24 spans): rows whose kernel entropy misses the exact minimum by > 1e-12",
                              int((np.abs(got - want) > 1e-12).sum()), 0,
                              "tightness: the minimum is attained by its extremal rows", kind="identity"))
    heads.append(common.shown(f"one-top-key form f_1 minus the exact minimum at span 1, n = {n}",
                              float(zhai_bound(1.0, n) - min_entropy(1.0, n)), float("nan"),
                              f"0 only for spans ≥ Δ_1(n) = {threshold:.3g}; at span 1, {best_k(1.0, n)} "
                              "top keys give less", "f_1 is a lower bound only above Δ_1(n)"))
    top = max(config.scales)
    ms = grid[top, True]["mean_square"]
    heads.append(common.test(f"QK-norm: mean square of the logits at logit scale {top:g}", *common.mean_se(ms),
                             1.0, "isotropic normalised q, k: E(q̂·k̂)²/d = 1 (the norm fixes it at every λ)",
                             df=len(ms) - 1, kind="identity"))
    if runs:
        trained = [r["bound_margin"] for r in runs if r["bound_margin"] != ""]
        closest = max(r["bound_over_entropy"] for r in runs if r["bound_over_entropy"] != "")
        heads.append(common.bound("palindrome run: largest exact-minimum bound − entropy, unmasked layers, "
                                  "every row and epoch", -min(trained), 0.0,
                                  "Zhai et al. 2023, Theorem 3.1's form, minimised over k top keys",
                                  f"max(bound − entropy) ≤ 0; tightness: largest bound / entropy over "
                                  f"the rows {closest:.3g}"))
        last = [r for r in runs if r["epoch"] == max(x["epoch"] for x in runs)]
        ratio = float(np.mean([r["entropy"] / r["uniform"] for r in last if r["uniform"] > 0]))
        heads.append(common.shown("palindrome run, after training: mean entropy / uniform, over the "
                                  "attention layers", ratio, float("nan"), "no published number for "
                                  "this run", "Zhai et al. 2023 (collapse in unstable runs)"))
    if rates:
        heads += _rate_headlines(rates, config)
    return heads


FAILED_LOSS = 1.0  # nats: a rate-sweep run whose valid loss stays above this has not learnt the task


class Run(NamedTuple):
    """One run of the rate sweep, summarised over its attention layers."""
    low_entropy: float   # the smallest layer's mean entropy
    max_logit: float     # the largest |logit| over its layers
    limit_share: float   # QK-norm: the largest logit / its layer's ceiling, over the layers (else nan)
    valid_loss: float

    @property
    def failed(self) -> bool:
        return self.valid_loss > FAILED_LOSS


def sweep_runs(rates) -> dict:
    """{(arm, rate, seed): Run} from the rate sweep's rows."""
    grouped = {}
    for r in rates:
        grouped.setdefault((r["arm"], r["rate"], r["seed"]), []).append(r)
    return {key: Run(min(r["entropy"] for r in rs), max(r["max_logit"] for r in rs),
                     max((r["max_logit"] / r["logit_limit"] for r in rs if r["logit_limit"] != ""),
                         default=float("nan")), rs[0]["valid_loss"])
            for key, rs in grouped.items()}


def _rates(rates):
    return ", ".join(f"{r:g}" for r in sorted(rates))


def _rate_headlines(rates, config):
    """Wortsman et al. 2023 at the lab's scale.  Plain arm: the smallest attention entropy of the
    runs that fail against that of the runs that learn (an inequality) and the logit growth
    (shown).  QK-norm arm: its logit ceiling (an identity of the norm), its largest logit against
    the plain runs' at failure, and whether it learns where the plain runs fail (inequalities);
    with several seeds, the paired logit reduction per rate."""
    runs = sweep_runs(rates)
    plain = {(rate, seed): run for (arm, rate, seed), run in runs.items() if arm == "plain"}
    qk = {(rate, seed): run for (arm, rate, seed), run in runs.items() if arm == "QK-norm"}
    failed = [key for key, run in plain.items() if run.failed]
    learnt = [key for key in plain if key not in failed]
    failed_rates = sorted({rate for rate, _ in failed})
    seeds = len({seed for _, seed in plain})
    heads = []
    if failed and learnt:
        heads.append(common.bound(f"rate sweep ({config.sweep_epochs} epochs, plain model): smallest layer entropy "
                                  f"of the runs that fail (valid loss > {FAILED_LOSS:g} nat: rates "
                                  f"{_rates(failed_rates)}) below that of every run that learns",
                                  max(plain[k].low_entropy for k in failed), min(plain[k].low_entropy for k in learnt),
                                  "Zhai et al. 2023, Wortsman et al. 2023: low attention entropy goes with "
                                  "unstable training", "largest failed-run entropy ≤ smallest learnt-run entropy"))
    article = train.Config().start_rate          # the article's peak rate, when the sweep has it
    by_rate = sorted({rate for rate, _ in plain})
    top, ref = by_rate[-1], article if article in by_rate else by_rate[0]
    biggest = {rate: float(np.median([run.max_logit for (r, _), run in plain.items() if r == rate]))
               for rate in by_rate}
    loss = {rate: float(np.median([run.valid_loss for (r, _), run in plain.items() if r == rate]))
            for rate in by_rate}
    heads.append(common.shown(f"rate sweep, plain model: largest attention logit at rate {top:g} over that at "
                              f"rate {ref:g} (median over {seeds} seed{'s' * (seeds > 1)})",
                              biggest[top] / biggest[ref], float("nan"), "Wortsman et al. 2023: attention "
                              "logits grow with the learning rate (no number at this scale)",
                              f"valid loss {loss[top]:.3g} against {loss[ref]:.3g}"))
    if qk:
        heads += _qk_headlines(plain, qk, failed, failed_rates)
    return heads


def _qk_headlines(plain, qk, failed, failed_rates):
    """The QK-norm arm against the plain one (same seeds, data and initial weights)."""
    heads = [dataclasses.replace(common.bound(
        "rate sweep, QK-norm model: largest attention logit over its layer's ceiling "
        "sqrt(P) max|g_Q g_K|, every rate, seed and layer", max(run.limit_share for run in qk.values()), 1.0,
        "the norm: |q̂|² ≤ P, so |(g_Q q̂)·(g_K k̂)|/sqrt(P) ≤ sqrt(P) max_j |g_Q,j g_K,j|",
        "largest logit / ceiling ≤ 1"), kind="identity")]
    if not failed:
        return heads
    at_failure = min(plain[k].max_logit for k in failed)
    heads.append(common.bound(
        f"rate sweep, QK-norm model: largest attention logit over every rate and seed, below the smallest "
        f"largest logit of the plain runs that fail (rates {_rates(failed_rates)})",
        max(run.max_logit for run in qk.values()), at_failure,
        "Wortsman et al. 2023: QK-layernorm prevents the attention-logit growth",
        "the QK-norm runs never reach the logits at which plain runs fail"))
    at_failed_rates = [run for (rate, _), run in qk.items() if rate in failed_rates]
    heads.append(common.bound(
        f"rate sweep, QK-norm model at the rates where the plain runs fail ({_rates(failed_rates)}): "
        "largest valid loss (nats)", max(run.valid_loss for run in at_failed_rates), FAILED_LOSS,
        "Wortsman et al. 2023: with QK-layernorm, rates at which the plain model diverges train",
        f"every QK-norm run there learns (valid loss ≤ {FAILED_LOSS:g} nat)"))
    top = max(rate for rate, _ in qk)           # the sweep's highest rate, fixed before the runs
    paired = [math.log10(plain[top, seed].max_logit / qk[top, seed].max_logit)
              for rate, seed in qk if rate == top and (rate, seed) in plain]
    if len(paired) >= 2:
        n, (mean, se) = len(paired), common.mean_se(paired)
        heads.append(common.bound(
            f"rate sweep at the highest rate ({top:g}), paired by seed ({n} seeds): log10 of the plain over the "
            "QK-norm run's largest logit, mean − t SE", mean - common.t_multiplier(n - 1) * se, 0.0,
            "Wortsman et al. 2023: QK-layernorm keeps the attention logits small at high rates",
            f"the mean's lower 3-SE limit ≥ 0 (mean {mean:.3g} ± {se:.2g}, t with {n - 1} df)", lower=True))
        diffs = [plain[k].valid_loss - qk[k].valid_loss for k in qk if k in plain and k[0] in failed_rates]
        heads.append(common.shown(
            f"rate sweep, paired by seed ({n} seeds) at the rates where plain runs fail ({_rates(failed_rates)}): "
            "valid loss of the plain run minus the QK-norm run's (nats), over those rates and seeds",
            *common.mean_se(diffs), "no number at this scale",
            "Wortsman et al. 2023: QK-layernorm lowers the high-rate loss"))
    return heads


def _pm(mean_se):
    return f"{mean_se[0]:.4g} ± {mean_se[1]:.2g}"


def _tables(m, config):
    grid, runs, rates = m
    rows = []
    for lam in config.scales:
        row = {"λ": lam}
        for qk in (False, True):
            tag = "QK-norm" if qk else "plain"
            row[f"entropy, {tag}"] = _pm(common.mean_se(grid[lam, qk]["entropy"]))
            row[f"max |logit|, {tag}"] = _pm(common.mean_se(grid[lam, qk]["max_logit"]))
            row[f"median gain, {tag}"] = _pm(common.mean_se(grid[lam, qk]["gain"]))
        row["min margin over the bound"] = float(grid[lam, False]["margin"].min())
        row["smallest span Δ"] = float(grid[lam, False]["span"].min())
        row["bound / entropy (median row)"] = _pm(common.mean_se(grid[lam, False]["tightness"]))
        rows.append(row)
    out = [(f"logit-scale sweep, d = {config.width}, n = {config.keys} ({config.draws} draws, ± SE)", rows)]
    if runs:
        out.append(("palindrome run: attention per layer and epoch (validation batch)", runs))
    if rates:
        out.append((f"rate sweep: attention after {config.sweep_epochs} epochs per peak rate, seed and arm "
                    "(validation batch; logit_limit: the QK-norm layer's ceiling)", rates))
    return out


def _charts(m, config, figures):
    grid, runs, rates = m
    lam = np.array(config.scales)
    fig, axes = common.figure(3, width=4.6)
    for i, qk in enumerate((False, True)):
        tag = "QK-norm" if qk else "no norm"
        for ax, key in zip(axes, ("entropy", "max_logit", "gain")):
            stats = [common.mean_se(grid[s, qk][key]) for s in config.scales]
            ax.errorbar(lam, [v for v, _ in stats], yerr=[3 * e for _, e in stats], fmt="o-",
                        color=f"C{i}", capsize=2, ms=4, label=f"{tag} (±3 SE)")
    axes[0].axhline(math.log(config.keys), color="k", ls=":", lw=1, label="ln n (uniform)")
    axes[1].axhline(math.sqrt(config.width), color="C1", ls="--", lw=1, label="QK-norm ceiling sqrt(d)")
    common.label(axes[0], "mean attention entropy", "logit scale λ", "entropy (nats)", logx=True)
    common.label(axes[1], "largest |logit|", "logit scale λ", "|logit| (unitless)", logx=True, logy=True)
    common.label(axes[2], "median logit-gradient gain |Jg|/|g|", "logit scale λ", "gain (unitless)",
                 logx=True, logy=True)
    common.save(fig, NAME, "sweep.png",
                "As the weights' scale grows the plain head's entropy collapses towards 0, its largest "
                "logit grows linearly and the gradient its rows pass back falls; with QK-norm all three "
                "stay where they are at every scale (the largest logit below sqrt(d)).", figures)
    if runs:
        fig, (b1, b2) = common.figure(2, width=5.4)
        for i, layer in enumerate(dict.fromkeys(r["layer"] for r in runs)):
            rs = [r for r in runs if r["layer"] == layer]
            b1.plot([r["epoch"] for r in rs], [r["entropy"] for r in rs], "o-", color=f"C{i}", label=layer)
            b1.axhline(rs[0]["uniform"], color=f"C{i}", ls=":", lw=1)
            b2.plot([r["epoch"] for r in rs], [r["max_logit"] for r in rs], "o-", color=f"C{i}", label=layer)
        b1.set_ylim(0, 1.1 * max(r["uniform"] for r in runs))   # from 0: a drop is read at its size
        common.label(b1, "palindrome run: mean attention entropy (dotted: uniform)", "epoch",
                     "entropy (nats)", legend="lower left")
        common.label(b2, "palindrome run: largest |logit|", "epoch", "|logit| (unitless)", logy=True)
        common.save(fig, NAME, "training.png",
                    "Attention entropy and largest logit of the three attention layers on a fixed "
                    "validation batch, after each epoch of the article's palindrome run (epoch 0: the "
                    "initialisation).", figures)
    if rates:
        _rate_chart(rates, config, figures)


ARM_STYLE = {"plain": ("o", "-"), "QK-norm": ("s", "--")}   # marker, line


def _rate_chart(rates, config, figures):
    """Entropy against the largest logit per layer and arm (seed config.seed, labels: the rate);
    valid loss against the rate per arm (every seed, the line through their median)."""
    fig, (c1, c2) = common.figure(2, width=5.4)
    arms = list(dict.fromkeys(r["arm"] for r in rates))
    for i, layer in enumerate(dict.fromkeys(r["layer"] for r in rates)):
        for arm in arms:
            rs = [r for r in rates if r["layer"] == layer and r["arm"] == arm and r["seed"] == config.seed]
            marker, line = ARM_STYLE[arm]
            c1.plot([r["max_logit"] for r in rs], [r["entropy"] for r in rs], marker=marker, ls=line,
                    color=f"C{i}", ms=4, label=f"{layer}, {arm}")
            for r in rs:
                c1.annotate(f"{r['rate']:g}", (r["max_logit"], r["entropy"]), fontsize=6,
                            textcoords="offset points", xytext=(3, 3))
    c1.set_ylim(bottom=0)
    common.label(c1, f"entropy against the largest logit (seed {config.seed}; labels: peak rate)",
                 "largest |logit| (unitless)", "mean entropy (nats)", logx=True, legend="upper right")
    for j, arm in enumerate(arms):
        runs = {(r["rate"], r["seed"]): r["valid_loss"] for r in rates if r["arm"] == arm}
        xs = sorted({rate for rate, _ in runs})
        marker, line = ARM_STYLE[arm]
        c2.plot([rate for rate, _ in runs], list(runs.values()), marker, color=f"C{j + 3}", alpha=0.5, ms=4)
        c2.plot(xs, [np.median([v for (r, _), v in runs.items() if r == x]) for x in xs], marker=marker,
                ls=line, color=f"C{j + 3}", label=f"{arm}: valid loss after {config.sweep_epochs} epochs")
    c2.axhline(FAILED_LOSS, color="k", ls=":", lw=1, label=f"{FAILED_LOSS:g} nat: not learnt")
    common.label(c2, "palindrome run against the peak rate", "peak learning rate", "valid loss (nats)",
                 logx=True, logy=True, legend="upper left")
    common.save(fig, NAME, "rates.png",
                f"The palindrome run for {config.sweep_epochs} epochs at each peak rate, plain (circles, solid) "
                "and with QK-norm (squares, dashed), the same seeds, data and initial weights. Left: each "
                "attention layer's mean entropy against its largest logit on the validation batch; right: the "
                "valid loss (dots: seeds; line: their median).", figures)


def _rows(m, config):
    grid, runs, rates = m
    rows = [{"part": "sweep", "scale": lam, "qk_norm": qk, "draw": i,
             **{k: float(v[i]) for k, v in q.items() if len(v)}}
            for (lam, qk), q in grid.items() for i in range(config.draws)]
    return rows + [{"part": "training", **r} for r in runs] + [{"part": "rate sweep", **r} for r in rates]


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, _headlines, _charts, _rows, tables=_tables)
