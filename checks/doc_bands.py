"""What the docs' example output may differ in from a fresh run, and what it may not.

The examples (``checks.examples``) were written on one machine. On another CPU, BLAS kernel,
thread count or JAX version the rounding noise in them changes (a float32 relative error of
1.3e-07 becomes 1.1e-07), while what the example tells its reader does not: which rows and
tensors there are, each verdict, the size of a real error, the order of magnitude of the noise.
``differences(kind, documented, fresh)`` lists what a reader would find wrong; an empty list
means the example still holds.

The bands, and why:
- structure (header, layers, dtypes, tensors, shapes, verdicts, diagnosis text): exact; these
  do not depend on rounding.
- rounding-noise columns (hand-autodiff, hand-FD, autodiff-FD): the same order of magnitude,
  within a factor of 10 after flooring both at the dtype's unit roundoff.  Summation order moves
  such noise by a small factor (the same float32 table moved by at most 1.6x between this lab's
  two numerical configurations, ``make test-alt``); a factor of 10 is the first change that
  alters what the table says about the kernel.
- err/tol: on the same side of 1 as the verdict says (ok: at most 1; FAIL: above 1); marked
  "bias" where the aggregate test is what fails.  Its value
  below 1 is noise over a noise estimate and carries no further meaning.
- a failure's "Nx its tolerance" (or "Nx the aggregate test's band"): above 1 in both and
  within a factor of 10 (the tolerance is a rounding spread, whose size is stable to that
  factor); a ratio at most 1 ("within its element tolerance (0.944x)"): at most 1 in both.
- every other number of a failure line (the size of the bug, a named constant): equal to the
  printed precision, one unit in the last printed digit (a float64 error of the bug's size is
  exact to 1e-15; only its printing can round to a neighbouring digit).
- the worst element's location: the same axis names; the indices are not compared, since the
  worst of many near-equal ratios against a rounding-noise tolerance moves between machines.
"""
from __future__ import annotations

import math
import re

from kernels.precision import finfo

NOISE_FACTOR = 10.0
NOISE_COLUMNS = ("hand-autodiff", "hand-FD", "autodiff-FD")
EXACT_COLUMNS = ("layer", "dtype", "tensor", "shape", "verdict")
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def differences(kind: str, documented: str, fresh: str) -> list[str]:
    """What differs beyond the bands, for an example of this kind ("table", "failure",
    "exact"); [] when the documented example still holds."""
    if kind == "exact":
        return [] if documented.strip() == fresh.strip() else \
            [f"the text differs:\n--- documented\n{documented}\n--- now\n{fresh}"]
    doc, new = _body_lines(documented), _body_lines(fresh)
    if kind == "table":
        return _table_differences(doc, new)
    if kind == "failure":
        if len(doc) != len(new):
            return [f"{len(doc)} failure lines documented, {len(new)} now"]
        return [p for a, b in zip(doc, new) for p in _failure_differences(a, b)]
    raise ValueError(f"kind: expected 'table', 'failure' or 'exact', got {kind!r}")


def _body_lines(text: str) -> list[str]:
    return [ln for ln in text.strip().splitlines() if not ln.startswith("```")]


# --- tables --------------------------------------------------------------------------------------

def parse_table(lines: list[str]) -> tuple[list[str], list[dict]]:
    """A table printed by ``checks.report.format_table``: column names and one dict per row, cut
    at the column boundaries of the dashed rule (cells may be empty)."""
    if len(lines) < 2 or not set(lines[1]) <= {"-", " "}:
        raise ValueError("expected a header line and a dashed rule")
    spans = [m.span() for m in re.finditer(r"-+", lines[1])]
    spans[-1] = (spans[-1][0], None)                      # the last column runs to the line's end
    cut = lambda line: [line[a:b].strip() for a, b in spans]
    names = cut(lines[0])
    return names, [dict(zip(names, cut(line))) for line in lines[2:]]


def _table_differences(doc: list[str], new: list[str]) -> list[str]:
    if doc[:1] != new[:1]:
        return [f"the header differs: {doc[:1]} documented, {new[:1]} now"]
    _, rows_doc = parse_table(doc)
    _, rows_new = parse_table(new)
    key = lambda r: tuple(r[c] for c in EXACT_COLUMNS[:3])
    if [key(r) for r in rows_doc] != [key(r) for r in rows_new]:
        return [f"the rows differ: {[key(r) for r in rows_doc]} documented, "
                f"{[key(r) for r in rows_new]} now"]
    problems = []
    for a, b in zip(rows_doc, rows_new):
        where = " ".join(key(a))
        for col in EXACT_COLUMNS[3:]:
            if a[col] != b[col]:
                problems.append(f"{where}: {col} {a[col]!r} documented, {b[col]!r} now")
        floor = finfo(a["dtype"]).eps / 2 if a["dtype"] else 0.0
        for col in NOISE_COLUMNS:
            if (a[col] == "") != (b[col] == ""):
                problems.append(f"{where}: {col} {a[col]!r} documented, {b[col]!r} now")
            elif a[col] and not same_magnitude(float(a[col]), float(b[col]), floor):
                problems.append(f"{where}: {col} {a[col]} documented, {b[col]} now (more than "
                                f"{NOISE_FACTOR:g}x apart)")
        ok = a["verdict"] == "ok"
        for text in (a["err/tol"], b["err/tol"]):
            if (float(text.split()[0]) <= 1.0) != ok:  # "7.99 bias": the aggregate test's
                problems.append(f"{where}: err/tol {text} is on the wrong side of 1 for the "
                                f"verdict {a['verdict']!r}")
    return problems


def same_magnitude(a: float, b: float, floor: float = 0.0) -> bool:
    """Within NOISE_FACTOR of each other, both floored at `floor` (0 allowed when floor > 0)."""
    a, b = max(a, floor), max(b, floor)
    if a <= 0 or b <= 0:
        return a == b
    return abs(math.log10(a / b)) <= math.log10(NOISE_FACTOR)


# --- failure lines -------------------------------------------------------------------------------

def _split_failure(line: str) -> tuple[str, str | None]:
    text, sep, location = line.partition("; worst at ")
    return text, (location if sep else None)


def _failure_differences(doc: str, new: str) -> list[str]:
    (text_a, loc_a), (text_b, loc_b) = _split_failure(doc), _split_failure(new)
    problems = []
    words = lambda t: NUMBER.sub("#", t)
    if words(text_a) != words(text_b):
        problems.append(f"the failure line's words differ:\n  documented: {doc}\n  now:        {new}")
        return problems
    for ma, mb in zip(NUMBER.finditer(text_a), NUMBER.finditer(text_b)):
        a, b = float(ma.group()), float(mb.group())
        if text_a[ma.end():].startswith("x"):  # a ratio to a tolerance or a band
            if a > 1 and not (b > 1 and same_magnitude(a, b)) or a <= 1 < b:
                problems.append(f"'{ma.group()}x' documented, '{mb.group()}x' now "
                                f"({text_a[ma.end():][:24]}...)")
        elif abs(a - b) > _last_digit(ma.group()) * (1 + 1e-9):
            problems.append(f"{ma.group()} documented, {mb.group()} now (beyond its printed "
                            f"precision)")
    axes = lambda loc: None if loc is None else re.sub(r"\d+", "#", loc)
    if axes(loc_a) != axes(loc_b):
        problems.append(f"the location names other axes: {loc_a!r} documented, {loc_b!r} now")
    return problems


def _last_digit(printed: str) -> float:
    """One unit in the last printed digit of a number as printed (1.6e+00 -> 0.1)."""
    mantissa, _, exponent = printed.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)
