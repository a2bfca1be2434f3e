"""The example output shown in the README and the guides, produced by the checker itself.

Every block between ``<!-- begin: NAME -->`` and ``<!-- end: NAME -->`` that shows what a command
prints is made here, and ``python -m checks docs`` (``make docs``) writes them all.  The suite
then recomputes each block and compares what is meaningful in it (verdicts, structure, the
numbers within the band rounding allows: ``checks.doc_bands``), never the last digits of
rounding noise, which change with the CPU, the BLAS kernel and JAX's code generation.
"""
from __future__ import annotations

import contextlib
import io
import pathlib
from typing import Callable, NamedTuple

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Example(NamedTuple):
    path: pathlib.Path   # the page that shows it
    name: str            # its section name on that page
    kind: str            # how the suite compares it: "table", "failure" or "exact"
    make: Callable[[], str]


def _fenced(text: str) -> str:
    return "```\n" + text.rstrip("\n") + "\n```"


def _table(layer: str, dtypes, head: int | None = None) -> str:
    from checks.registry import BY_NAME, run_row
    from checks.report import format_table
    reports = [run_row(BY_NAME[layer], np.dtype(dt), seed=0) for dt in dtypes]
    lines = format_table(reports).splitlines()
    rows = lines[:head] if head else lines[:2 + sum(1 + len(r.tensors) for r in reports)]
    return _fenced("\n".join(rows))


def _zoo_failure(bug_name: str) -> str:
    from checks.report import failure_line
    from checks.zoo import BUGS, run_bug
    bug = next(b for b in BUGS if b.name == bug_name)
    result = run_bug(bug)
    shown = next(t for t in result.report.tensors if t.name == bug.tensor)
    return _fenced(failure_line(result.report.layer, result.report.dtype, shown))


def _command_error(argv) -> str:
    """What ``python -m checks ARGV`` prints on stderr (a usage error), with its prompt line."""
    from checks.__main__ import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(list(argv))
    if status != 2:
        raise RuntimeError(f"python -m checks {' '.join(argv)}: expected a usage error "
                           f"(status 2), got status {status}")
    return _fenced(f"$ python -m checks {' '.join(argv)}\n" + err.getvalue().strip())


README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "adding-a-layer.md"

EXAMPLES = [
    Example(README, "table-example", "table",
            lambda: _table("mha-causal", ["float32"], head=5)),
    Example(README, "failure-example", "failure", lambda: _zoo_failure("dQ and dK swapped")),
    Example(GUIDE, "guide-table", "table", lambda: _table("layernorm", ["float64", "float32"])),
    Example(GUIDE, "guide-sizes-error", "exact",
            lambda: _command_error(["--layer", "layernorm", "--sizes", "D=2"])),
    Example(GUIDE, "guide-failure", "failure",
            lambda: _zoo_failure("layer-norm bias gradient averaged, not summed")),
]


def write_all(examples=EXAMPLES, *, log=print) -> None:
    """Recompute every example and write it into its page (``python -m checks docs``)."""
    from checks.docs import write_section
    for ex in examples:
        write_section(ex.path, ex.name, ex.make())
        log(f"wrote {ex.name} into {ex.path.relative_to(ROOT)}")
