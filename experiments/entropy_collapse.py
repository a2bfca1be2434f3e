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
At the lab's scale: the palindrome run for a few epochs at each of several peak rates; after the
last epoch each attention layer's mean entropy and largest logit on the validation batch, and the
losses.  Tested as an inequality: the runs that fail (valid loss above 1 nat) have a smaller
lowest-layer entropy than every run that learns; the logit growth is shown.  Not tested: the
QK-layernorm remedy (the lab's model has no QK-norm; the random-weight sweep above has one, but
there the norm removes lambda by construction) and divergence to infinity (the failed runs stall
near the loss of guessing, they do not blow up).

Training.  The article's palindrome run (float32, seed 0) is trained again and after every epoch
the attention rows of a fixed validation batch are read from the model's caches: mean entropy
per attention layer against the uniform value (ln of the keys a row sees), the largest logit, and
the bound's margin for the unmasked layers (encoder self-attention, cross-attention).
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

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

    def __post_init__(self):
        common.validate(self, ints={"width": 2, "keys": 2, "draws": 2, "seed": 0})
        common.check_int("train_epochs", self.train_epochs, 0)
        common.check_int("sweep_epochs", self.sweep_epochs, 1)
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

def attention_layers(params, embedding, src, tgt):
    """{layer: (probabilities (H, B, T, S), logits, (bound margin, largest bound / entropy) or
    None)} of one forward pass."""
    _, cache = model.model_forward(src, tgt, params, embedding=embedding)
    out = {}
    layers = {"encoder self": cache.encoder.blocks[0].attn.layer,
              "decoder self (causal)": cache.decoder.blocks[0].self_attn.layer,
              "cross": cache.decoder.blocks[0].cross.layer}
    prefixes = {"encoder self": "enc0.attn", "decoder self (causal)": "dec0.self", "cross": "dec0.cross"}
    for name, c in layers.items():
        P = c.q.shape[-1]
        logits = c.q @ np.swapaxes(c.k, -1, -2) / math.sqrt(P)                    # (H, B, T, S)
        margin = None
        if "causal" not in name:
            W = params[prefixes[name] + ".WQ"], params[prefixes[name] + ".WK"]     # (H, P, P) each
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


def rate_sweep(config):
    """Wortsman et al. 2023's sweep at the lab's scale: the palindrome run (no QK-norm: the lab's
    model has none) at each peak rate for sweep_epochs; after the last epoch, per attention layer,
    the mean entropy and the largest |logit| of the validation batch, with the losses.  One row
    per (rate, layer)."""
    rows = []
    for rate in common.progress(config.sweep_rates, desc=f"{NAME} rates"):
        tcfg = train.Config(epochs=config.sweep_epochs, dtype=config.train_dtype, seed=config.seed,
                            start_rate=rate)
        src, tgt = validation_batch(tcfg)
        fit = train.fit(tcfg, common.results_dir(NAME) / "checkpoint-sweep.npz")
        last = fit.history[-1]
        for name, (a, logits, _) in attention_layers(fit.params, fit.embedding, src, tgt).items():
            rows.append({"rate": rate, "layer": name, "entropy": float(row_entropy(a).mean()),
                         "max_logit": float(np.abs(np.where(a > 0, logits, 0)).max()),
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


def _rate_headlines(rates, config):
    """Wortsman et al. 2023 at the lab's scale: the smallest attention entropy of the runs that
    fail against that of the runs that learn (an inequality), and the logit growth (shown)."""
    by_rate = {}
    for r in rates:
        by_rate.setdefault(r["rate"], []).append(r)
    low = {rate: min(r["entropy"] for r in rs) for rate, rs in by_rate.items()}      # per run
    failed = [rate for rate, rs in by_rate.items() if rs[0]["valid_loss"] > FAILED_LOSS]
    learnt = [rate for rate in by_rate if rate not in failed]
    heads = []
    if failed and learnt:
        heads.append(common.bound(f"rate sweep ({config.sweep_epochs} epochs): smallest layer entropy of the "
                                  f"runs that fail (valid loss > {FAILED_LOSS:g} nat: rates "
                                  f"{', '.join(f'{r:g}' for r in failed)}) below that of every run that learns",
                                  max(low[r] for r in failed), min(low[r] for r in learnt),
                                  "Zhai et al. 2023, Wortsman et al. 2023: low attention entropy goes with "
                                  "unstable training", "largest failed-run entropy ≤ smallest learnt-run entropy"))
    article = train.Config().start_rate          # the article's peak rate, when the sweep has it
    top, ref = max(by_rate), article if article in by_rate else min(by_rate)
    biggest = {rate: max(r["max_logit"] for r in rs) for rate, rs in by_rate.items()}
    heads.append(common.shown(f"rate sweep: largest attention logit at rate {top:g} over that at rate {ref:g}",
                              biggest[top] / biggest[ref], float("nan"), "Wortsman et al. 2023: attention "
                              "logits grow with the learning rate (no number at this scale)",
                              f"valid loss {by_rate[top][0]['valid_loss']:.3g} against "
                              f"{by_rate[ref][0]['valid_loss']:.3g}; QK-layernorm not tested (the lab's "
                              "model has none)"))
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
        out.append((f"rate sweep: attention after {config.sweep_epochs} epochs per peak rate (validation "
                    "batch, one run each)", rates))
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
        fig, (c1, c2) = common.figure(2, width=5.4)
        layers = list(dict.fromkeys(r["layer"] for r in rates))
        for i, layer in enumerate(layers):
            rs = [r for r in rates if r["layer"] == layer]
            c1.plot([r["max_logit"] for r in rs], [r["entropy"] for r in rs], "o-", color=f"C{i}", label=layer)
            for r in rs:
                c1.annotate(f"{r['rate']:g}", (r["max_logit"], r["entropy"]), fontsize=6,
                            textcoords="offset points", xytext=(3, 3))
        c1.set_ylim(bottom=0)
        common.label(c1, "entropy against the largest logit (labels: peak rate)", "largest |logit| (unitless)",
                     "mean entropy (nats)", logx=True, legend="lower left")
        losses = {r["rate"]: r["valid_loss"] for r in rates}
        c2.plot(list(losses), list(losses.values()), "ko-", label=f"valid loss after {config.sweep_epochs} epochs")
        c2.axhline(FAILED_LOSS, color="C3", ls=":", lw=1, label=f"{FAILED_LOSS:g} nat: not learnt")
        common.label(c2, "palindrome run against the peak rate", "peak learning rate", "valid loss (nats)",
                     logx=True, logy=True, legend="upper left")
        common.save(fig, NAME, "rates.png",
                    f"The palindrome run (no QK-norm) for {config.sweep_epochs} epochs at each peak rate. Left: "
                    "each attention layer's mean entropy against its largest logit on the validation batch; "
                    "right: the valid loss. Past a rate the logits grow by orders of magnitude, the entropy "
                    "collapses and the run stops learning, as Wortsman et al. observe in large models.",
                    figures)


def _rows(m, config):
    grid, runs, rates = m
    rows = [{"part": "sweep", "scale": lam, "qk_norm": qk, "draw": i,
             **{k: float(v[i]) for k, v in q.items() if len(v)}}
            for (lam, qk), q in grid.items() for i in range(config.draws)]
    return rows + [{"part": "training", **r} for r in runs] + [{"part": "rate sweep", **r} for r in rates]


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, _headlines, _charts, _rows, tables=_tables)
