"""The article's training run in mixed and in pure half precision, beside the float32 run.

Every run shares the data, the split, the shuffles and the initial weights of ``train``'s defaults
(palindromes of 16 tokens, 10 epochs of 64 steps); only the formats differ:

* float32: the reference.
* bfloat16 and float16 mixed precision: the forward and backward in the half format on a copy of
  float32 master weights, Adam in float32; float16 with dynamic loss scaling, and once without
  any, to show what the scaling changes.
* bfloat16 and float16 "pure" half precision: the parameters and Adam's moments in the format.

The headlines are the goal: a mixed-precision run ends at a valid loss at most twice the float32
run's.  The table adds the wall time (training and validation), the median time of one step
measured interleaved across the runs' configurations, the nine requests answered by
the half-precision copy, the skipped steps, the share of gradient entries that came back exactly
zero (underflow), the share of the weights that the last epoch's steps left unchanged and, for
the pure runs, where Adam's second moment is zero; a table per epoch follows the valid loss and
the unchanged share, and the constants table shows what Adam's constants and a small update
become in each format: the reasons pure half precision stalls or breaks.
``--write-docs`` writes both tables into docs/training.md.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import NamedTuple

import numpy as np

from experiments import common, tasks, train
from kernels import loss_scale, model as M
from kernels.loss_scale import finfo
from kernels.optim import adam_init

NAME = "mixed_precision"
GOAL = 2.0  # a mixed-precision run's final valid loss within this factor of the float32 run's


class Variant(NamedTuple):
    name: str
    dtype: str
    master_weights: bool = True
    loss_scale: str = "auto"


VARIANTS = (
    Variant("float32", "float32"),
    Variant("bfloat16 mixed", "bfloat16"),
    Variant("float16 mixed, dynamic loss scale", "float16", loss_scale="dynamic"),
    Variant("float16 mixed, no loss scale", "float16", loss_scale="none"),
    Variant("bfloat16 pure", "bfloat16", master_weights=False),
    Variant("float16 pure, dynamic loss scale", "float16", master_weights=False,
            loss_scale="dynamic"),
)
GOALS = ("bfloat16 mixed", "float16 mixed, dynamic loss scale")


@dataclasses.dataclass(frozen=True)
class Config:
    epochs: int = 10             # training epochs (the article's run)
    steps: int = 64              # training steps per epoch
    seed: int = 0                # seed of the data, the split, the shuffles and the init
    write_docs: bool = False     # write the tables into docs/training.md

    def __post_init__(self):
        common.validate(self, ints={"epochs": 1, "steps": 1, "seed": 0})

    def train_config(self, variant: Variant) -> train.Config:
        return train.Config(epochs=self.epochs, steps=self.steps, seed=self.seed,
                            dtype=variant.dtype, master_weights=variant.master_weights,
                            loss_scale=variant.loss_scale)


class Outcome(NamedTuple):
    variant: Variant
    config: train.Config
    fit: train.Fit
    diverged: str    # "" or where the run met a non-finite loss


def train_variant(config: Config, variant: Variant, out) -> Outcome:
    """One run; a run that meets a non-finite loss keeps what it trained until then."""
    slug = "".join(c if c.isalnum() else "-" for c in variant.name).replace("--", "-")
    path = out / f"checkpoint-{slug}.npz"
    cfg = config.train_config(variant)
    try:  # pure float16 divides by zero (Adam's eps rounds to 0): the table says so, quietly
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return Outcome(variant, cfg, train.fit(cfg, path), "")
    except train.NonFiniteError as exc:
        return Outcome(variant, cfg, exc.partial, str(exc).split(";")[0])


def final_valid(outcome: Outcome) -> float:
    """The last epoch's valid loss; NaN for a run that stopped."""
    history = outcome.fit.history
    return history[-1]["valid_loss"] if history and not outcome.diverged else float("nan")


