"""The accuracy grade (checks/grade.py): a correct kernel grades near autodiff's own error in
the same dtype, a less accurate one worse."""
import json

import numpy as np

import kernels
from checks import grade
from checks.__main__ import main
from checks.registry import BY_NAME

# Two correct float32 implementations of the same maths differ only in the order of their
# roundings: their errors against float64 agree within a small factor (0.7-1.3x measured at
# the registry's sizes), so a correct kernel lies within 0.1-10x; a float16 accumulation is
# about 2^13 times coarser than float32's and lies far outside.
BAND = (0.1, 10.0)


def _half_sum_linear_backward(dy, cache):
    """linear's backward with dW accumulated in float16 (rounded back to float32)."""
    dx, grads = kernels.linear_backward(dy, cache)
    x2 = cache.x.reshape(-1, cache.W.shape[0])                       # (M, N_in)
    dy2 = dy.reshape(-1, cache.W.shape[1])                           # (M, N_out)
    dW = (x2.T.astype(np.float16) @ dy2.astype(np.float16)).astype(dy.dtype)
    return dx, {**grads, "W": dW}


def test_a_correct_float32_kernel_grades_near_autodiff():
    g = grade.grade(BY_NAME["linear"], np.float32, seeds=2)
    assert BAND[0] <= g.ratio <= BAND[1], g
    # both errors are float32 rounding: a few units of roundoff, relative to the gradient
    u = np.finfo(np.float32).eps / 2
    assert u / 10 < g.hand < 100 * u and u / 10 < g.xla < 100 * u
    assert g.sentence().startswith("linear float32: ") and "autodiff's float32 error" in \
        g.sentence()


def test_a_less_accurate_kernel_grades_worse():
    good = grade.grade(BY_NAME["linear"], np.float32, seeds=2)
    bad = grade.grade(BY_NAME["linear"], np.float32, seeds=2, backward=_half_sum_linear_backward)
    assert bad.ratio > BAND[1] and bad.ratio > 10 * good.ratio
    assert bad.worst == "W" and bad.worst_ratio > BAND[1]
    # the tensors the kernel computes as before keep their grade
    assert BAND[0] <= bad.tensors["x"][0] / bad.tensors["x"][1] <= BAND[1]


def test_the_command_prints_json(capsys):
    assert main(["grade", "--layer", "linear", "--dtype", "float32", "--seeds", "1",
                 "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)
    assert entry["layer"] == "linear" and entry["dtype"] == "float32"
    assert entry["ratio"] == entry["hand"] / entry["xla"]


def test_docs_grade_table_is_recomputed_for_one_row():
    """docs/grade.md's linear float32 row (the command's output), recomputed: errors and grade
    within 2x (another BLAS sums in another order; rounding errors of that size move by such
    factors, never by the 10x that makes a finding)."""
    from checks import docs
    from tests.test_mutate import markdown_table
    text = docs.section(docs.DOCS / grade.DOCS_FILE, grade.DOCS_SECTION)
    rows = [line for line in text.splitlines() if line.startswith("| linear ")
            and "| float32 " in line]
    cells = [c.strip() for c in rows[0].strip().strip("|").split("|")]
    hand, xla, ratio = float(cells[2]), float(cells[3]), float(cells[4].rstrip("x"))
    g = grade.grade(BY_NAME["linear"], np.float32)
    for documented, now in ((hand, g.hand), (xla, g.xla), (ratio, g.ratio)):
        assert 0.5 <= now / documented <= 2.0, (cells, g)
    assert markdown_table(text, "layer")  # the section holds the table


def _raising(dy, cache):
    raise RuntimeError("not written yet")


def test_a_kernel_that_raises_is_a_row_without_a_grade_not_a_traceback():
    g = grade.grade(BY_NAME["linear"], "float32", seeds=1, backward=_raising)
    assert g.error == "the hand kernel raised RuntimeError: not written yet"
    table, summary = grade.format_grades([g]), grade.summary([g])
    assert "no grade" in table and "RuntimeError: not written yet" in table
    assert summary == "linear float32: no grade: the hand kernel raised RuntimeError: not written yet"


def test_sensitivity_of_a_check_whose_backward_raises_is_a_failed_baseline():
    """The check stops where the backward raises: its report is the one run returned, and
    every pattern is reported as a correct kernel that failed, not an AttributeError."""
    from checks import sensitivity
    from checks.registry import layer_check
    check = layer_check(BY_NAME["linear"], np.float64, backward=_raising)
    report = check.run()
    assert report.error_in == "backward" and check.report() is report
    measured = sensitivity.measure(check)
    assert measured and all(not m.baseline_ok and m.eps == float("inf") for m in measured)
