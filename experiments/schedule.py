"""The article's training protocol reproduced over seeds, and the intended schedule beside it.

Both schedules run the article's settings (palindromes, 10 epochs of 64 steps, rate 1e-2 to
1e-5, warm-up 128); the article's schedule for several seeds, the intended one for the first of
them (fewer: its difference is ten-fold); for a seed the data, shuffles and initial parameters are
shared by the two schedules, so their difference is paired.  The runs compute in float32 to keep
`all` short (the article's code computes in float64; at seed 0 the two types end at valid loss
0.01004 and 0.01005 under the article's schedule, a difference far below the seed-to-seed spread).

* article: the step counter restarts every epoch, so with 64-step epochs the warm-up to step 128
  never finishes (the rate climbs to about 5e-3 and drops to 0 at every epoch's start), and Adam's
  bias correction restarts each epoch while its moments carry over.  This is the protocol of the
  article's own code, whose valid loss after the 10 epochs was 0.0165 (docs/article.md), one run.
* intended: a global step; warm-up to 1e-2 by step 128, then linear decay to 1e-5 at step 640.

The article's numbers are compared by protocol only.  Under the article's schedule, over the
seeds: its epoch-1 and epoch-2 train and valid losses (printed by the article) and its valid loss
after 10 epochs (the article's code run once), each on the logarithm (the loss spreads over seeds
multiplicatively).  The article reports single runs, so each of its numbers carries the spread of
one run, the lab's seed-to-seed standard deviation; the rule is Student's t with seeds - 1 degrees
of freedom.  The intended schedule is another protocol: its losses are shown beside the article's,
never judged against them.  Writes data.csv (per step: schedule, seed, step, rate, loss),
epochs.csv and loss_and_rate.png.
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from experiments import common, tasks, train
from kernels.optim import article_rate

NAME = "schedule"
ARTICLE_VALID = 0.0165  # the article's own code after 10 epochs (docs/article.md)
# (epoch, column) -> the article's printed loss (docs/article.md), and the 10-epoch run of its code
ARTICLE = {(1, "train_loss"): 2.267, (1, "valid_loss"): 2.123, (2, "train_loss"): 1.672,
           (2, "valid_loss"): 0.302, (10, "valid_loss"): ARTICLE_VALID}
ARTICLE_SOURCE = {1: "the article's printed epoch-1 loss (one run)",
                  2: "the article's printed epoch-2 loss (one run)",
                  10: "the article's code run once: 0.0165 after 10 epochs"}


PROTOCOL = ("task", "epochs", "steps", "start_rate", "finish_rate", "warmup")  # the article's run


def is_articles(config) -> bool:
    """Whether config runs the article's protocol (its task, epochs, steps and rates): only then
    are its numbers compared."""
    return all(getattr(config, f) == getattr(Config, f) for f in PROTOCOL)


def by_protocol(fits, schedule, seeds, epochs):
    """{(epoch, column): the losses of that schedule's seeds at that epoch} for the article's
    compared numbers (ARTICLE) within `epochs`: (seeds,) arrays."""
    out = {}
    for (epoch, column) in ARTICLE:
        if epoch <= epochs:
            out[epoch, column] = np.array([fits[schedule, s].history[epoch - 1][column]
                                           for s in seeds if (schedule, s) in fits])
    return out


def _protocol_headlines(config, fits, seeds):
    """The article's schedule against the article's numbers (t, seeds - 1 df, the article's
    uncertainty one run's spread); the intended schedule shown beside them, not judged."""
    heads = []
    article = by_protocol(fits, "article", seeds, config.epochs) if is_articles(config) else {}
    for (epoch, column), values in article.items():
        logs = np.log(values)
        mean, se = common.mean_se(logs)
        what = column.split("_")[0]
        heads.append(common.test(
            f"log {what} loss at epoch {epoch}, article's schedule ({len(values)} seeds)", mean, se,
            math.log(ARTICLE[epoch, column]), f"{ARTICLE_SOURCE[epoch]}: {ARTICLE[epoch, column]}; "
            f"the lab's seeds {', '.join(f'{v:.4g}' for v in values)}",
            predicted_se=float(logs.std(ddof=1)), df=len(values) - 1))
    for (epoch, column), values in by_protocol(fits, "intended", seeds, config.epochs).items():
        what = column.split("_")[0]
        mean, se = common.mean_se(np.log(values)) if len(values) > 1 else (float(np.log(values[0])), float("nan"))
        heads.append(common.shown(
            f"log {what} loss at epoch {epoch}, intended schedule ({len(values)} seed"
            f"{'s' if len(values) > 1 else ''})", mean, se,
            f"the article's {ARTICLE[epoch, column]} is another protocol's: not compared",
            "the lab's intended schedule (global step)"))
    return heads


@dataclasses.dataclass(frozen=True)
class Config:
    CHOICES: ClassVar[dict] = {"task": lambda: sorted(tasks.TASKS), "dtype": ("float32", "float64")}
    task: str = "palindrome"     # the synthetic task
    epochs: int = 10             # training epochs
    steps: int = 64              # training steps per epoch
    start_rate: float = 1e-2     # peak learning rate
    finish_rate: float = 1e-5    # learning rate at the last step
    warmup: int = 128            # warm-up steps
    dtype: str = "float32"       # floating-point type (float32: the loss differs from float64 by 0.1 %)
    seeds: int = 5               # seeds of the article's schedule (seed, seed + 1, ...)
    intended_seeds: int = 1      # seeds of the intended schedule (the first ones of the same list)
    seed: int = 0                # the first seed

    def __post_init__(self):
        common.check_int("seeds", self.seeds, 2)
        common.check_int("intended_seeds", self.intended_seeds, 1, self.seeds)
        self.train_config("intended", self.seed)  # validates every field with train.Config's checks

    def train_config(self, schedule, seed):
        return train.Config(task=self.task, epochs=self.epochs, steps=self.steps,
                            start_rate=self.start_rate, finish_rate=self.finish_rate,
                            warmup=self.warmup, dtype=self.dtype, seed=seed, schedule=schedule)


def run(config: Config) -> common.Result:
    out = common.results_dir(NAME)
    seeds = range(config.seed, config.seed + config.seeds)
    fits = {(s, seed): train.fit(config.train_config(s, seed), out / f"checkpoint-{s}.npz")
            for seed in common.progress(seeds, desc=NAME) for s in ("intended", "article")
            if s == "article" or seed < config.seed + config.intended_seeds}
    common.write_csv(out / "data.csv", [{"schedule": s, "seed": seed, **row}
                                        for (s, seed), f in fits.items() for row in f.steps])
    common.write_csv(out / "epochs.csv", [{"schedule": s, "seed": seed, **row}
                                          for (s, seed), f in fits.items() for row in f.history])
    figures = []
    plot(config, {s: fits[s, config.seed] for s in ("intended", "article")}, out / "loss_and_rate.png",
         others=[fits["article", seed] for seed in seeds if seed != config.seed])
    figures.append((out / "loss_and_rate.png",
                    f"Seed {config.seed}: loss per step (faint) and valid loss per epoch under both "
                    "schedules, the article's schedule's other seeds as thin lines, and the article's "
                    "printed losses (left); the rate each schedule applied (right), with the article's "
                    "formula as it would run with a global step (dashed), which turns negative."))
    final = {s: np.array([fits[s, seed].history[-1]["valid_loss"] for seed in seeds if (s, seed) in fits])
             for s in ("intended", "article")}
    log_article = np.log(final["article"])
    mean, _ = common.mean_se(log_article)
    headlines = _protocol_headlines(config, fits, seeds)
    diff = np.log(final["intended"]) - log_article[:len(final["intended"])]
    headlines.append(common.shown("log valid loss, intended − article's schedule (paired by seed)",
                                  float(diff.mean()), float(common.mean_se(diff)[1]) if len(diff) > 1
                                  else float("nan"), "no published number", "the lab's schedule "
                                  "against the article's, same data and init"))
    table = [{"schedule": s, "seed": seed, **{f"epoch {e} {c.split('_')[0]}": fits[s, seed].history[e - 1][c]
                                               for (e, c) in ARTICLE if e <= config.epochs},
              "final valid": fits[s, seed].history[-1]["valid_loss"]}
             for s in ("article", "intended") for seed in seeds if (s, seed) in fits]
    table.append({"schedule": "the article (one run)", "seed": "",
                  **{f"epoch {e} {c.split('_')[0]}": v for (e, c), v in ARTICLE.items() if e <= config.epochs},
                  "final valid": ARTICLE_VALID if config.epochs == 10 else ""})
    seconds = sum(f.seconds for f in fits.values())
    common.write_meta(out / "meta.json", config, seconds,
                      final_valid_loss={s: v.tolist() for s, v in final.items()},
                      headlines=[dataclasses.asdict(h) for h in headlines])
    summary = (f"final valid loss over seeds {list(seeds)}: article's schedule "
               + ", ".join(f"{v:.4f}" for v in final["article"]) + "; intended "
               + ", ".join(f"{v:.4f}" for v in final["intended"])
               + f"\narticle's protocol: geometric mean {math.exp(mean):.4f} (the article: {ARTICLE_VALID})")
    return common.Result(summary, headlines, figures=figures, rows=table,
                         tables=[("losses per schedule and seed at the article's epochs", table)],
                         extra={"fits": fits})


def plot(config, fits, path, others=()):
    plt = common.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, fit in enumerate(others):     # the seed spread of the article's schedule
        left.plot([h["epoch"] * config.steps for h in fit.history], [h["valid_loss"] for h in fit.history],
                  "-", color="C3", lw=0.7, alpha=0.5, label="article: other seeds, valid" if i == 0 else None)
    for (name, fit), color in zip(fits.items(), ("C0", "C3")):
        steps = [s["step"] + 1 for s in fit.steps]
        left.plot(steps, [s["loss"] for s in fit.steps], color=color, lw=0.5, alpha=0.45)
        left.plot([h["epoch"] * config.steps for h in fit.history],
                  [h["valid_loss"] for h in fit.history], "o-", color=color,
                  label=f"{name}: valid per epoch (train per step, faint)")
        right.plot(steps, [s["rate"] for s in fit.steps], color=color, label=f"{name} (as run)")
    total = config.epochs * config.steps
    right.plot(range(1, total + 1), [article_rate(s, total, config.start_rate, config.finish_rate,
                                                 config.warmup) for s in range(total)],
               "--", color="C3", alpha=0.6, label="article's formula with a global step")
    right.axhline(0, color="k", lw=0.6)
    left.axhline(ARTICLE_VALID, color="k", ls=":", lw=1, label="the article's final valid loss")
    for column, marker in (("valid_loss", "D"), ("train_loss", "s")):
        points = [(e * config.steps, v) for (e, c), v in ARTICLE.items() if c == column and e <= config.epochs]
        left.plot(*zip(*points), marker, color="k", mfc="none", ms=8,
                  label=f"the article: {column.split('_')[0]} loss per epoch (its schedule)")
    left.set(yscale="log", xlabel="training step", ylabel="cross-entropy (nats per token)",
             title="loss: intended vs article's schedule")
    right.set(xlabel="training step", ylabel="learning rate (per step)",
              title="learning rate per step")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    common.save_figure(fig, path)
