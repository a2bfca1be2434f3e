"""Run studies and collect what each left behind: one after another in this process, or on a
pool of worker processes (``python -m experiments all --jobs N``).

Why a pool gives the same numbers: every study draws from Generators seeded by its own Config and
runs BLAS on one thread (``common.conduct``, ``train.fit``), so the process it runs in does not
enter its results; data.csv is the same byte for byte.  Why processes and not threads: the
studies are NumPy loops over small arrays, where the interpreter lock, not BLAS, sets the pace.
Why ``spawn``: a forked child would inherit the parent's BLAS and JAX threads in whatever state
they were, which can hang it; a spawned one starts clean on every platform.

Order: the pool starts the longest study first (the registry's ``seconds``), so that no long
study starts last and leaves the other cores idle at the end, and starts a study only after the
studies it reads (``after``) have finished.  A study whose prerequisite failed is not run (it
would read a stale or missing file): it is reported as failed, naming the prerequisite.
"""
from __future__ import annotations

import concurrent.futures as futures
import contextlib
import dataclasses
import io
import multiprocessing
import os
import pathlib
import time
import traceback
from typing import Callable

from experiments import common, registry

TRACEBACK_LINES = 12  # the end of a failing study's traceback: enough to see where and why


@dataclasses.dataclass
class Outcome:
    """What one study's run left behind: its result or its error, its run time, and its
    module's docstring (the report's protocol text when the result states none)."""
    entry: registry.Entry
    result: common.Result | None = None
    error: str | None = None
    seconds: float = 0.0
    doc: str = ""

    @property
    def name(self):
        return self.entry.name

    @property
    def headlines(self):
        return list(self.result.headlines) if self.result is not None else []


def default_jobs() -> int:
    """The cores this process may use (its CPU affinity where the platform tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def run_one(entry, config=None) -> Outcome:
    """Run one study in this process at config (default: its Config()); any exception becomes
    the outcome's error, so that the other studies still run."""
    start = time.perf_counter()
    doc = ""
    try:
        module = registry.load(entry)
        doc = module.__doc__ or ""
        result = module.run(module.Config() if config is None else config)
    except Exception:  # noqa: BLE001 - any study failure is reported, the others still run
        lines = traceback.format_exc().strip().splitlines()
        return Outcome(entry, error="\n".join(lines[-TRACEBACK_LINES:]),
                       seconds=time.perf_counter() - start, doc=doc)
    return Outcome(entry, result=result, seconds=time.perf_counter() - start, doc=doc)


def portable(outcome: Outcome) -> Outcome:
    """The outcome without the result's ``extra`` (trained parameters, fits, tokens): the report
    does not use it, and a worker process would otherwise send all of it back."""
    if outcome.result is None:
        return outcome
    return dataclasses.replace(outcome, result=dataclasses.replace(outcome.result, extra={}))


def needs(entry, names) -> set:
    """The prerequisites of entry among the studies being run (one that is not run is not
    waited for: `generate` alone reads whatever checkpoint train left)."""
    return set(entry.after) & set(names)


def startable(pending, finished, names) -> list:
    """The pending entries whose prerequisites among names (the studies of the run) have all
    finished, longest first (ties: the registry's order)."""
    ready = [e for e in pending if needs(e, names) <= set(finished)]
    return sorted(ready, key=lambda e: -e.seconds)


def skipped(entry, failed) -> Outcome | None:
    """The outcome of a study not run because a prerequisite failed; None when it may run."""
    broken = sorted(set(entry.after) & set(failed))
    if not broken:
        return None
    return Outcome(entry, error=f"not run: it reads the results of {', '.join(broken)}, which failed")


def run_serial(entries, configs, on_start: Callable, on_done: Callable) -> None:
    """Every study in the given order, in this process (progress bars and all)."""
    failed = set()
    for entry in entries:
        on_start(entry)
        outcome = skipped(entry, failed) or run_one(entry, configs.get(entry.name))
        if outcome.error:
            failed.add(entry.name)
        on_done(outcome)


def _worker_start(results: str) -> None:
    """A pool worker writes where its parent would and keeps its progress bars quiet (two
    processes drawing bars on one terminal garble both)."""
    common.RESULTS = pathlib.Path(results)
    os.environ["GRADLAB_QUIET"] = "1"


def _run_in_worker(entry, config) -> Outcome:
    """run_one in a pool worker: the study's own printing (epoch lines) is dropped, the parent
    prints one line per finished study instead."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return portable(run_one(entry, config))


def run_pool(entries, jobs, configs, on_done: Callable) -> None:
    """The studies on `jobs` spawned worker processes, longest first, each after its
    prerequisites; on_done(outcome) as each finishes."""
    pending, running, finished, failed = list(entries), {}, set(), set()
    names = {e.name for e in entries}
    context = multiprocessing.get_context("spawn")
    pool = futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_start,
                                       initargs=(str(common.RESULTS),))

    def done(outcome):
        finished.add(outcome.name)
        if outcome.error:
            failed.add(outcome.name)
        on_done(outcome)

    try:
        while pending or running:
            for entry in startable(pending, finished, names)[:jobs - len(running)]:
                pending.remove(entry)
                outcome = skipped(entry, failed)
                if outcome is not None:
                    done(outcome)
                    continue
                try:
                    running[pool.submit(_run_in_worker, entry, configs.get(entry.name))] = entry
                except futures.BrokenExecutor as exc:
                    done(Outcome(entry, error=f"not run: the worker processes stopped ({exc})"))
            if not running and pending:  # nothing can start: the prerequisites form a cycle
                for entry in list(pending):
                    pending.remove(entry)
                    done(Outcome(entry, error="not run: its prerequisites wait for each other"))
            if not running:
                continue
            ready, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
            for future in ready:
                entry = running.pop(future)
                try:
                    outcome = future.result()
                except Exception as exc:  # noqa: BLE001 - a worker killed (memory) or a result that does not pickle
                    outcome = Outcome(entry, error=f"its worker process failed: "
                                                   f"{type(exc).__name__}: {exc}")
                done(outcome)
    finally:
        pool.shutdown(wait=not pending and not running, cancel_futures=True)


def _nothing(*_):
    return None


def run(entries, *, jobs=1, configs=None, on_start: Callable = _nothing,
        on_done: Callable = _nothing) -> list:
    """Run the studies (jobs = 1: serially, here; more: on a pool) and return their outcomes in
    the order of entries.  configs: {name: Config} for studies not to run at their defaults;
    on_done(outcome) as each finishes; on_start(entry) before each starts, in a serial run only
    (in a pool the starts are not in this process and not in a readable order)."""
    common.check_int("jobs", jobs, 1)
    outcomes = {}

    def collect(outcome):
        outcomes[outcome.name] = outcome
        on_done(outcome)

    jobs = min(jobs, max(len(entries), 1))
    if jobs == 1:
        run_serial(entries, dict(configs or {}), on_start, collect)
    else:
        run_pool(entries, jobs, dict(configs or {}), collect)
    return [outcomes[e.name] for e in entries if e.name in outcomes]
