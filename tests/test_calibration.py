"""Calibration: the docs' tables are the command's output and say 0 false alarms; a small slice
of the same calibration reruns here; a false alarm is counted, never hidden."""
import re

import numpy as np
import pytest

from checks import docs
from checks.calibrate import (ALL_CASES, Margin, calibrate, calibrate_one, format_cases,
                              format_margins, shape_pool, summary)
from checks.registry import BY_NAME, run_row
from checks.sensitivity import KNOWN_GAPS


# the generated tables: (file, formats, least seeds per row x format of the random-shapes case)
DOC_TABLES = [("tolerances.md", ("float64", "float32"), 200),
              ("half-precision.md", ("float16", "bfloat16"), 50)]


def _generated(doc, name, command, formats, line):
    """A generated section of docs/: the command's output, with a line matching
    ``line.format(row=..., dtype=...)`` for every registry row and format; a row without one is
    named with the command that writes it (its rows merge into the table already there)."""
    text = docs.section(docs.DOCS / doc, name)
    assert text.startswith(f"```\n$ python -m checks {command}")
    missing = [(row, dtype) for row in BY_NAME for dtype in formats
               if not re.search(line.format(row=re.escape(row), dtype=dtype), text, re.M)]
    rows = sorted({row for row, _ in missing})
    assert not missing, (
        f"docs/{doc} has no generated '{name}' entry for " + ", ".join(
            f"{r} {d}" for r, d in missing) + "; write every generated entry of these rows "
        "(calibration and sensitivity, the four formats) with: python -m checks docs"
        + "".join(f" --layer {r}" for r in rows))
    return text


@pytest.mark.parametrize("doc,formats,least_seeds", DOC_TABLES, ids=[d for d, _, _ in DOC_TABLES])
def test_docs_tables_are_the_commands_output_and_report_no_false_alarm(doc, formats, least_seeds):
    # every row of the registry, every format, in the random-shapes table
    text = _generated(doc, "calibration", "calibrate", formats, r"^{row}\s+\| {dtype}")
    # every edge and ill-conditioned case (the large size runs in the sensitivity table)
    assert all(case in text for case in ALL_CASES if case != "large (bench)")
    seeds = [int(n) for n in re.findall(r"^\S+\s+\| b?float\d\d\s+\| (\d+)", text, re.M)]
    assert seeds and min(seeds) >= least_seeds
    runs = re.findall(r"(\d+) checks, (\d+) false alarms; worst fraction of tolerance ([\d.]+)",
                      text)                                  # one summary per run merged in
    assert runs and all(int(alarms) == 0 and float(worst) < 1 for _, alarms, worst in runs)


@pytest.mark.parametrize("doc,formats,_", DOC_TABLES, ids=[d for d, _, _ in DOC_TABLES])
def test_docs_sensitivity_tables_are_the_commands_output_and_meet_every_goal(doc, formats, _):
    for pattern in ("tensor", "slice", "element"):
        text = _generated(doc, "sensitivity", "sensitivity", formats,
                          r"^{row}\s+\| {dtype}\s+\| registry\s+\| " + pattern)
    # one summary per run merged in; a goal missed only where checks.sensitivity names the gap
    runs = re.findall(r"(\d+) of (\d+) goals met(?:; missed: (.*))?", text)
    assert runs and all(int(goals) > 0 for _, goals, _ in runs)
    for met, goals, missed in runs:
        names = [m.strip() for m in missed.split(",")] if missed else []
        assert int(goals) - int(met) == len(names)
        assert all(n.endswith("(known)") for n in names), missed
    for line in text.splitlines():
        if "| NO  |" in line:
            assert tuple(c.strip() for c in line.split("|")[:4]) in KNOWN_GAPS, line


