"""A new registry row breaks no existing test: generated tables take its rows one run at a time,
and --sizes takes the size names a row declares (the guide's whole path: test_newcomer_path)."""
from checks import __main__ as cli, docs
from checks.registry import BY_NAME, Row

TABLE = """```
$ python -m checks calibrate --write-docs
layer  | dtype   | checks | worst
-------|---------|--------|------
linear | float64 | 200    | 0.100
ff     | float64 | 200    | 0.080

case          | dtype   | rows | checks
random shapes | float64 | 2    | 400

400 checks, 0 false alarms; worst fraction of tolerance 0.100
```"""


def _page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"intro\n<!-- begin: calibration -->\n{TABLE}\n<!-- end: calibration -->\n")
    return page


def test_a_run_over_one_row_merges_into_the_table(tmp_path):
    page = _page(tmp_path)
    body = "layer | dtype   | checks | worst\ngqa   | float64 | 200    | 0.300\n\n" \
           "200 checks, 0 false alarms; worst fraction of tolerance 0.300"
    docs.write_run(page, "calibration", "python -m checks calibrate --layer gqa --write-docs",
                   body, ["gqa"])
    text = docs.section(page, "calibration")
    assert {("linear", "float64"), ("ff", "float64"), ("gqa", "float64")} <= \
        docs.rows_in_section(page, "calibration")
    assert text.count("$ python -m checks") == 2 and text.index("--layer gqa") > text.index("0.100")
    # the row rerun with a change: its line moves, the older run keeps the other rows
    docs.write_run(page, "calibration", "python -m checks calibrate --layer ff --write-docs",
                   body.replace("gqa  ", "ff   ").replace("0.300", "0.090"), ["ff"])
    text = docs.section(page, "calibration")
    assert text.count("\nff ") == 1 and "ff    | float64 | 200    | 0.090" in text
    assert "linear | float64" in text and "gqa   | float64" in text
    # rerunning exactly gqa's rows replaces gqa's run instead of stacking a second one
    docs.write_run(page, "calibration", "python -m checks calibrate --layer gqa --write-docs",
                   body, ["gqa"])
    assert docs.section(page, "calibration").count("--layer gqa") == 1
    # a run over every row replaces them all
    docs.write_run(page, "calibration", "python -m checks calibrate --write-docs", TABLE.strip(
        "`\n").split("\n", 1)[1], None)
    assert docs.section(page, "calibration").count("$ python -m checks") == 1


def _usage_error(argv, capsys):
    assert cli.main(argv) == 2
    return capsys.readouterr().err.strip()


def test_every_size_given_is_honoured_or_rejected_in_one_line(capsys):
    assert _usage_error(["--layer", "model", "--sizes", "D=16,F=32"], capsys) == (
        "python -m checks: error: --sizes: model sets D itself (D = 6); it takes B, T")
    assert _usage_error(["--layer", "linear", "--sizes", "S=7"], capsys) == (
        "python -m checks: error: --sizes: linear does not use S; it takes B, T, D, V")
    assert "unknown size 'G'" in _usage_error(["--layer", "linear", "--sizes", "G=2"], capsys)


def test_a_size_a_row_declares_is_accepted(monkeypatch, capsys):
    base = BY_NAME["linear"]
    grouped = Row("linear-g", base.forward, base.backward, base.oracle,
                  lambda rng, dt, s: base.make(rng, dt, {**s, "V": 3 * s["G"]}), sizes={"G": 2},
                  axes=base.axes)
    monkeypatch.setattr(cli, "ROWS", [*cli.ROWS, grouped])
    monkeypatch.setattr(cli, "BY_NAME", {**cli.BY_NAME, "linear-g": grouped})
    assert cli.main(["--layer", "linear-g", "--sizes", "G=3", "--dtype", "float64"]) == 0
    assert "linear-g  float64  W        8x9" in capsys.readouterr().out   # V = 3 G = 9
    assert "linear does not use G" in _usage_error(["--layer", "linear", "--sizes", "G=3"], capsys)
