"""An accuracy grade per row and dtype: the hand kernel's error next to autodiff's in the same
precision.

A check says whether a hand gradient is right within the rounding model; a kernel can pass and
still be much less accurate than it could be (a sum taken in a poor order, a value cancelled
where a cached one would do).  The grade measures that against a peer: for each row and dtype,
on the same inputs rounded to the dtype and the same upstream gradient,

    hand error   the hand backward (in the dtype) against the oracle's float64 autodiff
    XLA error    the oracle's autodiff compiled by XLA in the dtype, against the same float64

each the relative 2-norm error ||g - g64|| / ||g64|| of one gradient tensor, combined over a
row's tensors as a root mean square and over SEEDS cases likewise.  The grade is hand / XLA:
"mha float32: 1.3x autodiff's float32 error".  Errors below FLOOR x u (the dtype's unit
roundoff) count as FLOOR x u, so two exact results grade 1x, not 0/0.

    python -m checks grade [--layer NAME ...] [--dtype float32 ...] [--seeds 3] [--json]
                           [--write-docs]
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys

import numpy as np

from checks import tolerances
from checks.legs import Oracle
from kernels.backend import to_numpy

SEEDS = 3
FLOOR = 0.01   # errors below 1 % of a unit roundoff are exact for grading
GRADE_STREAM = 0x67726164  # mixed into the seed of dout (apart from the inputs' stream)
DOCS_FILE, DOCS_SECTION = "grade.md", "grade"


@dataclasses.dataclass
class Grade:
    layer: str
    dtype: str
    hand: float        # RMS over tensors and seeds of the hand's relative error
    xla: float         # the same for the oracle's autodiff in the dtype
    worst: str         # the tensor whose hand / XLA ratio is largest
    worst_ratio: float
    tensors: dict      # name -> (hand error, XLA error), RMS over seeds
    error: str = ""    # what the hand kernel raised, where it did (no grade then)

    @property
    def ratio(self) -> float:
        return self.hand / self.xla if not self.error else math.nan

    def sentence(self) -> str:
        return f"{self.layer} {self.dtype}: {self.ratio:.2g}x autodiff's {self.dtype} error"


def _rel(g, g64) -> float:
    g64 = np.asarray(g64, dtype=np.float64)
    norm = float(np.linalg.norm(g64))
    err = float(np.linalg.norm(np.asarray(to_numpy(g), dtype=np.float64) - g64))
    return err / norm if norm else (0.0 if err == 0 else math.inf)


def _named(dinputs, dparams, names, diff_idx):
    """name -> gradient, from a backward's (dinputs, dparams) or the oracle's ({index: dx},
    dparams)."""
    dinputs = dinputs if isinstance(dinputs, (tuple, list, dict)) else (dinputs,)
    out = {names[i]: dinputs[i] for i in diff_idx}
    out.update(dparams)
    return out


def errors(row, dtype, seed, sizes=None, backward=None) -> dict:
    """name -> (hand error, XLA error) of one case of a row in one dtype."""
    dtype = np.dtype(dtype)
    inputs, params, static = row.case(np.random.default_rng(seed), dtype, sizes)
    names = list(row.input_names)
    diff_idx = [i for i, x in enumerate(inputs)
                if tolerances.is_float(np.asarray(x).dtype) and i not in row.nondiff]
    f64 = lambda a: np.asarray(a).astype(np.float64)
    inputs64 = [f64(x) if i in diff_idx or tolerances.is_float(np.asarray(x).dtype) else x
                for i, x in enumerate(inputs)]
    params64 = {k: f64(v) for k, v in params.items()}
    exact = Oracle(row.oracle, inputs64, params64, static, diff_idx)
    rng = np.random.default_rng([seed, GRADE_STREAM])
    dout = rng.standard_normal(exact.out_shape()).astype(dtype)
    _, g64_in, g64_params = exact.vjp(f64(dout))
    g64 = _named(g64_in, g64_params, names, diff_idx)
    low = Oracle(row.oracle, inputs, params, static, diff_idx)
    _, gx_in, gx_params = low.vjp(dout)
    gx = _named(gx_in, gx_params, names, diff_idx)
    try:
        _, cache = row.forward(*inputs, params, **static)
        dinputs, dparams = (backward or row.backward)(dout, cache)
        gh = _named(dinputs, dparams, names, diff_idx)
    except Exception as exc:  # noqa: BLE001  (a broken kernel is a row of the table)
        raise HandRaised(f"the hand kernel raised {type(exc).__name__}: {exc}") from None
    return {k: (_rel(gh[k], g64[k]), _rel(gx[k], g64[k])) for k in g64}


class HandRaised(Exception):
    """The hand forward or backward raised: the row has no grade."""


def grade(row, dtype, seeds=SEEDS, sizes=None, backward=None) -> Grade:
    """The grade of one row in one dtype over ``seeds`` cases (a kernel that raises: a Grade
    with its error and no numbers)."""
    floor = FLOOR * tolerances.unit_roundoff(np.dtype(dtype))
    try:
        per_seed = [errors(row, dtype, seed, sizes, backward) for seed in range(seeds)]
    except HandRaised as exc:
        return Grade(row.name, str(np.dtype(dtype)), math.nan, math.nan, "", math.nan, {},
                     str(exc))
    rms = lambda xs: math.sqrt(sum(x * x for x in xs) / len(xs))
    tensors = {k: tuple(max(rms([e[k][i] for e in per_seed]), floor) for i in (0, 1))
               for k in per_seed[0]}
    hand = max(rms([h for h, _ in tensors.values()]), floor)
    xla = max(rms([x for _, x in tensors.values()]), floor)
    worst = max(tensors, key=lambda k: tensors[k][0] / tensors[k][1])
    return Grade(row.name, str(np.dtype(dtype)), hand, xla, worst,
                 tensors[worst][0] / tensors[worst][1], tensors)


def grade_all(rows, dtypes, seeds=SEEDS, sizes=None, progress=True) -> list:
    """The grade of every row in every dtype, in that order."""
    from checks.parallel import map_tasks
    pairs = [(row, dtype) for row in rows for dtype in dtypes]
    return map_tasks(lambda pair: grade(*pair, seeds, sizes), pairs, desc="grade",
                     progress=progress)


def _error(value, dtype) -> str:
    """An error as printed: 'exact' at the floor (below 1 % of a unit roundoff)."""
    floor = FLOOR * tolerances.unit_roundoff(np.dtype(dtype))
    return "exact" if value <= floor * (1 + 1e-9) else f"{value:.2g}"


def format_grades(grades) -> str:
    head = ["layer", "dtype", "hand error", "XLA error", "grade (hand / XLA)", "worst tensor"]
    body = [[g.layer, g.dtype, _error(g.hand, g.dtype), _error(g.xla, g.dtype),
             f"{g.ratio:.2g}x", f"{g.worst} {g.worst_ratio:.2g}x"] if not g.error else
            [g.layer, g.dtype, "-", "-", "no grade", g.error.splitlines()[0]] for g in grades]
    widths = [max(len(r[i]) for r in body + [head]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    return "\n".join([line(head), "| " + " | ".join("-" * w for w in widths) + " |"]
                     + [line(r) for r in body])


def summary(grades) -> str:
    """Per dtype: the range of the grades and the row graded worst."""
    lines = []
    for g in grades:
        if g.error:
            lines.append(f"{g.layer} {g.dtype}: no grade: {g.error.splitlines()[0]}")
    for dtype in dict.fromkeys(g.dtype for g in grades if not g.error):
        of = [g for g in grades if g.dtype == dtype and not g.error]
        worst = max(of, key=lambda g: g.ratio)
        lines.append(f"{dtype}: grades {min(g.ratio for g in of):.2g}x to {worst.ratio:.2g}x "
                     f"over {len(of)} rows; worst {worst.sentence()}")
    return "\n".join(lines)


def grades_to_json(grades) -> str:
    return json.dumps([{**dataclasses.asdict(g), "ratio": g.ratio, "sentence": g.sentence()}
                       for g in grades], indent=2)


# --- the command ------------------------------------------------------------------------------

def cli(parser_class):
    """(parser, run) of ``python -m checks grade`` for checks/__main__.py."""
    from checks.registry import BY_NAME
    from kernels.precision import FORMATS

    def layer(name):
        import argparse
        if name not in BY_NAME:
            raise argparse.ArgumentTypeError(f"unknown layer {name!r}; known: "
                                             f"{', '.join(BY_NAME)}")
        return BY_NAME[name]
    p = parser_class(prog="python -m checks grade",
                     description="accuracy grade: each hand kernel's error against the float64 "
                                 "oracle next to XLA's autodiff error in the same dtype")
    p.add_argument("--layer", action="append", type=layer, help="only this layer (repeatable)")
    p.add_argument("--dtype", action="append", choices=[f for f in FORMATS if f != "float64"],
                   help="a format to grade (repeatable; default float32, float16, bfloat16)")
    p.add_argument("--seeds", type=int, default=SEEDS, help="cases per row and dtype")
    p.add_argument("--json", action="store_true", help="print the grades as JSON")
    p.add_argument("--write-docs", action="store_true",
                   help=f"write the table into docs/{DOCS_FILE}")
    return p, command


def command(args) -> int:
    from checks.registry import ROWS
    if args.seeds < 1:
        print(f"python -m checks grade: error: --seeds: expected a positive integer, got "
              f"{args.seeds}", file=sys.stderr)
        return 2
    rows = args.layer or ROWS
    dtypes = args.dtype or ["float32", "float16", "bfloat16"]
    grades = grade_all(rows, dtypes, args.seeds)
    print(grades_to_json(grades) if args.json else format_grades(grades) + "\n\n"
          + summary(grades))
    if args.write_docs:
        from checks.docs import DOCS, write_section
        write_section(DOCS / DOCS_FILE, DOCS_SECTION, "\n".join(
            [f"`$ python -m checks {args.command_line}`", "", format_grades(grades), "", "```",
             summary(grades), "```"]))
        print(f"wrote the table into {DOCS / DOCS_FILE}")
    return 1 if any(g.error for g in grades) else 0
