"""The one list of the lab's runs: what ``python -m experiments NAME`` knows, what ``all`` runs
and the order of the report.

To add a study: write ``experiments/NAME.py`` with ``Config`` and ``run(config) -> Result``
(``experiments.common``) and add one ``Entry`` below; ``in_all`` says whether ``all`` runs it
(and the report shows it), ``seconds`` roughly how long it takes and ``after`` which runs it
reads the results of.  ``all`` on several processes (experiments.runner) starts the longest
first, so that a long study does not start last, and a study only after those it reads.
"""
from __future__ import annotations

import importlib
from typing import NamedTuple


class Entry(NamedTuple):
    name: str            # the command-line name and the results folder
    module: str          # the module holding Config and run()
    in_all: bool = True  # part of `python -m experiments all` and its report
    seconds: float = 1.0  # its time in one serial run of `all` (a weight: only the order counts)
    after: tuple = ()    # the runs whose results it reads: it starts when they have finished


ENTRIES = (
    Entry("sqrt_d", "experiments.sqrt_d", seconds=28.9),
    Entry("attention_scaling", "experiments.attention_scaling", seconds=32.0),
    Entry("entropy_collapse", "experiments.entropy_collapse", seconds=35.0),
    Entry("depth", "experiments.depth", seconds=9.5),
    Entry("rank_collapse", "experiments.rank_collapse", seconds=3.0),
    Entry("freezing", "experiments.freezing", seconds=4.0),
    Entry("init_scale", "experiments.init_scale", seconds=4.5),
    Entry("precision", "experiments.precision", seconds=6.1),
    Entry("half_precision", "experiments.half_precision", seconds=8.0),
    Entry("train", "experiments.train", seconds=25.3),
    Entry("generate", "experiments.generate", seconds=0.2, after=("train",)),  # reads train's checkpoint
    Entry("schedule", "experiments.schedule", seconds=78.3),  # the article's protocol over seeds
    Entry("warmup", "experiments.warmup", seconds=25.0),     # Pre-/Post-LN with and without warm-up
    Entry("pointer", "experiments.pointer", in_all=False),     # exercise runs of their own:
                                                               # they keep `all` short
    Entry("length", "experiments.length", in_all=False),
    Entry("mixed_precision", "experiments.mixed_precision", in_all=False),  # six article runs
    Entry("bench", "experiments.bench", in_all=False),         # a benchmark, not a study
)
BY_NAME = {e.name: e for e in ENTRIES}


def load(entry: Entry):
    """The entry's module (imported on first use)."""
    return importlib.import_module(entry.module)


def get(name: str) -> Entry:
    if name not in BY_NAME:
        raise ValueError(f"unknown study {name!r}; choose from {', '.join(BY_NAME)}, all")
    return BY_NAME[name]


def in_all(entries=ENTRIES) -> list:
    return [e for e in entries if e.in_all]
