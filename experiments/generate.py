"""Answer requests with a trained checkpoint by greedy generation.

``python -m experiments generate --checkpoint results/train/checkpoint.npz --requests "1 2 3 4 5 6 7 8 1 2 3 4 5 6 7 8; 9 9 1 2 9 9 1 2"``
loads the parameters (never with pickle; a truncated or altered file is refused), runs the
encoder once per request batch, and decodes greedily until every sequence has produced Finish
(later positions padded with ``--pad``, Finish by default).  Without ``--requests`` it asks the
nine requests of the checkpoint's task.  Answers are graded with the task's target function.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from experiments import checkpoint, common, tasks
from experiments.train import answer, format_answers
from kernels import model

NAME = "generate"


@dataclasses.dataclass(frozen=True)
class Config:
    checkpoint: str = ""  # checkpoint to answer with; "" = the train run's, under the results folder
    requests: str = ""    # digits separated by spaces or commas, requests by ';'; "" = the nine
    max_new: int = 0      # decoder steps at most; 0 = request length + 1 (the digits and Finish)
    pad: int = -1         # id written after a sequence's Finish; -1 = Finish


def parse_requests(text):
    """'1 2 3; 4,5,6' -> (2, 3) int64; every request must have the same length."""
    rows = []
    for part in text.split(";"):
        tokens = part.replace(",", " ").split()
        if not tokens:
            continue
        if not all(t.isdigit() and int(t) < tasks.DIGITS for t in tokens):
            raise ValueError(f"requests: expected digits 0-9 separated by spaces, got {part.strip()!r}")
        rows.append([int(t) for t in tokens])
    if not rows or len({len(r) for r in rows}) != 1:
        raise ValueError(f"requests: expected one or more requests of equal length, got {text!r}")
    return np.array(rows, dtype=np.int64)


def run(config: Config):
    saved = checkpoint.load(config.checkpoint or common.RESULTS / "train" / "checkpoint.npz")
    params = saved.params
    mcfg = model.config_of(params)
    table = model.embedding_table(mcfg, params["out.W"].dtype)
    task, T = saved.config["task"], saved.config["max_tokens"]
    position = saved.config.get("norm_position", "pre")   # checkpoints from before the option: pre
    src = parse_requests(config.requests) if config.requests else tasks.requests(task, T)
    gen = model.generate(src, params, embedding=table, max_new=config.max_new or None,
                         pad=None if config.pad < 0 else config.pad, norm_position=position)
    try:
        tasks.get(task).check_tokens(src.shape[1])
        rows = (answer(params, table, src, task, position)
                if config.max_new == 0 and config.pad < 0 else None)
    except ValueError:   # a length the task cannot grade (e.g. odd for palindromes)
        rows = None
    if rows is None:
        text = "\n".join(f"{' '.join(map(str, s))}  ->  {' '.join(map(str, out))}"
                         for s, out in zip(src, gen.tokens[:, 1:]))
        n_ok = None
    else:
        text, n_ok = format_answers(rows), sum(ok for _, _, ok in rows)
    out = common.results_dir(NAME)
    common.atomic_write_text(out / "answers.txt", text + "\n")
    graded = f"; {n_ok}/{len(src)} correct for {task}" if n_ok is not None else ""
    summary = (f"{len(src)} requests, {gen.steps} decoder steps (max {config.max_new or src.shape[1] + 1})"
               f"{graded}, checkpoint after epoch {saved.epoch}\n{text}")
    headlines = [] if n_ok is None else [common.Headline(
        "correct answers", n_ok, float("nan"), len(src), 0.0, f"the {task} task's target",
        "every request answered exactly; the same checkpoint train graded: a check of the "
        "decoder, not a result", n_ok == len(src), kind="identity")]
    return common.Result(summary, headlines, extra={"tokens": gen.tokens})