def answers(outcome: Outcome) -> str:
    """How many of the task's nine requests the half-precision copy answers exactly ("-" for a
    run that stopped)."""
    if outcome.diverged:
        return "–"
    cfg = outcome.config
    rows = train.answer(train.as_format(outcome.fit.params, cfg.formats()[0]),
                        outcome.fit.embedding, tasks.requests(cfg.task, cfg.max_tokens), cfg.task)
    return f"{sum(ok for *_, ok in rows)}/{len(rows)}"


def adam_diagnosis(fit: train.Fit) -> dict:
    """The share of Adam's second moments v that are exactly 0 (underflow) after the last step,
    and of those where m is not: there m / (sqrt(v) + eps) divides by zero when eps rounds to 0."""
    v = np.concatenate([np.asarray(a, np.float32).ravel() for a in fit.adam.v.values()])
    m = np.concatenate([np.asarray(a, np.float32).ravel() for a in fit.adam.m.values()])
    return {"Adam v = 0": float(np.mean(v == 0)),
            "v = 0, m ≠ 0": float(np.mean((v == 0) & (m != 0)))}


def table_rows(outcomes, steps_s) -> list:
    """One row per run: the formats, the final valid loss and its ratio to the float32 run's
    (the first), answers, skipped steps, zero gradients, unchanged weights, the run's seconds,
    and the interleaved step time (steps_s: {run: seconds}) and its ratio."""
    ref = outcomes[0]
    rows = []
    for o in outcomes:
        cfg = o.config
        compute, store = cfg.formats()
        valid, steps = final_valid(o), o.fit.steps
        last = [s["unchanged"] for s in steps[-cfg.steps:] if not s["skipped"]]
        rows.append({
            "run": o.variant.name, "compute": str(compute), "weights, Adam": str(store),
            "loss scale": cfg.loss_scale_policy().kind, "final valid loss": valid,
            "x float32": valid / final_valid(ref), "stopped": o.diverged,
            "skipped steps": o.fit.scale.skipped, "correct answers": answers(o),
            "zero gradients": float(np.mean([s["zero_grads"] for s in steps])),
            "unchanged, last epoch": float(np.mean(last)) if last else float("nan"),
            "seconds": o.fit.seconds,
            "step ms": 1e3 * steps_s[o.variant.name],
            "step x float32": steps_s[o.variant.name] / steps_s[ref.variant.name],
            **(adam_diagnosis(o.fit) if store == compute and compute.itemsize == 2 else {})})
    return rows


def step_times(config: Config, repeats: int = 20) -> dict:
    """Median seconds of one training step (forward, backward, unscaling, Adam) of each variant
    from the same initial state and batch, measured round-robin in one loop: a shared machine's
    drifts hit every variant alike, so the ratios hold better than the whole runs' times."""
    from experiments import timing
    batch = tasks.make_dataset("palindrome", batches=1, batch=64, T=16, seed=config.seed)[0]
    candidates = {}
    for variant in VARIANTS:
        cfg = config.train_config(variant)
        compute, store = cfg.formats()
        params = train.as_format(M.init_params(cfg.model_config(), seed=cfg.seed, dtype=store),
                                 store)
        state = train.TrainState(params, adam_init(params),
                                 loss_scale.init_state(cfg.loss_scale_policy()))
        work, table = train.as_format(params, compute), M.embedding_table(cfg.model_config())
        candidates[variant.name] = functools.partial(
            train.train_step, state, work, batch[0], batch[1], 1e-3, 1, config=cfg,
            embedding=table)
    with timing.blas_threads(1), np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return timing.compare(candidates, repeats=repeats, warmup=2)


def epoch_rows(outcomes) -> list:
    """Per epoch, each run's "valid loss / unchanged share"; where a run stopped, why."""
    def cell(o, e):
        if e < len(o.fit.history):
            row = o.fit.history[e]
            return f"{row['valid_loss']:.4g} / {row['unchanged']:.3f}"
        return o.diverged if e == len(o.fit.history) else ""
    count = max(len(o.fit.history) for o in outcomes)
    return [{"epoch": e + 1, **{o.variant.name: cell(o, e) for o in outcomes}}
            for e in range(count)]


