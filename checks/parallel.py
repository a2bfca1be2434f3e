"""One way to run many independent tasks: in this process, or on a Dask cluster.

Calibration, the sensitivity sweep, the zoo and the studies' sweeps are lists of independent
tasks, each seeded by its own description (never by the worker that runs it), so their results
are identical whatever runs them.  Every such loop goes through ``map_tasks``:

    results = map_tasks(fn, tasks, desc="calibrate")             # in this process
    results = map_tasks(fn, tasks, workers=4)                     # a local cluster of 4 processes
    results = map_tasks(fn, tasks, scheduler="tcp://host:8786")   # an existing Dask cluster

``fn`` must be a module-level function and each task picklable (a tuple of names and numbers);
on a remote cluster every worker must have the lab installed (docs/cluster.md).
"""
from __future__ import annotations

from typing import Callable, Sequence

INSTALL_HINT = "pip install -e '.[distributed]'"
CONNECT_TIMEOUT_S = 10


class ClusterError(RuntimeError):
    """Distributed execution cannot start (Dask missing, scheduler unreachable): one line."""


def map_tasks(fn: Callable, tasks: Sequence, *, workers: int = 0, scheduler: str | None = None,
              desc: str | None = None, progress: bool = True) -> list:
    """[fn(t) for t in tasks], in the order of ``tasks``, whatever runs them.

    workers = 0 and no scheduler: in this process (no start-up cost).  workers > 0: a local
    Dask cluster of that many worker processes, closed afterwards: one thread each, and one
    BLAS thread (Dask's nanny sets OMP/OPENBLAS/MKL_NUM_THREADS=1 before it starts a worker).
    scheduler = "tcp://host:port": an existing cluster.
    """
    tasks = list(tasks)
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers: expected an integer >= 0, got {workers!r}")
    if workers and scheduler:
        raise ValueError("workers, scheduler: give one of them (a local cluster or an existing one)")
    from tqdm.auto import tqdm
    bar = dict(desc=desc, disable=not progress or len(tasks) < 2, leave=False)
    if not (workers or scheduler):
        return [fn(t) for t in tqdm(tasks, **bar)]
    distributed = _import_distributed()
    with _client(distributed, workers, scheduler) as client:
        futures = client.map(fn, tasks, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results = [None] * len(tasks)
        for future in tqdm(distributed.as_completed(futures), total=len(futures), **bar):
            results[index[future.key]] = future.result()
    return results


def _import_distributed():
    try:
        import distributed
    except ImportError:
        raise ClusterError(f"distributed execution needs Dask: {INSTALL_HINT}") from None
    return distributed


class _client:
    """A Client on a fresh LocalCluster (closed on exit) or on the scheduler at an address."""

    def __init__(self, distributed, workers, scheduler):
        self.distributed, self.workers, self.scheduler = distributed, workers, scheduler
        self.cluster = self.client = None

    def __enter__(self):
        import logging
        d = self.distributed
        if self.scheduler:
            try:
                self.client = d.Client(self.scheduler, timeout=f"{CONNECT_TIMEOUT_S}s")
            except (OSError, TimeoutError, ValueError) as exc:
                raise ClusterError(f"cannot reach the Dask scheduler at {self.scheduler} "
                                   f"({type(exc).__name__}: {_first_line(exc)})") from None
            return self.client
        self.cluster = d.LocalCluster(n_workers=self.workers, threads_per_worker=1,
                                      processes=True, dashboard_address=":0",
                                      silence_logs=logging.ERROR)
        self.client = d.Client(self.cluster)
        return self.client

    def __exit__(self, *exc):
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def _first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no answer"
