"""python -m experiments all: every discovered study that takes part runs, a failing one is
reported and the others still run, and report.html embeds the charts and the headline tables."""
import dataclasses
import types

import pytest

import experiments.__main__ as cli
from experiments import report, studykit as kit


pytestmark = pytest.mark.usefixtures("study_sandbox_with_charts")


def fake_study(name, *, fails=False, in_all=True):
    @dataclasses.dataclass(frozen=True)
    class Config:
        seed: int = 0

    def run(config):
        if fails:
            raise RuntimeError(f"{name} broke on purpose")
        fig, (ax,) = kit.figure(1)
        ax.plot([1, 2], [3, 4])
        figures = []
        kit.save(fig, name, "chart.png", f"the caption of {name}", figures)
        heads = [kit.headline(f"{name} quantity", 1.25, 1.0, "a paper", False)]
        result = kit.finish(name, config, 0.0, [{"x": 1}], figures, heads, "summary text")
        result.headlines.append({"quantity": f"{name} as a dict", "measured": 2.5, "expected": "> 2",
                                 "source": "a plain dict", "agrees": True})  # another study's style
        return result

    module = types.ModuleType(f"experiments.{name}", f"{name}: a fake study.")
    module.NAME, module.Config, module.run, module.IN_ALL = name, Config, run, in_all
    return module


def test_all_keeps_going_past_a_failure_and_writes_the_page(tmp_path, capsys):
    found = {m.NAME: m for m in (fake_study("alpha"), fake_study("broken", fails=True),
                                 fake_study("skipped", in_all=False), fake_study("omega"))}
    assert report.run_all(found, []) == 1
    page = (tmp_path / "report.html").read_text()
    assert "alpha quantity" in page and "omega quantity" in page and "1.25" in page
    assert "alpha as a dict" in page and "&gt; 2" in page
    assert "the caption of alpha" in page and page.count("data:image/png;base64,") == 2
    assert "broken broke on purpose" in page and "skipped" not in page
    out = capsys.readouterr().out
    assert "[all 1/3] alpha" in out and "broken FAILED" in out and "[all 3/3] omega" in out


def test_all_takes_no_options():
    with pytest.raises(ValueError, match="all: expected no options"):
        report.run_all({}, ["--trials", "3"])


def test_every_discovered_study_takes_part():
    found = cli.studies()
    names = [m.NAME for m in report.selected(found)]
    assert {"sqrt_d", "attention_scaling", "depth", "init_scale", "precision"} <= set(names)
    opted_out = {name for name, m in found.items() if getattr(m, "IN_ALL", True) is False}
    assert not opted_out & set(names) and set(names) | opted_out == set(found)
