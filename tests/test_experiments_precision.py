"""precision at a tiny size: float32 kernel errors under Higham's gamma_n, recursive summation
growing as sqrt(n) u, and the finite-difference optimum where truncation meets rounding."""
import numpy as np
import pytest

from experiments import common, precision as study

TINY = study.Config(lengths=(16, 256, 4096, 65536), rows=4, trials=2, fd_draws=32, fd_steps=25, seed=5)


pytestmark = pytest.mark.usefixtures("study_sandbox")


def test_errors_respect_the_bounds_and_the_step_optimum():
    (worst, sums), (steps, errors, third, rounding) = study.measure(TINY)
    n = np.array(TINY.lengths, float)
    for name in (*study.LINEAR, study.RECURSIVE):              # inner products: gamma_n; sums: n - 1
        assert np.all(worst[name] <= study.gamma(n if name in study.LINEAR else n - 1)), name
        assert np.all(worst[name] > 0), name                         # float32 really rounded
    # the rounding model predicts the recursive sum's mean squared error (not only bounds it)
    per_row = np.concatenate([sq / model.mean() for sq, model, _ in sums.values()])
    mean, se = common.mean_se(per_row)
    assert abs(mean - 1) <= 3 * se, (mean, se)
    for name, u in study.U.items():
        fits = study.branch_fits(steps, errors[name], u, third, rounding)
        ratio, se, df = fits["truncation"]        # the Taylor coefficient, within its t band
        assert df >= 1 and abs(ratio - 1) <= common.t_multiplier(df) * se + study.TRUNCATION_REL_SE, (name, fits)
        ratio, se, df = fits["rounding"]          # under the rounding bound, not far under it
        assert df >= 2 and 0.02 < ratio <= 1, (name, fits)
        opt, _ = fits["optimum"]                  # the fitted optimum: (ratio)^(1/3) of h*
        assert opt == pytest.approx((ratio / fits["truncation"][0]) ** (1 / 3))
    assert errors["float32"][0] == pytest.approx(1.0)               # h = 1e-12: x + h v == x
    study.run(TINY)
    assert (common.RESULTS / "precision" / "data.csv").exists()


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match=r"^fd_steps: expected an integer in \[3, inf\], got 2"):
        study.Config(fd_steps=2)
