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


def test_a_program_too_large_for_all_samples_runs_fewer_with_wider_multiples():
    from checks.tolerances import MIN_SAMPLES, SAMPLE_WORK, SAMPLES, samples_for
    # the registry's rows at the bench's large size record up to 48 million elements (the
    # QK-norm cross-attention): all samples; the whole model at that size, 331 million: fewer
    assert samples_for(48_000_000) == SAMPLES
    assert samples_for(SAMPLE_WORK // SAMPLES) == SAMPLES
    assert MIN_SAMPLES <= samples_for(331_000_000) < SAMPLES
    assert samples_for(10 ** 12) == MIN_SAMPLES
    # the policy for n samples: the quantiles at n, a row's own multiples scaled alike
    p = Policy().for_samples(16)
    assert np.isclose(p.LAMBDA, student(tolerances.ELEMENT_ODDS, 16))
    assert np.isclose(p.BIAS_LAMBDA, student(tolerances.SET_ODDS, 16) / np.sqrt(3))
    row = Policy(LAMBDA=12.0).for_samples(16)
    assert np.isclose(row.LAMBDA / 12.0, p.LAMBDA / Policy().LAMBDA)
    assert Policy().for_samples(SAMPLES) == Policy()


def test_the_checker_widens_its_multiples_when_its_program_ran_fewer_samples(monkeypatch):
    # the same correct check, its rounding model forced to 16 samples: the element-wise
    # tolerance is LAMBDA(16) = 2.0 x LAMBDA(64) spreads of a 16-sample estimate; the estimate
    # errs by its sampling error and the ULPS term does not scale, so the largest tolerance
    # grows by 1.4-2.1 on seeds 3-5 of this row: between 1.2 and 3
    from checks import legs, rounding
    from checks.registry import BY_NAME, run_row
    monkeypatch.setattr(rounding, "samples_for", lambda elements: 16)
    monkeypatch.setattr(legs, "_ROUNDING_MODELS", {})  # models are kept per oracle and shape
    report = run_row(BY_NAME["linear"], np.float32, seed=3)
    assert report.ok
    monkeypatch.undo()
    monkeypatch.setattr(legs, "_ROUNDING_MODELS", {})
    full = run_row(BY_NAME["linear"], np.float32, seed=3)
    for few, many in zip(report.tensors, full.tensors):
        assert 1.2 < few.tol / many.tol < 3.0, (few.name, few.tol / many.tol)
