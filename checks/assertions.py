"""check_layer as an assertion, for a user's own test suite."""
from __future__ import annotations

from checks.engine import check_layer
from checks.report import Report
from checks.verdict import Finding

# findings that follow from an option the caller chose, allowed with it
CHOSEN = {"none": Finding.NO_FINITE_DIFFERENCES, "complex": Finding.COMPLEX_STEP_ON_ORACLE}
# findings on how the checker checked a large program, never on the kernel: always allowed
METHOD = (Finding.FD_JOINT, Finding.FEW_SAMPLES, Finding.KINKS_UNNEEDED)


def assert_layer(forward, backward, oracle, inputs, params, *, allow=(), **options) -> Report:
    """check_layer(forward, backward, oracle, inputs, params, **options) — the same arguments —
    that raises AssertionError, with the report as its message, unless every leg agrees and the
    report has no finding the test does not allow by name (``allow``: names of
    ``checks.verdict.Finding`` members, e.g. ["PROMOTES"]; the finding of a chosen ``fd`` scheme
    is allowed with it).  Returns the report when it passes."""
    names = {f.name for f in Finding}
    unknown = sorted(set(allow) - names)
    if unknown:
        raise ValueError(f"allow: no finding named {', '.join(map(repr, unknown))}; the findings "
                         f"are {', '.join(sorted(names))}")
    report = check_layer(forward, backward, oracle, inputs, params, **options)
    if not report.ok:
        raise AssertionError(f"{report.layer}: the hand gradients disagree "
                             f"({', '.join(report.failing)})\n{report}")
    allowed = set(allow) | {f.name for f in METHOD}
    if options.get("fd") in CHOSEN:
        allowed.add(CHOSEN[options["fd"]].name)
    found = [n.finding.name for n in report.notes if n.finding.name not in allowed]
    if found:
        raise AssertionError(f"{report.layer}: findings the test does not allow "
                             f"({', '.join(dict.fromkeys(found))}; pass allow=[...] to accept "
                             f"them by name)\n{report}")
    return report
