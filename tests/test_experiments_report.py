"""python -m experiments all and the command line: every registry entry marked for `all` runs, a
failing one is reported and the others still run, report.html has the summary, the stated tests,
the HTML tables and the charts, with an ordinary file mode; every option has its help text."""
import dataclasses
import os
import stat
import sys
import types

import pytest

import experiments.__main__ as cli
from experiments import common, registry, report


pytestmark = pytest.mark.usefixtures("study_sandbox_with_charts")


def entries(monkeypatch, *specs):
    out = []
    for name, fails in specs:
        module = types.ModuleType(f"fake_{name}", f"{name}: a fake study.\n\nIts protocol, in prose.")
        module.Config, module.run = fake_parts(name, fails)
        monkeypatch.setitem(sys.modules, module.__name__, module)
        out.append(registry.Entry(name, module.__name__))
    return out


def fake_parts(name, fails):
    @dataclasses.dataclass(frozen=True)
    class Config:
        seed: int = 0  # the seed

    def run(config):
        if fails:
            raise RuntimeError(f"{name} broke on purpose")
        fig, (ax,) = common.figure(1)
        ax.plot([1, 2], [3, 4])
        figures = []
        common.save(fig, name, "chart.png", f"the caption of {name}", figures)
        heads = [common.test(f"{name} quantity", 1.25, 0.05, 1.0, "a paper"),
                 common.test(f"{name} matched", 1.02, 0.05, 1.0, "a closed form"),
                 common.bound(f"{name} bounded", 0.25, 1.0, "a theorem", "max ≤ 1"),
                 common.test(f"{name} sampler", 1.0, 0.01, 1.0, "the sampler", kind="identity"),
                 common.shown(f"{name} shown", 2.5, 0.1, "no number", "a note")]
        return common.finish(name, config, 0.0, [{"x": 1}], figures, heads, "summary text",
                             tables=[("per size", [{"n": 3, "value": 0.5}])])
    return Config, run


def test_all_keeps_going_past_a_failure_and_writes_the_page(tmp_path, capsys, monkeypatch):
    found = entries(monkeypatch, ("alpha", False), ("broken", True), ("omega", False))
    assert report.run_all(found) == 1
    path = tmp_path / "report.html"
    page = path.read_text()
    summary = page.split("<h2>Summary")[1].split("<h2 id=")[0]
    # one sentence per headline at the top: 1.25 ± 0.05 against 1 is 5 SE off
    assert "Not reproduced: alpha quantity — measured 1.25 ± 0.05, expected 1" in summary
    assert "Shown: omega shown" in summary and "broken: the study failed" in summary
    assert "Reproduced: alpha matched" in summary
    assert "Consistent: alpha bounded" in summary and "margin limit − measured = 0.75" in page
    assert "Identity holds: alpha sampler" in summary
    # only the Reproduced kind is counted: the page's count is the one computed from the results
    import json
    written = [h for name in ("alpha", "omega")
               for h in json.loads((tmp_path / name / "meta.json").read_text())["headlines"]]
    passed = sum(h["kind"] == "reproduced" and h["agrees"] for h in written)
    total = sum(h["kind"] == "reproduced" for h in written)
    assert (passed, total) == (2, 4)
    assert f"{passed}/{total} reproduced, 2/2 bounds consistent, 2/2 identities hold (not counted), 2 shown" in page
    # the same table in markdown, for docs/studies.md (`python -m experiments docs PATH`)
    table = (tmp_path / report.HEADLINES_MD).read_text()
    assert f"{passed}/{total} reproduced" in table and "(broken failed)" in table
    assert "| alpha | Reproduced | alpha quantity | 1 | 1.25 ± 0.05 | **Not reproduced** |" in table
    assert "| omega | Identity | omega sampler |" in table
    doc = tmp_path / "studies.md"
    doc.write_text("before\n<!-- begin: headlines -->\nSTALE TABLE\n<!-- end: headlines -->\nafter\n")
    assert cli.main(["docs", str(doc)]) == 0
    assert "| alpha | Consistent | alpha bounded |" in doc.read_text() and "STALE TABLE" not in doc.read_text()
    assert "≤ 3.00 × combined SE" in page and "<td>0.5</td>" in page            # rule, HTML table
    assert "<p>Its protocol, in prose.</p>" in page
    assert "the caption of alpha" in page and page.count("data:image/png;base64,") == 2
    assert "broken broke on purpose" in page
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask                  # not 0600
    out = capsys.readouterr().out
    assert "[all 1/3] alpha" in out and "broken FAILED" in out and "1/2 reproduced, 1/1 bounds consistent" in out


