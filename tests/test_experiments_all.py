"""python -m experiments all on several processes: the same data.csv as the serial run, a
failing study reported while the others finish, a study that reads another's results started
after it (and not at all when it failed), the longest first, --jobs, and the files' mode."""
import os
import stat

import pytest

import experiments.__main__ as cli
from experiments import checkpoint, generate, registry, report, runner, sqrt_d, train

pytestmark = pytest.mark.usefixtures("study_sandbox")

TINY = {"sqrt_d": sqrt_d.Config(sizes=(3, 16), trials=40, loop_trials=1, dot_lengths=(4, 16),
                                dot_trials=40),
        "train": train.Config(batches=6, batch=8, max_tokens=4, d_model=16, heads=2, ff_mult=1,
                              epochs=1, steps=3),
        "generate": generate.Config(),
        "broken": None}


def tiny_entries():
    """Three real studies at tiny sizes (generate reads train's checkpoint) and one that fails."""
    from tiny_study import Config
    TINY["broken"] = Config(name="broken", fails=True)
    return [registry.BY_NAME["sqrt_d"], registry.Entry("broken", "tiny_study", seconds=50.0),
            registry.BY_NAME["train"], registry.BY_NAME["generate"]]


def files(folder):
    """{relative path: bytes} of the files without timings in them, and the trained parameters
    (the checkpoint also holds the epochs' times)."""
    keep = ("data.csv", "steps.csv", "answers.txt")
    found = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
             if p.name in keep}
    params = checkpoint.load(folder / "train" / "checkpoint.npz").params
    return found | {f"param {k}": v.tobytes() for k, v in params.items()}


@pytest.mark.slow  # starts two worker processes (the slow tier: make test-all, CI)
def test_a_pool_writes_what_the_serial_run_writes(tmp_path, monkeypatch, capsys):
    from experiments import common
    entries, outputs = tiny_entries(), {}
    for jobs in (1, 2):
        folder = tmp_path / f"jobs{jobs}"
        monkeypatch.setattr(common, "RESULTS", folder)
        assert report.run_all(entries, jobs=jobs, configs=TINY) == 1      # broken fails ...
        outputs[jobs] = files(folder)
        out = capsys.readouterr()
        lines = [line for line in out.out.splitlines() if line.startswith("[all ")]
        assert sum(" done in " in line or " FAILED " in line for line in lines) == 4, out.out
        assert "broken broke on purpose" in out.err and "[all] 4 studies in" in out.out
        page = (folder / "report.html").read_text()
        assert [page.index(f"<h2 id='{e.name}'>") for e in entries] == \
            sorted(page.index(f"<h2 id='{e.name}'>") for e in entries)    # the registry's order
    assert set(outputs[1]) >= {"sqrt_d/data.csv", "train/steps.csv", "generate/answers.txt",
                              "param out.W"}
    assert outputs[1] == outputs[2]                                       # ... the others finish
    mask = os.umask(0)
    os.umask(mask)
    for path in ("report.html", "sqrt_d/data.csv", "generate/answers.txt"):  # written by workers too
        assert stat.S_IMODE((tmp_path / "jobs2" / path).stat().st_mode) == 0o666 & ~mask


def test_longest_first_and_after_what_a_study_reads():
    a, b = registry.Entry("a", "m", seconds=5.0), registry.Entry("b", "m", seconds=50.0)
    reader = registry.Entry("reader", "m", seconds=99.0, after=("b",))
    names = {"a", "b", "reader"}
    assert runner.startable([a, b, reader], set(), names) == [b, a]
    assert runner.startable([a, reader], set(), names) == [a]             # b still running
    assert runner.startable([a, reader], {"b"}, names) == [reader, a]
    assert runner.startable([reader], set(), {"reader"}) == [reader]      # b not part of the run


def test_a_study_whose_prerequisite_failed_is_reported_not_run():
    reader = registry.Entry("reader", "m", after=("b",))
    outcome = runner.skipped(reader, {"b"})
    assert outcome.error == "not run: it reads the results of b, which failed"
    assert runner.skipped(reader, {"a"}) is None


def test_prerequisites_in_a_circle_end_in_errors_not_a_hang():
    a, b = registry.Entry("a", "m", after=("b",)), registry.Entry("b", "m", after=("a",))
    outcomes = runner.run([a, b], jobs=2)
    assert [o.error for o in outcomes] == ["not run: its prerequisites wait for each other"] * 2


def test_the_registry_orders_the_pool():
    names = {e.name for e in registry.in_all()}
    for entry in registry.in_all():
        assert entry.seconds > 0 and set(entry.after) <= names, entry
    assert registry.BY_NAME["generate"].after == ("train",)
    entries = registry.in_all()
    assert runner.startable(entries, set(), names)[0].name == "schedule"


def test_jobs_option(capsys):
    assert cli.all_parser().parse_args([]).jobs == runner.default_jobs() >= 1
    assert cli.all_parser().parse_args(["--jobs", "1"]).jobs == 1
    assert "--jobs N" in cli.all_parser().format_help() and "(default:" in cli.all_parser().format_help()
    assert cli.main(["all", "--jobs", "0"]) == 2
    assert "invalid positive_int value: '0'" in capsys.readouterr().err
    assert cli.main(["all", "--trials", "3"]) == 2
    assert "unrecognized arguments: --trials 3" in capsys.readouterr().err
    with pytest.raises(ValueError, match="jobs: expected an integer"):
        runner.run([], jobs=0)
