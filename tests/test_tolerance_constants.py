"""The multiples of an estimated spread the checker allows follow from the number of samples
the spread is estimated from (checks.tolerances.student): a correct error falls outside them
with the stated odds."""
import numpy as np
from scipy import stats

from checks import tolerances
from checks.tolerances import Policy, student


def test_student_is_the_two_sided_quantile_of_t():
    # an independent implementation of the same quantile (scipy.stats, not scipy.special)
    for samples in (4, 16, 64, 256):
        for odds in (0.05, 1e-3, 2e-7, 3e-11):
            assert np.isclose(student(odds, samples), stats.t.isf(odds / 2, samples), rtol=1e-9)


def test_an_error_over_its_estimated_spread_exceeds_the_quantile_at_the_stated_odds():
    # the situation the rule is built for: a Gaussian error e of rms sigma, judged against
    # sigma estimated from n draws of the same distribution (mean known to be zero)
    rng = np.random.default_rng(0)
    n, trials, odds = tolerances.SAMPLES, 200_000, 0.01
    e = rng.standard_normal(trials)
    s = np.sqrt(np.mean(rng.standard_normal((trials, n)) ** 2, axis=1))
    rate = np.mean(np.abs(e) > student(odds, n) * s)
    # binomial standard error sqrt(0.01 * 0.99 / 2e5) = 2.2e-4: 5 of them
    assert abs(rate - odds) < 5 * np.sqrt(odds * (1 - odds) / trials)
    # with a Gaussian quantile instead (the spread taken as exact) the rate is visibly higher
    # at n = 4: the degrees of freedom matter
    s4 = np.sqrt(np.mean(rng.standard_normal((trials, 4)) ** 2, axis=1))
    assert np.mean(np.abs(e) > stats.norm.isf(odds / 2) * s4) > 3 * odds


def test_the_policy_constants_are_the_quantiles_at_the_models_sample_count():
    p = Policy()
    assert p.LAMBDA == student(tolerances.ELEMENT_ODDS, tolerances.SAMPLES)
    assert p.BIAS_LAMBDA == student(tolerances.SET_ODDS, tolerances.SAMPLES) / np.sqrt(3)
    # the earlier 16-sample constants were these quantiles too: 16 and 5
    assert round(student(tolerances.ELEMENT_ODDS, 16)) == 16
    assert round(student(tolerances.SET_ODDS, 16) / np.sqrt(3), 1) == 5.0
    # more samples, narrower multiples, towards the Gaussian quantile
    assert student(3e-11, 16) > student(3e-11, 64) > stats.norm.isf(1.5e-11)