def test_every_kind_renders_its_label_and_only_reproduced_ones_count():
    heads = [common.test("a", 1.0, 0.1, 1.0, "s"), common.test("b", 2.0, 0.1, 1.0, "s"),
             common.bound("c", 0.5, 1.0, "s", "r"), common.bound("d", 1.5, 1.0, "s", "r"),
             common.exact("e", 3, 3, "s", kind="identity"), common.exact("f", 3, 4, "s", kind="identity"),
             common.shown("g", 1.0, 0.1, "n", "s")]
    assert [h.label for h in heads] == ["Reproduced", "Not reproduced", "Consistent", "Inconsistent",
                                        "Identity holds", "Identity FAILS", "Shown"]
    table = report.headline_table(heads)
    for name in ("Reproduced", "Consistent", "Identity", "Shown"):
        assert f"<td>{name}</td>" in table                              # the kind column
    assert "margin limit − measured = -0.5, 1.5 of the limit" in heads[3].rule
    assert report.counts(heads).startswith("1/2 reproduced,")
    weak = common.test("w", 5.0, 1.0, 0.0, "s", df=4)          # 5 SE: inside t(4)'s 6.62 only
    assert weak.agrees and "passes only through t with 4 df" in weak.rule
    assert "passes only" not in heads[0].rule
    with pytest.raises(ValueError, match="kind: expected one of"):
        common.test("h", 1.0, 0.1, 1.0, "s", kind="bound")


def test_the_registry_names_every_run_once_and_all_runs_the_studies():
    names = [e.name for e in registry.in_all()]
    assert {"sqrt_d", "attention_scaling", "entropy_collapse", "depth", "rank_collapse",
            "init_scale", "precision", "half_precision", "train", "generate", "schedule",
            "freezing", "warmup"} == set(names)
    assert names.index("train") < names.index("generate")           # generate reads train's checkpoint
    assert len(registry.BY_NAME) == len(registry.ENTRIES)


@pytest.mark.parametrize("entry", registry.ENTRIES, ids=lambda e: e.name)
def test_every_option_has_help_a_default_and_its_choices(entry):
    module = registry.load(entry)
    parser = cli.config_parser(entry.name, module.Config)
    docs = cli.field_docs(module.Config)
    for field in dataclasses.fields(module.Config):
        assert docs.get(field.name), f"{entry.name}.{field.name} has no documentation"
    text = parser.format_help()
    assert text.count("(default:") == len(dataclasses.fields(module.Config))
    for field in dataclasses.fields(module.Config):   # enumerations offer their choices
        if field.name.split("_")[-1] in ("task", "schedule", "dtype", "backend"):
            assert cli.choices_of(module.Config, field.name, field.type), f"{entry.name}.{field.name}"


def test_enumerations_offer_choices_and_switches_read_as_flags(capsys):
    from experiments import train
    parser = cli.config_parser("train", train.Config)
    help_text = parser.format_help()
    assert "{intended,article}" in help_text and "--resume, --no-resume" in help_text
    args = parser.parse_args(["--debug"])
    assert args.debug is True and args.resume is False
    assert cli.main(["train", "--schedule", "cosine"]) == 2
    err = capsys.readouterr().err.strip()
    assert "invalid choice: 'cosine'" in err and "\n" not in err
    assert cli.main(["sqrt_d", "--trials", "many"]) == 2
    assert "invalid integer value: 'many'" in capsys.readouterr().err


def test_the_product_cites_only_itself():
    """No work-item words and no files outside the repository anywhere in the lab's code, tests,
    examples, docs and README (the article's facts are in docs/article.md).  This file names the
    words it looks for, so it is left out."""
    import pathlib
    import re
    root = pathlib.Path(__file__).parents[1]
    files = [path for folder in ("kernels", "reference", "checks", "experiments", "tests", "docs",
                                 "examples", "scripts")
             for path in (root / folder).rglob("*") if path.suffix in (".py", ".md", ".sh")]
    files = [path for path in files if path.name != pathlib.Path(__file__).name] + [root / "README.md"]
    pattern = re.compile(r"SEED_SPEC|DESIGN\.md|\b(issues?|tickets?|trackers?)\b|/work/", re.I)
    found = [f"{path.relative_to(root)}: {line.strip()}" for path in files
             for line in path.read_text().splitlines() if pattern.search(line)]
    assert not found, found


def test_the_docs_headline_table_counts_what_it_lists():
    """docs/studies.md's generated table (python -m experiments docs): its count line is the
    number of Reproduced rows that passed, of all Reproduced rows, as listed below it."""
    import pathlib
    import re
    from checks import docs
    table = docs.section(pathlib.Path(__file__).parents[1] / "docs" / "studies.md", report.DOCS_SECTION)
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| study") and not line.startswith("| ---")]
    assert rows, "the headlines section is empty: run `python -m experiments all` then `docs`"
    kinds = [r[1] for r in rows]
    assert set(kinds) <= {"Reproduced", "Consistent", "Identity", "Shown"}
    passed = sum(k == "Reproduced" and r[-1] == "Reproduced" for k, r in zip(kinds, rows))
    stated = re.search(r"(\d+)/(\d+) reproduced", table.splitlines()[0])
    assert stated and (int(stated[1]), int(stated[2])) == (passed, kinds.count("Reproduced"))
