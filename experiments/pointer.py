"""The article's third exercise: pointer_index with max_tokens >= 16 and one block per side,
tuned until the validation loss falls below 0.5 -- a named preset, one command.

``python -m experiments pointer`` trains the preset below (every field can still be changed on
the command line) and writes the same files as ``train`` into results/pointer/.  How the preset
was found is in docs/training.md.
"""
from __future__ import annotations

import dataclasses

from experiments import common, train

NAME = "pointer"
TARGET = 0.5


@dataclasses.dataclass(frozen=True)
class Config(train.Config):
    task: str = "pointer_index"  # the synthetic task of the exercise
    max_tokens: int = 16         # T, at least 16 as the exercise asks
    blocks: int = 1              # blocks per side (the exercise: one)
    d_model: int = 32            # D, the model width
    heads: int = 1               # H: one head of width 32 finds the pointed-to position best
    epochs: int = 20             # training epochs
    start_rate: float = 1e-2     # peak learning rate
    dtype: str = "float32"       # floating-point type (float32 halves the time)

    def __post_init__(self):
        super().__post_init__()
        if self.max_tokens < 16:
            raise ValueError(f"max_tokens: the exercise asks for at least 16 tokens, got {self.max_tokens}")


def run(config: Config) -> common.Result:
    return train.train_and_report(config, NAME, expected_valid=(
        TARGET, "the article's third exercise: valid loss below 0.5"))
