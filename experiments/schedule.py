"""The intended learning-rate schedule against the article's, trained side by side.

Both runs use the article's settings (palindromes, 10 epochs x 64 steps, 1e-2 -> 1e-5, warm-up
128) and the same seed, data, shuffles and initial parameters; only the schedule differs:

* intended: a global step; warm-up to 1e-2 by step 128, then linear decay to 1e-5 at step 640;
  Adam's bias correction by the global step;
* article: the step counter restarts every epoch, so with 64-step epochs the warm-up to step 128
  never finishes (the rate climbs to about 5e-3 and drops to 0 at every epoch's start), and
  Adam's bias correction restarts each epoch while its moments carry over.  Its decay formula,
  which would turn negative before the end, is never reached; the rate figure draws it as it
  would run with a global step.

Writes data.csv (per step: schedule, step, rate, loss), epochs.csv, loss_and_rate.png.
"""
from __future__ import annotations

import dataclasses

from experiments import common, train
from kernels.optim import article_rate

NAME = "schedule"
ORDER = 61
IN_ALL = False  # an exercise run of its own (python -m experiments schedule), not part of `all`: keeps `all` under 2 minutes


@dataclasses.dataclass(frozen=True)
class Config:
    task: str = "palindrome"
    epochs: int = 10
    steps: int = 64
    start_rate: float = 1e-2
    finish_rate: float = 1e-5
    warmup: int = 128
    dtype: str = "float32"   # the comparison is of schedules; float32 halves its time
    seed: int = 0

    def __post_init__(self):
        self.train_config("intended")  # validates every field with train.Config's checks

    def train_config(self, schedule):
        return train.Config(task=self.task, epochs=self.epochs, steps=self.steps,
                            start_rate=self.start_rate, finish_rate=self.finish_rate,
                            warmup=self.warmup, dtype=self.dtype, seed=self.seed,
                            schedule=schedule)


@dataclasses.dataclass
class Result:
    summary: str
    headlines: list
    fits: dict


def run(config: Config) -> Result:
    out = common.results_dir(NAME)
    fits = {s: train.fit(config.train_config(s), out / f"checkpoint-{s}.npz")
            for s in ("intended", "article")}
    common.write_csv(out / "data.csv", [{"schedule": s, **row} for s, f in fits.items()
                                        for row in f.steps])
    common.write_csv(out / "epochs.csv", [{"schedule": s, **row} for s, f in fits.items()
                                          for row in f.history])
    plot(config, fits, out / "loss_and_rate.png")
    final = {s: f.history[-1]["valid_loss"] for s, f in fits.items()}
    seconds = sum(f.seconds for f in fits.values())
    common.write_meta(out / "meta.json", config, seconds, final_valid_loss=final)
    lines = [f"{s:8s}  " + "  ".join(f"{h['valid_loss']:.4f}" for h in f.history)
             for s, f in fits.items()]
    summary = (f"valid loss after {config.epochs} epochs: intended {final['intended']:.4f}, "
               f"article {final['article']:.4f}\nvalid loss per epoch:\n" + "\n".join(lines))
    headlines = [common.Headline("valid loss, intended schedule", final["intended"],
                                 final["article"], "the article's schedule, same run",
                                 final["intended"] <= final["article"])]
    return Result(summary, headlines, fits)


def plot(config, fits, path):
    plt = common.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
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
    left.set(yscale="log", xlabel="training step", ylabel="cross-entropy (nats per token)",
             title="loss: intended vs article's schedule")
    right.set(xlabel="training step", ylabel="learning rate",
              title="learning rate per step")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    common.save_figure(fig, path)
