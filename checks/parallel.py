"""One way to run many independent tasks: in this process, or on a Dask cluster.

Calibration, the sensitivity sweep, the zoo and the studies' sweeps are lists of independent
tasks, each seeded by its own description (never by the worker that runs it), so their results
are identical whatever runs them.  Every such loop goes through ``map_tasks``:

    results = map_tasks(fn, tasks, desc="calibrate")      # fn(task) for every task, in order

``fn`` must be a module-level function and each task picklable (a tuple of names and numbers).
"""
from __future__ import annotations

from typing import Callable, Sequence


def map_tasks(fn: Callable, tasks: Sequence, *, workers: int = 0, scheduler: str | None = None,
              desc: str | None = None, progress: bool = True) -> list:
    """[fn(t) for t in tasks], in the order of ``tasks``.

    workers = 0 and no scheduler: in this process (no start-up cost).  workers > 0: a local
    cluster of that many worker processes.  scheduler = "tcp://host:port": an existing cluster.
    """
    if workers or scheduler:
        raise NotImplementedError("distributed execution is not available yet")
    from tqdm.auto import tqdm
    return [fn(t) for t in tqdm(tasks, desc=desc, disable=not progress or len(tasks) < 2,
                                leave=False)]
