"""The zoo's foreign section: bugs in layers the lab has never seen, caught and explained."""
import numpy as np
import pytest

from checks import __main__ as cli
from checks.registry import BY_NAME
from checks.verdict import Kind
from checks.zoo import Bug, counts, run_zoo
from checks.zoo_foreign import BUGS, GELU, LAYERS, gelu_backward


@pytest.mark.slow  # compiles the oracles of the four foreign layers; `python -m checks zoo` runs them
def test_foreign_layers_are_right_with_their_own_backward_and_unknown_to_the_lab():
    taken = sorted({layer.name for layer in LAYERS} & set(BY_NAME))
    assert not taken, (f"registry row names {taken} are the foreign zoo's layers "
                       f"(checks/zoo_foreign.py), which must stay unknown to the lab: rename "
                       f"the rows (docs/adding-a-layer.md)")
    for layer in LAYERS:
        report = layer.check(np.float64)
        assert report.ok, "\n" + str(report)


@pytest.mark.slow  # 18 bugs, most explained by a search of the oracle's paths
def test_foreign_section_is_caught_and_mostly_explained():
    assert len({b.row.name.split("-")[0] for b in BUGS}) >= 3 and len(BUGS) >= 15
    results = run_zoo(np.float64, bugs=BUGS)
    for r in results:
        assert r.caught and r.bug.tensor in r.failing, (r.bug.name, r.failing)
        verdict = next(t.verdict for t in r.report.tensors if t.name == r.bug.tensor)
        assert verdict.kind in (Kind.HAND_WRONG, Kind.MISSHAPEN), (r.bug.name, verdict)
    caught, explained, total = counts(results)
    missed = [(r.bug.name, r.diagnosis) for r in results if r.bug.pattern and not r.named]
    assert caught == total and explained >= 0.8 * total, missed
    assert not missed, missed  # every expected explanation is the one the checker gives


def test_zoo_command_fails_when_a_bug_is_not_caught(monkeypatch, capsys):
    """A "bug" that is the right backward passes its check: the command must say so and fail."""
    planted = Bug("not a bug: the right backward", GELU, gelu_backward, "x", "")
    monkeypatch.setattr("checks.zoo.sections", lambda: [("planted", [planted])])
    assert cli.main(["zoo"]) == 1
    assert "0 of 1 bugs caught; 0 of 1 explained" in capsys.readouterr().out
