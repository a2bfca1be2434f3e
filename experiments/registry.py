"""The one list of the lab's runs: what ``python -m experiments NAME`` knows, what ``all`` runs
and the order of the report.

To add a study: write ``experiments/NAME.py`` with ``Config`` and ``run(config) -> Result``
(``experiments.common``) and add one ``Entry`` below; ``in_all`` says whether ``all`` runs it
(and the report shows it).
"""
from __future__ import annotations

import importlib
from typing import NamedTuple


class Entry(NamedTuple):
    name: str            # the command-line name and the results folder
    module: str          # the module holding Config and run()
    in_all: bool = True  # part of `python -m experiments all` and its report


ENTRIES = (
    Entry("sqrt_d", "experiments.sqrt_d"),
    Entry("attention_scaling", "experiments.attention_scaling"),
    Entry("entropy_collapse", "experiments.entropy_collapse"),
    Entry("depth", "experiments.depth"),
    Entry("rank_collapse", "experiments.rank_collapse"),
    Entry("init_scale", "experiments.init_scale"),
    Entry("precision", "experiments.precision"),
    Entry("train", "experiments.train"),
    Entry("generate", "experiments.generate"),      # after train: it reads train's checkpoint
    Entry("schedule", "experiments.schedule"),  # the article's protocol over seeds
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
