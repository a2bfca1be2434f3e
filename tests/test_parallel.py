"""map_tasks: the same results in task order, in this process or on a Dask cluster."""
import socket
import sys

import pytest

from checks import parallel
from checks.__main__ import main
from checks.calibrate import calibrate


def _square(x):
    return x * x


def test_in_process_keeps_task_order():
    assert parallel.map_tasks(_square, [3, 1, 2], progress=False) == [9, 1, 4]


@pytest.mark.slow  # starts a 2-process cluster
def test_two_worker_local_cluster_gives_the_single_process_margins_bit_for_bit():
    """Two worker processes (processes=True, the default of workers > 0), tiny checks."""
    pytest.importorskip("distributed")
    kwargs = dict(rows=["linear"], dtypes=["float32"], seeds=2, progress=False)  # two tasks
    here = calibrate(**kwargs)
    there = calibrate(**kwargs, workers=2)
    assert [(m.layer, m.dtype, m.checks) for m in here] == [("linear", "float32", 2)]
    assert there == here  # every field: the fractions of tolerance compare with ==


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_scheduler_is_one_line_at_the_cli(monkeypatch, capsys):
    pytest.importorskip("distributed")
    monkeypatch.setattr(parallel, "CONNECT_TIMEOUT_S", 1)
    address = f"tcp://127.0.0.1:{_closed_port()}"
    assert main(["calibrate", "--scheduler", address, "--layer", "linear", "--seeds", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m checks calibrate: error: cannot reach the Dask scheduler at "
                          + address) and "\n" not in err


def test_without_dask_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(parallel.ClusterError, match=r"pip install -e '\.\[distributed\]'"):
        parallel.map_tasks(_square, [1, 2], workers=2, progress=False)


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": -1}, "workers: expected an integer >= 0"),
    ({"workers": 2, "scheduler": "tcp://x:1"}, "give one of them")])
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        parallel.map_tasks(_square, [1], **kwargs)
