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
ORDER = 63
IN_ALL = False  # an exercise run of its own (python -m experiments length), not part of `all`: keeps `all` under 2 minutes


@dataclasses.dataclass(frozen=True)
class Config(train.Config):
    max_tokens: int = 32
    batch: int = 64
    d_model: int = 48
    heads: int = 4
    dtype: str = "float32"
    request_tokens: int = 16

    def __post_init__(self):
        super().__post_init__()
        try:
            tasks.get(self.task).check_tokens(self.request_tokens)
        except ValueError as exc:
            raise ValueError(str(exc).replace("max_tokens", "request_tokens", 1)) from None


def run(config: Config) -> train.Result:
    short = tasks.requests(config.task, config.request_tokens)
    result = train.train_and_report(config, NAME)          # graded on max_tokens requests
    trained = result.answers
    rows = train.answer(result.fit.params, result.fit.embedding, short, config.task)
    text = (f"# {config.max_tokens}-token requests (the length it was trained on)\n"
            + train.format_answers(trained)
            + f"\n\n# {config.request_tokens}-token requests (shorter than any it has seen)\n"
            + train.format_answers(rows))
    common.atomic_write_text(common.results_dir(NAME) / "answers.txt", text + "\n")
    n_short = sum(ok for _, _, ok in rows)
    result.headlines.append(common.Headline(
        f"{config.request_tokens}-token requests answered as palindromes", n_short, len(rows),
        "behaviour outside the trained length (no expectation: shown, not judged)", True))
    result.summary = result.summary.split("\n")[0] + "\n" + text
    return result
