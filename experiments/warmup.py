"""warmup: Xiong et al. 2020's warm-up dependence of Post-LN training, in the lab's model.

Xiong et al. ("On Layer Normalization in the Transformer Architecture", 2020) report that the
Post-LN Transformer (every residual stage norm(x + layer(x))) needs a learning-rate warm-up: at
rates where Pre-LN (x + layer(norm(x))) and a warmed-up Post-LN train, Post-LN without warm-up
trains worse or diverges, while Pre-LN trains without warm-up.  Their explanation (Theorem 1,
Fig. 3): at initialisation Post-LN's gradients are large near the output and grow with the layer
index, Pre-LN's stay about the same across layers.

Protocol.  The lab's training run (experiments/train.py: Adam, the intended schedule, the
article's init std 0.1, float32), shortened to fit ``all``: palindromes of 8 tokens (4 digits
written twice), batches of 64, 4 epochs of 32 steps (24 batches drawn, 16 train / 8 valid).
Arms: norm position {pre, post} x warm-up {on: linear over the first 32 steps, off: the peak rate
from the first step} x peak rate {1e-2 (the article's), 2e-2}, each followed by the linear decay
to 1e-5, for 4 seeds; a seed fixes the data, the split, the shuffles and the initial parameters,
shared by all arms, so differences between arms are paired by seed.  A run that meets a
non-finite loss counts as diverged, its valid loss as ln V (no better than a uniform guess).

Tests, per rate, on the log of the final valid loss (the loss spreads over seeds multiplicatively):
Δ_post = log L(post, no warm-up) - log L(post, warm-up) and Δ_pre the same for Pre-LN, paired by
seed.  Xiong's claim predicts Δ_post > 0 (warm-up helps Post-LN) and Δ_post - Δ_pre > 0 (Post-LN
depends on warm-up more than Pre-LN); each is an inequality (Consistent kind) passed when the
paired mean exceeds the lab's 3 SE rule with Student's t for seeds - 1 degrees of freedom.
Whether an arm trained at all (final valid loss below 0.5 nats, the plateau of an untrained model
sits near 2) is shown in the table: the claim's condition "at rates where Pre-LN and warmed-up
Post-LN train" is read there.

Gradients at initialisation (Xiong et al.'s Fig. 3 in the real model).  The article's
initialisation, one batch of the task, the loss's gradient: the norm of each decoder block's
feed-forward W2 in a model of ``init_blocks`` blocks per side, Post-LN and Pre-LN on the same
parameters and batch.  Per seed the slope of log |grad W2| against the block index: Fig. 3 predicts
Post-LN's slope above 0 and above Pre-LN's (paired); Theorem 1 predicts the last block's gradient
larger in Post-LN than in Pre-LN (log ratio above 0, paired); each an inequality (Consistent).
The last block's ratio at the article's one block per side is shown: Theorem 1's ordering is a
depth effect (Pre-LN's gradient shrinks as its final norm divides by a stream that grows with
depth), and at one block with std 0.1 weights Pre-LN's final norm divides by an RMS below 1.

Scale.  One block per side, D = 32, 128 steps: far from Xiong's 6-layer, 512-wide models trained
for tens of thousands of steps; the rates at which each arm fails are the lab's, not theirs.  Four
seeds keep ``all`` short; whether an arm stalls varies from seed to seed, so a verdict at 4 seeds
is weak either way (``--rates 0.02 --seeds 12`` took 123 s on the shared, loaded 2-core
machine; docs/studies.md reports it).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import ClassVar, NamedTuple

import numpy as np

from experiments import common, tasks, train
from kernels import model

NAME = "warmup"
POSITIONS = ("pre", "post")
WARMUP = (True, False)
TRAINED = 0.5  # nats per token: a final valid loss below this is a run that learned the task


@dataclasses.dataclass(frozen=True)
class Config:
    CHOICES: ClassVar[dict] = {"task": lambda: sorted(tasks.TASKS), "dtype": ("float32", "float64")}
    task: str = "palindrome"     # the synthetic task
    max_tokens: int = 8          # T, tokens per sequence (8: the run learns within 128 steps)
    batch: int = 64              # sequences per batch (the article's)
    batches: int = 24            # batches drawn, one third valid (16 train, each seen twice an epoch)
    epochs: int = 4              # training epochs
    steps: int = 32              # training steps per epoch
    rates: tuple[float, ...] = (1e-2, 2e-2)  # peak rates: the article's and a higher one
    warmup: int = 32             # warm-up steps of the warmed-up arms
    finish_rate: float = 1e-5    # learning rate at the last step
    dtype: str = "float32"       # floating-point type of the runs
    seeds: int = 4               # seeds per arm (seed, seed + 1, ...), shared by every arm
    init_blocks: int = 6         # blocks per side of the model whose initial gradients are taken
    init_seeds: int = 8          # seeds of the gradients at initialisation
    seed: int = 0                # the first seed

    def __post_init__(self):
        common.validate(self, ints={"seeds": 2, "init_blocks": 2, "init_seeds": 2, "seed": 0})
        if not self.rates or any(not (r > 0) for r in self.rates):
            raise ValueError(f"rates: expected positive peak rates, got {self.rates}")
        if not 0 < self.warmup < self.epochs * self.steps:
            raise ValueError(f"warmup: expected 1 ... {self.epochs * self.steps - 1} steps (the run's "
                             f"length), got {self.warmup}")
        self.train_config("post", True, self.rates[0], self.seed)  # train.Config's own checks

    def train_config(self, position, warm, rate, seed) -> train.Config:
        return train.Config(task=self.task, max_tokens=self.max_tokens, batch=self.batch,
                            batches=self.batches, epochs=self.epochs, steps=self.steps,
                            start_rate=rate, finish_rate=self.finish_rate,
                            warmup=self.warmup if warm else 0, dtype=self.dtype, seed=seed,
                            norm_position=position)


def arm_name(position, warm):
    return f"{'Pre' if position == 'pre' else 'Post'}-LN, {'warm-up' if warm else 'no warm-up'}"


def train_arm(config, position, warm, rate, seed, ckpt):
    """Valid loss per epoch of one run (diverged epochs and those after: ln V)."""
    cfg = config.train_config(position, warm, rate, seed)
    try:
        history = train.fit(cfg, ckpt).history
    except train.NonFiniteError as exc:
        history = exc.partial.history
    chance = math.log(cfg.model_config().V)
    losses = [h["valid_loss"] if math.isfinite(h["valid_loss"]) else chance for h in history]
    return losses + [chance] * (config.epochs - len(losses))


class AtInit(NamedTuple):
    w2: np.ndarray     # (blocks,) |grad W2| of each decoder block's feed-forward layer
    rms: float         # RMS of the decoder stream entering the head (post-norm: 1 by its norm)


def init_gradients(config, blocks, seed, position) -> AtInit:
    """|grad W2| of every decoder block's feed-forward layer at the article's initialisation,
    on one batch of the task, and the RMS of the stream the head reads."""
    cfg = config.train_config(position, True, config.rates[0], seed)
    mcfg = dataclasses.replace(cfg.model_config(), blocks=blocks)
    dtype = np.dtype(config.dtype)
    params = model.init_params(mcfg, seed=seed, dtype=dtype, std=cfg.init_std)
    data = tasks.make_dataset(config.task, batches=1, batch=config.batch, T=config.max_tokens,
                              seed=seed)                                            # (1, 2, B, T)
    _, cache = model.model_forward(data[0, 0], data[0, 1], params,
                                   embedding=model.embedding_table(mcfg, dtype),
                                   norm_position=position)
    _, grads = model.model_backward(dtype.type(1), cache)
    head = cache.decoder.head.norm                  # RmsNormCache pre-norm, None post-norm
    rms = 1.0 if head is None else float(np.mean(1 / head.inv_rms))
    return AtInit(np.array([float(np.linalg.norm(grads[f"dec{i}.ff.W2"])) for i in range(blocks)]),
                  rms)


def measure(config):
    out = common.results_dir(NAME)
    ckpt = out / "checkpoint.npz"  # each run's own, overwritten by the next
    seeds = range(config.seed, config.seed + config.seeds)
    arms = list(itertools.product(config.rates, POSITIONS, WARMUP, seeds))
    runs = {arm: train_arm(config, arm[1], arm[2], arm[0], arm[3], ckpt)
            for arm in common.progress(arms, desc=NAME)}
    ckpt.unlink(missing_ok=True)
    init_seeds = range(config.seed, config.seed + config.init_seeds)
    grads = {(blocks, p, s): init_gradients(config, blocks, s, p)
             for blocks in (1, config.init_blocks) for p in POSITIONS for s in init_seeds}
    return {"runs": runs, "grads": grads}


def final_logs(m, config, rate, position, warm):
    """log final valid loss per seed: (seeds,)."""
    return np.log([m["runs"][rate, position, warm, s][-1]
                   for s in range(config.seed, config.seed + config.seeds)])


def deltas(m, config, rate):
    """(Δ_post, Δ_pre) per seed: log L(no warm-up) - log L(warm-up), each (seeds,)."""
    return tuple(final_logs(m, config, rate, p, False) - final_logs(m, config, rate, p, True)
                 for p in ("post", "pre"))


def slopes(m, config, position):
    """Per init seed, the least-squares slope of log |grad W2| against the decoder block index."""
    idx = np.arange(config.init_blocks, dtype=float)
    return np.array([np.polyfit(idx, np.log(m["grads"][config.init_blocks, position, s].w2), 1)[0]
                     for s in range(config.seed, config.seed + config.init_seeds)])


def last_ratio(m, config, blocks):
    """Per init seed, log |grad W2| of the last decoder block, Post-LN minus Pre-LN."""
    return np.log([m["grads"][blocks, "post", s].w2[-1] / m["grads"][blocks, "pre", s].w2[-1]
                   for s in range(config.seed, config.seed + config.init_seeds)])


def positive(quantity, values, source, df):
    """mean(values) > m SE, m the lab's 3 SE rule as Student's t with df degrees of freedom: a
    one-sided inequality, the Consistent kind."""
    mean, se = common.mean_se(values)
    m = common.t_multiplier(df)
    return common.bound(quantity, float(mean), float(m * se), source,
                        f"paired mean > {m:.2f} SE (t, {df} df; SE {se:.2g})", se=float(se),
                        lower=True)


def _headlines(m, config):
    heads, df = [], config.seeds - 1
    source = "Xiong et al. 2020: Post-LN needs a warm-up, Pre-LN trains without one"
    for rate in config.rates:
        d_post, d_pre = deltas(m, config, rate)
        heads.append(positive(f"Post-LN at rate {rate:g}: log valid loss, no warm-up − warm-up "
                              f"({config.seeds} seeds, paired)", d_post, source, df))
        heads.append(positive(f"at rate {rate:g}: Post-LN's warm-up effect − Pre-LN's "
                              f"(Δ_post − Δ_pre of log valid loss, paired)", d_post - d_pre,
                              source, df))
    post, pre = slopes(m, config, "post"), slopes(m, config, "pre")
    fig3 = "Xiong et al. 2020, Fig. 3: Post-LN's gradient grows with the layer index, Pre-LN's stays level"
    L, seeds = config.init_blocks, config.init_seeds
    heads.append(positive(f"at initialisation, {L} blocks per side: Post-LN's slope of log |grad "
                          f"ff.W2| over the decoder blocks ({seeds} seeds)", post, fig3, seeds - 1))
    heads.append(positive(f"at initialisation, {L} blocks per side: that slope, Post-LN − Pre-LN "
                          f"(paired)", post - pre, fig3, seeds - 1))
    heads.append(positive(f"at initialisation, {L} blocks per side: log |grad dec{L - 1}.ff.W2| "
                          f"(the last block), Post-LN − Pre-LN (paired)", last_ratio(m, config, L),
                          "Xiong et al. 2020, Theorem 1: Post-LN's gradient near the output is "
                          "larger than Pre-LN's, by a factor growing with depth", seeds - 1))
    mean, se = common.mean_se(last_ratio(m, config, 1))
    heads.append(common.shown("at initialisation, one block per side (the article's): log |grad "
                              "dec0.ff.W2|, Post-LN − Pre-LN (paired)", float(mean), float(se),
                              "Theorem 1's ordering is a depth effect: not judged at one block",
                              "Xiong et al. 2020, Theorem 1"))
    return heads


def _tables(m, config):
    seeds = range(config.seed, config.seed + config.seeds)
    rows = []
    for rate, position, warm in itertools.product(config.rates, POSITIONS, WARMUP):
        final = np.array([m["runs"][rate, position, warm, s][-1] for s in seeds])
        mean, se = common.mean_se(np.log(final))
        rows.append({"rate": rate, "arm": arm_name(position, warm),
                     "final valid loss (geometric mean)": f"{math.exp(mean):.4g}",
                     "log, ± SE": f"{mean:.3f} ± {se:.2g}",
                     f"seeds trained (< {TRAINED} nats)": f"{int((final < TRAINED).sum())}/{len(final)}",
                     "per seed": ", ".join(f"{v:.3g}" for v in final)})
    init = []
    for blocks, position in itertools.product((1, config.init_blocks), POSITIONS):
        at = [m["grads"][blocks, position, s] for s in range(config.seed, config.seed + config.init_seeds)]
        g = np.array([a.w2 for a in at])                                    # (seeds, blocks)
        rms = common.mean_se([a.rms for a in at])
        mean, se = common.mean_se(g)
        slope = (f"{common.mean_se(slopes(m, config, position))[0]:.3g} ± "
                 f"{common.mean_se(slopes(m, config, position))[1]:.2g}") if blocks > 1 else ""
        init.append({"blocks per side": blocks, "position": position,
                     **{f"dec{i}.ff.W2": f"{mean[i]:.3g} ± {se[i]:.2g}" if i < blocks else ""
                        for i in range(config.init_blocks)},
                     "slope of log |grad| per block": slope,
                     "RMS of the stream into the head": f"{rms[0]:.3g} ± {rms[1]:.2g}"
                     if position == "pre" else "1 (its last norm)"})
    pairs = []
    for rate in config.rates:
        d_post, d_pre = deltas(m, config, rate)
        for name, d in (("Δ_post", d_post), ("Δ_pre", d_pre), ("Δ_post − Δ_pre", d_post - d_pre)):
            mean, se = common.mean_se(d)
            pairs.append({"rate": rate, "paired difference": name, "mean ± SE": f"{mean:.3f} ± {se:.2g}",
                          "seeds above 0": f"{int((d > 0).sum())}/{len(d)}",
                          "per seed": ", ".join(f"{v:.3g}" for v in d)})
    return [("final valid loss per arm (over seeds)", rows),
            ("paired differences of log final valid loss, no warm-up − warm-up", pairs),
            ("|grad W2| of each decoder block's feed-forward at initialisation (± SE over seeds)",
             init)]


def _charts(m, config, figures):
    seeds = range(config.seed, config.seed + config.seeds)
    fig, axes = common.figure(len(config.rates) + 1, width=4.8)
    fig.subplots_adjust(wspace=0.35)
    epochs = np.arange(1, config.epochs + 1)
    for ax, rate in zip(axes, config.rates):
        for i, (position, warm) in enumerate(itertools.product(POSITIONS, WARMUP)):
            color, style = f"C{POSITIONS.index(position)}", "-" if warm else "--"
            for j, s in enumerate(seeds):
                ax.plot(epochs, m["runs"][rate, position, warm, s], style, color=color, lw=1,
                        alpha=0.7, marker="o" if warm else "x", ms=3,
                        label=arm_name(position, warm) if j == 0 else None)
        ax.axhline(TRAINED, color="0.5", lw=0.8, ls=":")
        ax.set_xticks(epochs)
        common.label(ax, f"peak rate {rate:g} (one line per seed)", "epoch",
                     "valid loss (nats per token)", logy=True, legend="lower left")
    ax = axes[-1]
    idx = np.arange(config.init_blocks)
    ratio = np.log([m["grads"][config.init_blocks, "post", s].w2 / m["grads"][config.init_blocks, "pre", s].w2
                    for s in range(config.seed, config.seed + config.init_seeds)])  # (seeds, blocks)
    mean, se = common.mean_se(ratio)
    ax.errorbar(idx, np.exp(mean), yerr=[np.exp(mean) - np.exp(mean - 3 * se),
                                         np.exp(mean + 3 * se) - np.exp(mean)],
                fmt="o-", capsize=3, color="C1", label="Post-LN / Pre-LN, paired (±3 SE)")
    ax.axhline(1, color="C0", lw=1, label="equal gradients")
    ax.set_xticks(idx)
    common.label(ax, f"at initialisation, {config.init_blocks} blocks per side",
                 "decoder block (output side right)", "|grad W2|, Post-LN / Pre-LN", logy=True,
                 legend="upper left")
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):  # a narrow log range
        axis(common.pyplot().FormatStrFormatter("%.2g"))
    common.save(fig, NAME, "warmup.png",
                f"Valid loss per epoch of the lab's training run ({config.max_tokens}-token "
                f"palindromes, {config.epochs} × {config.steps} steps) for Pre-LN (blue) and "
                "Post-LN (orange), with warm-up (solid) and without (dashed), one line per seed, "
                "at each peak rate; dotted: the 'trained' line. Right: the gradient norm of each "
                "decoder block's feed-forward W2 at initialisation, Post-LN over Pre-LN on the same "
                "parameters and batch (Xiong et al.'s Fig. 3 in the real model, the article's "
                "init): Post-LN's gradient grows towards the output relative to Pre-LN's.", figures)


def _rows(m, config):
    rows = [{"rate": rate, "position": p, "warmup": w, "seed": s, "epoch": e + 1, "valid_loss": v}
            for (rate, p, w, s), losses in m["runs"].items() for e, v in enumerate(losses)]
    return rows


def _summary(m, heads, config):
    lines = [h.sentence() for h in heads]
    for rate in config.rates:
        geo = {arm_name(p, w): math.exp(final_logs(m, config, rate, p, w).mean())
               for p, w in itertools.product(POSITIONS, WARMUP)}
        lines.append(f"rate {rate:g}: " + "; ".join(f"{k} {v:.3g}" for k, v in geo.items()))
    return "\n".join(lines)


def run(config: Config) -> common.Result:
    return common.conduct(NAME, config, measure, _headlines, _charts, _rows, summary=_summary,
                          tables=_tables)
