"""freezing at a tiny size: the participation ratio through the lab's softmax, the fit in 1/ln n
recovering a known intercept, the random-energy model's limits, and a tiny run's headlines."""
import math

import numpy as np
import pytest

from experiments import common, freezing as study

TINY = study.Config(keys=(16, 64, 256), elements=1 << 14, rows_min=32, multiples=(2.0,),
                    curve=(0.25, 1.0), seed=1)


pytestmark = pytest.mark.usefixtures("study_sandbox")


def test_participation_is_the_sum_of_squared_probabilities():
    z = np.random.default_rng(0).standard_normal((5, 9))
    p = np.exp(2.0 * z)
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(study.participation(z, 2.0), (p * p).sum(1), rtol=1e-12)
    np.testing.assert_allclose(study.participation(z, 0.0), 1 / 9, rtol=1e-12)   # uniform: 1/n
    assert study.sigma_c(1024) == pytest.approx(math.sqrt(2 * math.log(1024)))
    assert study.frozen_limit(2.0) == 0.5 and study.frozen_limit(0.5) == 0.0


def test_the_fit_recovers_a_known_intercept_and_scales_a_bad_fit():
    keys = (64, 256, 1024, 4096)
    config = study.Config(keys=keys, multiples=(2.0,), curve=(1.0,))
    exact = {(n, 2.0): (0.5 + 0.4 / math.log(n), 0.01) for n in keys}
    value, se, chi2, slope = study.extrapolate(exact, config, 2.0)
    assert value == pytest.approx(0.5) and slope == pytest.approx(0.4) and chi2 == pytest.approx(0, abs=1e-20)
    bumpy = {(n, 2.0): (v + (0.05 if i % 2 else -0.05), s) for i, ((n, _), (v, s)) in enumerate(exact.items())}
    _, se_bumpy, chi2_bumpy, _ = study.extrapolate(bumpy, config, 2.0)
    assert chi2_bumpy > 1 and se_bumpy > se               # the Birge ratio widens a line that misses


def test_tiny_run_states_its_test():
    result = study.run(TINY)
    (head,) = result.headlines
    assert head.kind == "reproduced" and head.predicted == 0.5 and head.measured_se > 0
    assert (common.RESULTS / "freezing" / "data.csv").exists()
    rows = {(r["n"], r["sigma_over_sigma_c"]): r for r in result.rows}
    assert rows[256, 0.25]["mean_sum_p2"] < rows[256, 1.0]["mean_sum_p2"] < rows[256, 2.0]["mean_sum_p2"]


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match=r"^multiples: expected"):
        study.Config(multiples=(0.5,))
    with pytest.raises(ValueError, match=r"^keys: expected 3 or more"):
        study.Config(keys=(16, 64))
