"""Length behaviour: train palindromes at max_tokens 32, then ask 16-token requests.

The article trains a second model on 32-token palindromes (with a bigger batch and d_model) and
feeds it the 16-token requests: the model has only seen 16-digit numbers and answers a shorter
one by its own habits (the article saw it duplicate each half and then reverse).  This run shows
the answers to the lab's nine 16-token requests next to nine 32-token ones it was trained for.
``python -m experiments length`` writes results/length/ (answers.txt has both sets).
"""
from __future__ import annotations

import dataclasses

from experiments import common, tasks, train

NAME = "length"


@dataclasses.dataclass(frozen=True)
class Config(train.Config):
    max_tokens: int = 32         # T, the length trained on
    batch: int = 64              # sequences per batch
    d_model: int = 48            # D, the model width
    heads: int = 4               # H, attention heads
    dtype: str = "float32"       # floating-point type (float32 halves the time)
    request_tokens: int = 16     # length of the requests asked afterwards

    def __post_init__(self):
        super().__post_init__()
        try:
            tasks.get(self.task).check_tokens(self.request_tokens)
        except ValueError as exc:
            raise ValueError(str(exc).replace("max_tokens", "request_tokens", 1)) from None


def run(config: Config) -> common.Result:
    short = tasks.requests(config.task, config.request_tokens)
    result = train.train_and_report(config, NAME)          # graded on max_tokens requests
    trained = result.extra["answers"]
    rows = train.answer(result.extra["fit"].params, result.extra["fit"].embedding, short, config.task)
    text = (f"# {config.max_tokens}-token requests (the length it was trained on)\n"
            + train.format_answers(trained)
            + f"\n\n# {config.request_tokens}-token requests (shorter than any it has seen)\n"
            + train.format_answers(rows))
    common.atomic_write_text(common.results_dir(NAME) / "answers.txt", text + "\n")
    n_short = sum(ok for _, _, ok in rows)
    result.headlines.append(common.shown(
        f"{config.request_tokens}-token requests answered as palindromes", n_short, float("nan"),
        f"of {len(rows)}", "behaviour outside the trained length (the article showed it, no number)"))
    result.summary = result.summary.split("\n")[0] + "\n" + text
    return result
