"""Heat maps of failing tensors (report.plot, python -m checks --plot) and other sizes from the
command line (python -m checks --sizes)."""
import functools

import numpy as np
import pytest

import kernels
from checks.__main__ import main
from checks.plots import _panels
from checks.registry import BY_NAME, run_row


def _one_batch_wrong(dy, cache):
    """rms_norm's backward with dx of batch element 1 doubled: one wrong slice."""
    dx, grads = kernels.rms_norm_backward(dy, cache)
    dx = dx.copy()
    dx[1] *= 2
    return dx, grads


def test_report_plot_writes_one_png_per_failing_tensor(tmp_path):
    """The registry's rms_norm case (as the suite's own row check, so its oracle is compiled
    once) with one batch element wrong: one PNG, a panel per batch element, only one nonzero."""
    import matplotlib.image
    row = BY_NAME["rms_norm"]
    report = run_row(row, np.float64, seed=1, backward=_one_batch_wrong)
    assert report.failing == ["x"]
    paths = report.plot(tmp_path)
    assert [p.name for p in paths] == ["rms_norm.x.float64.png"]
    assert matplotlib.image.imread(paths[0]).shape[0] > 100          # a real image
    x = report.tensors[0]
    assert x.axes == ("batch", "token", "feature")
    rows, cols, panels = _panels(x.difference)                    # a panel per batch element
    assert (rows, cols) == (1, 2) and [index for index, _ in panels] == [(0,), (1,)]
    assert np.abs(panels[0][1]).max() < 1e-12 < 0.1 < np.abs(panels[1][1]).max()  # batch 1 only
    assert run_row(row, np.float64, seed=1).plot(tmp_path / "none") == []


def test_higher_ranks_fold_into_rows_and_columns():
    rows, cols, panels = _panels(np.zeros((2, 3, 4, 5)))
    assert (rows, cols, len(panels)) == (2, 3, 6) and panels[0][1].shape == (4, 5)
    assert _panels(np.arange(4.0))[2][0][1].shape == (1, 4)


def test_cli_plot_writes_the_failing_tensors(tmp_path, monkeypatch, capsys):
    import checks.__main__ as cli

    def halved_bias(dy, cache):
        dx, grads = kernels.linear_backward(dy, cache)
        return dx, {**grads, "b": grads["b"] / 2}
    monkeypatch.setattr(cli, "run_row", functools.partial(run_row, backward=halved_bias))
    assert main(["--layer", "linear", "--dtype", "float64", "--plot", str(tmp_path)]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["linear.b.float64.png"]
    assert "wrote 1 heat map(s)" in capsys.readouterr().err


def test_cli_sizes_reach_the_row(capsys):
    assert main(["--layer", "linear", "--dtype", "float64", "--sizes", "T=1,B=3"]) == 0
    out = capsys.readouterr().out
    assert "linear  float64  x        3x1x8" in out


@pytest.mark.parametrize("layer, sizes, says", [
    ("layernorm", "Q=1", "unknown size 'Q'; the sizes are B, T, S, D, H, F, V"),
    ("layernorm", "T=x", "T: expected an integer, got 'x'"),
    ("layernorm", "T=0", "T: expected a positive integer, got '0'"),
    ("layernorm", "T", "expected NAME=INTEGER pairs"),
    ("layernorm", "D=2", "layernorm needs D >= 4, got D = 2"),
    ("mha", "D=6,H=4", "mha rejects {'D': 6, 'H': 4}: x: width D = 6 is not divisible by H = 4"),
])
def test_cli_bad_sizes_are_one_line_and_status_2(layer, sizes, says, capsys):
    assert main(["--layer", layer, "--sizes", sizes]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err