@pytest.mark.slow  # one compile per edge shape
def test_a_small_slice_of_the_calibration_reruns_without_false_alarms():
    """Two seeds of three rows, one edge shape and every ill-conditioned case that applies."""
    cases = ("random shapes", "T = 1", "dominant class", "logits beyond 60", "near-constant rows",
             "near-cancelling sums")
    margins = calibrate(["linear", "softmax", "rms_norm"], ["float64", "float32"], 2,
                        cases=cases, edge_seeds=1, ill_seeds=1, large_seeds=0, progress=False)
    assert {m.case for m in margins} >= {"random shapes", "T = 1", "dominant class",
                                         "logits beyond 60", "near-constant rows",
                                         "near-cancelling sums"}
    assert all(m.false_alarms == 0 and 0 < m.worst < 1 for m in margins), format_cases(margins)
    assert "0 false alarms" in summary(margins)


def test_a_quick_calibration_of_one_row_has_no_false_alarm():
    """Three seeds of the linear row at three shapes, both dtypes (the fast tier's calibration)."""
    pool = shape_pool(0)[:3]
    margins = [calibrate_one("linear", dt, 3, pool) for dt in ("float64", "float32")]
    assert all(m.checks == 3 and m.false_alarms == 0 for m in margins)
    assert all(0 < m.worst < 1 for m in margins)
    assert "linear" in format_margins(margins)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_false_alarm_is_counted(dtype):
    bad = run_row(BY_NAME["linear"], np.dtype(dtype), seed=0,
                  backward=lambda dy, c: (lambda dx, g: (dx, {**g, "b": 2 * g["b"]}))(
                      *BY_NAME["linear"].backward(dy, c)))
    margin = Margin("linear", dtype).add(bad, "seed 0")
    assert margin.false_alarms == 1 and margin.worst > 1 and "seed 0" in margin.first_alarm


@pytest.mark.slow  # five checks, a recurrence and attention among them
def test_a_slice_of_the_wild_calibration_judges_correct_kernels_ok_and_bugs_the_hands():
    """`python -m checks calibrate --wild` in miniature: user-style cases at the registry's
    sizes, a correct kernel and one planted bug each."""
    from checks.calibrate_wild import Task, confusion, run_task, summary
    tasks = [Task("ff", "float32", "registry", 0), Task("ff", "float32", "registry", 0,
                                                        "negated", "W1"),
             Task("mha -inf mask", "bfloat16", "registry", 1),
             Task("rnn (lax.scan)", "float32", "registry", 2, "row x1.05", "U"),
             Task("article's loss", "float64", "registry", 0),
             Task("plain layernorm", "bfloat16", "registry", 0),
             Task("plain layernorm", "bfloat16", "registry", 0, "x1.5", "g")]
    results = [run_task(t) for t in tasks]
    assert [o for _, o in results] == ["ok", "hand", "ok", "hand", "noted", "ok", "hand"], results
    assert "7 checks: 4 correct kernels, 0 false" in summary(results)
    assert confusion(results).splitlines()[0].split()[:3] == ["case", "dtype", "correct"]


def test_a_bias_outside_its_band_is_a_false_alarm_counted_in_the_bias_column():
    """dW off by 1 + 7e-7 (12 u of float32): inside every element's tolerance (0.6 of it at
    seed 0), outside the aggregate test's band (2.2 times it); the calibration counts it and
    its bias column shows it."""
    scaled = lambda dy, c: (lambda dx, g: (dx, {**g, "W": (g["W"].astype(np.float64)
                                                            * (1 + 7e-7)).astype(g["W"].dtype)}))(
        *BY_NAME["linear"].backward(dy, c))
    bad = run_row(BY_NAME["linear"], np.dtype("float32"), seed=0, backward=scaled)
    W = next(t for t in bad.tensors if t.name == "W")
    assert W.score <= 1 < W.bias_score
    margin = Margin("linear", "float32").add(bad, "seed 0")
    assert margin.false_alarms == 1 and margin.bias == W.bias_score and margin.worst > 1
    assert "bias" in format_margins([margin]).splitlines()[0]


def test_a_fraction_below_one_never_reads_as_one():
    """The tables print fractions of tolerance to 3 decimals, but a bound a correct kernel
    attains (0.9997 of it, ties of the format's rounding) keeps the digits that show it is
    below 1: the tables' "worst < 1" is then what the checks measured."""
    from checks.calibrate import fraction
    assert fraction(0.4567) == "0.457" and fraction(1.02) == "1.020"
    assert fraction(0.99973) == "0.9997" and float(fraction(0.99999994)) < 1
