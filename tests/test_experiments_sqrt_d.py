"""sqrt_d at a tiny size: the closed-form variance, sqrt(d) growth, same draws, files, determinism."""
import json
import math

import numpy as np
import pytest

from conftest import sandbox
from experiments import common, sqrt_d

TINY = sqrt_d.Config(sizes=(3, 64), trials=300, loop_trials=3, dot_lengths=(4, 64, 1024),
                     dot_trials=800, seed=1)


pytestmark = pytest.mark.usefixtures("study_sandbox_with_charts")


def test_tiny_run_follows_the_laws_and_writes_its_files(tmp_path):
    result = sqrt_d.run(TINY)
    for row in result.rows[:2]:
        n = row["n"]
        # a Monte Carlo mean against its exact expectation: 3 standard errors
        assert abs(row["var"] - (n - 3 / n + 2 / n ** 2)) <= 3 * row["var_se"], row
        # scaled and unscaled come from the same draws: exactly a factor sqrt(n) apart
        assert row["std_scaled"] == pytest.approx(row["std"] / math.sqrt(n), rel=1e-12)
    dots = [r["std"] for r in result.rows[2:]]
    slope, se, _ = common.fit_slope(np.log(TINY.dot_lengths), np.log(dots))
    assert abs(slope - 0.5) <= 3 * se, (slope, se)
    folder = tmp_path / "sqrt_d"
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["seed"] == 1 and meta["config"]["trials"] == 300 and meta["seconds"] > 0
    assert {"numpy", "jax", "python"} <= set(meta["versions"])
    assert (folder / "sqrt_d.png").stat().st_size > 10_000
    assert "timing (not a headline)" in result.summary
    heads = {h.quantity: h for h in result.headlines}
    # the closed forms are exact at every n: tested with the rule the report prints
    for n in TINY.sizes:
        for name in (f"mean s^2, n = {n}", f"mean of mean^2, n = {n}"):
            h = heads[name]
            assert h.kind == "reproduced" and "combined SE" in h.rule
            assert h.agrees == (abs(h.measured - h.predicted) <= 3 * h.measured_se)
    # the article's columns are compared with the difference's SE, sqrt(2) times the lab's
    h = heads["std of the product, n = 3"]
    assert h.predicted_se == pytest.approx(h.measured_se) and h.predicted == sqrt_d.ARTICLE[3][0]


def test_one_pass_statistics_match_numpy_std_and_mean():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((5, 16, 16)), rng.standard_normal((5, 16, 16))
    C = np.stack([(a - a.mean()) @ (b - b.mean()) for a, b in zip(A, B)])
    std, mu = sqrt_d.trial_stats(A.copy(), B.copy())
    np.testing.assert_allclose(std, C.std(axis=(1, 2)), rtol=1e-12)
    np.testing.assert_allclose(mu, np.abs(C.mean(axis=(1, 2))), rtol=1e-9)


def test_same_seed_gives_identical_data(tmp_path, monkeypatch):
    config = sqrt_d.Config(sizes=(3, 16), trials=50, loop_trials=2, dot_lengths=(4, 16), dot_trials=50)
    sandbox(monkeypatch, tmp_path, charts=False)
    texts = []
    for run in ("a", "b"):
        monkeypatch.setattr(common, "RESULTS", tmp_path / run)
        sqrt_d.run(config)
        texts.append((tmp_path / run / "sqrt_d" / "data.csv").read_bytes())
    assert texts[0] == texts[1]


@pytest.mark.parametrize("field, value", [("trials", 1), ("sizes", (16, 3)), ("sizes", ()),
                                          ("seed", -1), ("dot_trials", 2.5)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field}: expected .*got"):
        sqrt_d.Config(**{field: value})


@pytest.mark.parametrize("n", [3, 16])
def test_exact_abs_mean_matches_the_protocols_centred_product(n):
    """E|mean| = (2/(n sqrt(pi))) Gamma(n/2)/Gamma((n-1)/2), checked on the protocol itself (centre
    each matrix, multiply, average): 3 SE of a 40000-trial mean.  At n = 3 the normal limit
    sqrt(2(n-1)/pi)/n = 0.376 is 0.043 above the exact 0.333, about 40 of these SEs: the check
    tells the two apart."""
    rng = np.random.default_rng(7)
    trials = 40000 if n == 3 else 8000
    _, mu = sqrt_d.trial_stats(rng.standard_normal((trials, n, n)), rng.standard_normal((trials, n, n)))
    mean, se = common.mean_se(mu)
    assert abs(mean - sqrt_d.expected_abs_mean(n)) <= 3 * se, (mean, se, sqrt_d.expected_abs_mean(n))
    if n == 3:
        assert abs(mean - math.sqrt(2 * (n - 1) / math.pi) / n) > 10 * se
    # its large-n form is the normal limit
    assert sqrt_d.expected_abs_mean(4096) == pytest.approx(math.sqrt(2 * 4095 / math.pi) / 4096, rel=1e-4)
