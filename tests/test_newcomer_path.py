"""The guide's path, followed end to end in a copy of the lab (docs/adding-a-layer.md): a small
layer with a size name of its own (G, groups of features sharing a gain), its kernel pair, its
oracle, one registry row, its generated docs entries written by one command, and the suite
green with it.  Slow tier: it runs the row's calibration and sensitivity like a newcomer would."""
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

KERNEL = '''
"""Grouped scale: the D features in G groups, each group sharing one gain."""
from typing import NamedTuple

from kernels.backend import check_float, check_params
from kernels.precision import half_precision, half_precision_backward


class GroupScaleCache(NamedTuple):
    xg: object  # (..., G, D/G) the input, grouped
    g: object   # (G,) the gains


@half_precision
def groupscale_forward(x, params):
    """y[..., k] = g[k // (D/G)] * x[..., k].  x: (..., D); params g: (G,), G divides D."""
    check_float("x", x)
    G, D = params["g"].shape[0], x.shape[-1]
    if D % G:
        raise ValueError(f"groupscale: G = {G} must divide D = {D}")
    check_params("groupscale", params, {"g": (G,)}, x.dtype)
    xg = x.reshape(*x.shape[:-1], G, D // G)                                   # (..., G, D/G)
    return (xg * params["g"][:, None]).reshape(x.shape), GroupScaleCache(xg, params["g"])


@half_precision_backward
def groupscale_backward(dy, cache):
    """dx = dy * g (each group's gain); dg = the sum over a group and every position of dy * x."""
    dyg = dy.reshape(cache.xg.shape)                                            # (..., G, D/G)
    dx = (dyg * cache.g[:, None]).reshape(dy.shape)                             # (..., D)
    axes = tuple(range(dyg.ndim - 2)) + (dyg.ndim - 1,)
    return dx, {"g": (dyg * cache.xg).sum(axis=axes)}                           # (G,)
'''

ORACLE = '''

def groupscale(x, params):
    g = params["g"]
    xg = x.reshape(*x.shape[:-1], g.shape[0], x.shape[-1] // g.shape[0])
    return (xg * g[:, None]).reshape(x.shape)
'''

ROW = '''    Row("groupscale", kernels.groupscale_forward, kernels.groupscale_backward,
        reference.groupscale,
        lambda rng, dt, s: ([_x(rng, dt, s)], {"g": normal(rng, (s["G"],), dt)}),
        axes={"x": BTD, "g": ("group",)}, analytic=True, sizes={"G": 2}),
'''


def _copy_of_the_lab(dest: pathlib.Path):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def _edit(path: pathlib.Path, old: str, new: str):
    text = path.read_text()
    assert old in text, f"{path.name} no longer has {old!r}: update this test and the guide"
    path.write_text(text.replace(old, new, 1))


def _run(lab, *argv, timeout=900):
    env = {**os.environ, "GRADLAB_QUIET": "1", "PYTHONPATH": str(lab)}
    proc = subprocess.run([sys.executable, *argv], cwd=lab, capture_output=True, text=True,
                          env=env, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_a_new_layer_goes_through_the_guide_with_the_suite_green(tmp_path):
    lab = tmp_path / "lab"
    _copy_of_the_lab(lab)
    # 2. the kernel pair, exported from kernels/
    (lab / "kernels" / "groupscale.py").write_text(textwrap.dedent(KERNEL).lstrip())
    _edit(lab / "kernels" / "__init__.py", "from kernels.layernorm import",
          "from kernels.groupscale import groupscale_backward, groupscale_forward\n"
          "from kernels.layernorm import")
    # 3. the oracle, exported from reference/
    with open(lab / "reference" / "layers.py", "a") as f:
        f.write(ORACLE)
    _edit(lab / "reference" / "__init__.py", "from reference.layers import (",
          "from reference.layers import groupscale\nfrom reference.layers import (")
    # 4. one row, with its own size name G
    _edit(lab / "checks" / "registry.py", "\n]\n\nBY_NAME", "\n" + ROW + "]\n\nBY_NAME")
    # 5. run it, at another G; then the generated docs entries, one command
    table = _run(lab, "-m", "checks", "--layer", "groupscale", "--sizes", "G=4")
    assert "groupscale  float32  g        4" in table and "2 of 2 layer checks agree" in table
    _run(lab, "-m", "checks", "docs", "--layer", "groupscale")
    for page in ("tolerances.md", "half-precision.md"):
        text = (lab / "docs" / page).read_text()
        assert text.count("\ngroupscale ") >= 2 and "--layer groupscale" in text
    # the suite's tests that enrol rows or read the generated tables, green with the new row
    _run(lab, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "not slow",
         "tests/test_discovery.py", "tests/test_calibration.py", "tests/test_layers.py",
         "tests/test_precision_policy.py", "tests/test_readme_numbers.py", "-k",
         "groupscale or discovery or docs or policy or example")
