"""The synthetic digit tasks, their data layout and split (not a study: no NAME here).

A task draws sources, T digits in [0, 10) per sequence, and computes each target from its source,
so an answer can always be graded.  Data sets have the article's layout
(batches, 2, batch, T): ``data[:, 0]`` the sources, ``data[:, 1]`` the targets.  docs/tasks.md
shows how to add a task of your own with ``@task``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

DIGITS = 10  # data tokens 0-9; the model adds Start (10) and Finish (11)


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    sources: Callable   # (rng, n, T) -> (n, T) int64 digits
    target: Callable    # (src (n, T)) -> (n, T) int64 digits
    min_tokens: int = 1
    even_tokens: bool = False
    doc: str = ""

    def check_tokens(self, T) -> None:
        """Raise ValueError naming max_tokens when the task cannot be posed with T tokens."""
        if not isinstance(T, (int, np.integer)) or T < self.min_tokens:
            raise ValueError(f"max_tokens: the {self.name} task needs at least {self.min_tokens} "
                             f"tokens, got {T!r}")
        if self.even_tokens and T % 2:
            raise ValueError(f"max_tokens: the {self.name} task needs an even length, got {T}")


TASKS: dict[str, Task] = {}


def task(name, *, target, min_tokens=1, even_tokens=False):
    """Register sources(rng, n, T) as a task; ``target(src)`` computes the answers."""
    def register(sources):
        TASKS[name] = Task(name, sources, target, min_tokens, even_tokens,
                           (sources.__doc__ or "").strip())
        return sources
    return register


def get(name) -> Task:
    if name not in TASKS:
        raise ValueError(f"task: expected one of {', '.join(sorted(TASKS))}, got {name!r}")
    return TASKS[name]


# --- the article's two tasks and one of the lab's own ----------------------------------------

def _palindrome_target(src):
    half = src[:, : src.shape[1] // 2]                      # (n, T/2) the number
    return np.concatenate([half, half[:, ::-1]], axis=1)    # (n, T) number, then its reverse


@task("palindrome", target=_palindrome_target, min_tokens=2, even_tokens=True)
def palindrome(rng, n, T):
    """An (T/2)-digit number, first digit non-zero, written twice -> the number and its reverse."""
    first = rng.integers(1, DIGITS, size=(n, 1))            # (n, 1)
    rest = rng.integers(0, DIGITS, size=(n, T // 2 - 1))    # (n, T/2 - 1)
    number = np.concatenate([first, rest], axis=1)          # (n, T/2)
    return np.concatenate([number, number], axis=1)         # (n, T)


def _pointer_target(src):
    return np.take_along_axis(src, src, axis=1)             # y_i = x[x_i]


@task("pointer_index", target=_pointer_target, min_tokens=DIGITS)
def pointer_index(rng, n, T):
    """T uniform digits x (T >= 10) -> y_i = x[x_i]."""
    return rng.integers(0, DIGITS, size=(n, T))


@task("sort", target=lambda src: np.sort(src, axis=1))
def sort(rng, n, T):
    """The lab's own task: T uniform digits -> the same digits in ascending order."""
    return rng.integers(0, DIGITS, size=(n, T))


# --- data sets -----------------------------------------------------------------------------

def make_dataset(name, *, batches=256, batch=64, T=16, seed=0):
    """(batches, 2, batch, T) int64: [:, 0] sources, [:, 1] targets, from default_rng([seed, 0])."""
    spec = get(name)
    spec.check_tokens(T)
    for arg, value in (("batches", batches), ("batch", batch)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{arg}: expected a positive integer, got {value!r}")
    rng = np.random.default_rng([seed, 0])
    src = np.asarray(spec.sources(rng, batches * batch, T), dtype=np.int64)   # (batches*batch, T)
    tgt = np.asarray(spec.target(src), dtype=np.int64)                        # (batches*batch, T)
    if src.shape != (batches * batch, T) or tgt.shape != src.shape:
        raise ValueError(f"task {name!r}: expected sources and targets of shape "
                         f"{(batches * batch, T)}, got {src.shape} and {tgt.shape}")
    if src.min() < 0 or max(src.max(), tgt.max()) >= DIGITS or tgt.min() < 0:
        raise ValueError(f"task {name!r}: tokens must be digits in [0, {DIGITS})")
    return np.stack([src, tgt]).reshape(2, batches, batch, T).transpose(1, 0, 2, 3).copy()


def split(data, *, valid_fraction=1 / 3, seed=0):
    """Shuffle whole batches with default_rng([seed, 1]); the last floor(batches * fraction)
    are held out: 256 batches -> 171 train, 85 valid."""
    n_valid = int(len(data) * valid_fraction)
    if not 1 <= n_valid < len(data):
        raise ValueError(f"valid_fraction: {valid_fraction} of {len(data)} batches leaves "
                         f"{n_valid} for validation and {len(data) - n_valid} for training")
    order = np.random.default_rng([seed, 1]).permutation(len(data))
    return data[order[:-n_valid]], data[order[-n_valid:]]


# The lab's nine palindrome requests (the article shows only its first); for other tasks and
# lengths the requests are drawn from the task with a fixed seed.
PALINDROME_NUMBERS = ["12345678", "98765432", "10000000", "55555555", "31415926", "27182818",
                      "11223344", "90909090", "60221407"]


def requests(name, T, n=9, seed=2024):
    """n requests (n, T) of a task: the lab's nine palindromes at T = 16, else drawn."""
    spec = get(name)
    spec.check_tokens(T)
    if name == "palindrome" and T == 16 and n == len(PALINDROME_NUMBERS):
        numbers = np.array([[int(c) for c in s] for s in PALINDROME_NUMBERS])  # (9, 8)
        return np.concatenate([numbers, numbers], axis=1)                      # (9, 16)
    return np.asarray(spec.sources(np.random.default_rng(seed), n, T), dtype=np.int64)