def constants_rows() -> list:
    """What Adam's constants, the final rate and the spacing of the numbers near a typical
    weight (0.1) become in each format, rounded to nearest."""
    rows = []
    for name in ("float32", "bfloat16", "float16"):
        dtype = np.dtype(name)
        info = finfo(dtype)
        r = lambda x: float(np.asarray(x, np.float64).astype(dtype))  # noqa: E731
        rows.append({"format": name, "eps 1e-8": r(1e-8), "beta1 0.9": r(0.9),
                     "beta2 0.999": r(0.999), "1 - beta2": r(1 - 0.999),
                     "final rate 1e-5": r(1e-5),
                     "half ulp at 0.1": math.ldexp(1.0, math.frexp(0.1)[1] - 2 - info.nmant),
                     "smallest positive": float(info.smallest_subnormal)})
    return rows


def _cell(value) -> str:
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def markdown(rows, columns=None) -> str:
    """A Markdown table of the rows' columns (all, in order, by default)."""
    columns = columns or list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def plot(outcomes, path):
    """Valid loss per epoch (left) and the share of the weights a step left unchanged (right)."""
    fig, (left, right) = common.figure(ncols=2, width=6.0)
    for o in outcomes:
        epochs = [h["epoch"] for h in o.fit.history]
        left.plot(epochs, [h["valid_loss"] for h in o.fit.history], "o-", ms=3,
                  label=o.variant.name)
        right.plot([s["step"] + 1 for s in o.fit.steps],
                   [s["unchanged"] for s in o.fit.steps], lw=0.7, label=o.variant.name)
    common.label(left, "valid loss per epoch", "epoch", "cross-entropy (nats per token)",
                 logy=True)
    common.label(right, "weights a step left unchanged (as the forward sees them)",
                 "training step", "share of the weights", legend=False)
    common.save_figure(fig, path)


def run(config: Config) -> common.Result:
    out, start = common.results_dir(NAME), time.perf_counter()
    outcomes = [train_variant(config, v, out) for v in common.progress(VARIANTS, desc=NAME)]
    rows = table_rows(outcomes, step_times(config))
    constants, epochs = constants_rows(), epoch_rows(outcomes)
    ref = final_valid(outcomes[0])
    headlines = [common.bound(f"final valid loss, {o.variant.name}", final_valid(o), GOAL * ref,
                              f"{GOAL:g} x the float32 run's {ref:.4g}",
                              "final valid loss <= 2 x the float32 run's (same data, seed, init)")
                 for o in outcomes if o.variant.name in GOALS]
    plot(outcomes, out / "loss_and_unchanged.png")
    figures = [(out / "loss_and_unchanged.png", "Valid loss per epoch of each run (left) and "
                "the share of the weights, in the compute format, that each step left unchanged "
                "(right).")]
    common.write_csv(out / "steps.csv", [{"run": o.variant.name, **s} for o in outcomes
                                         for s in o.fit.steps])
    text = "\n\n".join([markdown(rows, COLUMNS), "Per epoch: valid loss / share of the weights "
                         "a step left unchanged (mean over the epoch's steps).", markdown(epochs),
                         "What the constants become in each format:", markdown(constants)])
    if config.write_docs:
        from checks.docs import DOCS, write_section
        command = "python -m experiments mixed_precision --write-docs"
        write_section(DOCS / "training.md", "mixed-precision",
                      f"`{command}` ({_machine()}):\n\n{text}")
    summary = "\n".join([text, *(h.sentence() for h in headlines)])
    return common.finish(NAME, config, start, rows, figures, headlines, summary,
                         tables=[("runs", rows), ("per epoch", epochs),
                                 ("constants in each format", constants)])


def _machine() -> str:
    """The machine's cores and load: the times depend on both."""
    return (f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} when it finished; "
            f"seconds: the whole run's wall clock, training and validation, one run after the "
            f"other; step ms: the median of 20 interleaved steps of each run's configuration")


COLUMNS = ("run", "weights, Adam", "loss scale", "final valid loss", "x float32", "stopped",
           "correct answers", "skipped steps", "zero gradients", "unchanged, last epoch",
           "Adam v = 0", "v = 0, m ≠ 0", "seconds", "step ms", "step x float32")
