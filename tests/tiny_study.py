"""A stand-in study for the runner's tests.  It is a module of its own, not a fake in
sys.modules, because the pool's worker processes import it afresh and see none of a test's
monkeypatching: it draws from its seed and writes data.csv, or fails when told to."""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from experiments import common


@dataclasses.dataclass(frozen=True)
class Config:
    name: str = "tiny"   # the results folder
    fails: bool = False  # raise instead of finishing
    seed: int = 0        # seed of the draws


def run(config: Config) -> common.Result:
    if config.fails:
        raise RuntimeError(f"{config.name} broke on purpose")
    draws = np.random.default_rng(config.seed).standard_normal(5)
    heads = [common.test(f"{config.name} mean", float(draws.mean()), 1.0, 0.0, "zero")]
    return common.finish(config.name, config, time.perf_counter(), [{"x": x} for x in draws], [],
                         heads, f"{config.name} summary")
