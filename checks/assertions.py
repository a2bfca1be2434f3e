"""check_layer as an assertion, for a user's own test suite."""
from __future__ import annotations

from checks.engine import check_layer
from checks.report import Report


def assert_layer(forward, backward, oracle, inputs, params, **options) -> Report:
    """check_layer(forward, backward, oracle, inputs, params, **options) — the same arguments —
    that raises AssertionError, with the report as its message, unless every leg agrees.
    Returns the report when it passes."""
    report = check_layer(forward, backward, oracle, inputs, params, **options)
    if not report.ok:
        raise AssertionError(f"{report.layer}: the hand gradients disagree "
                             f"({', '.join(report.failing)})\n{report}")
    return report
