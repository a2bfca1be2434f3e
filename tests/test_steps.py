"""The step-size picture shows the textbook behaviour: central differences are best near
u^(1/3), forward differences near u^(1/2) and worse, the complex step is flat at ~u."""
import numpy as np

from checks import tolerances
from checks.steps import draw, measure

STEPS = np.logspace(-16, 0, 17)


def test_step_size_errors_follow_the_theory(tmp_path):
    m = measure("softmax", steps=STEPS)
    c = m["curves"]
    at = lambda h: int(np.argmin(np.abs(np.log(STEPS / h))))
    u64, u32 = tolerances.U64, tolerances.unit_roundoff(np.float32)
    # central differences at the u^(1/3) step reach ~u^(2/3); tiny steps drown in rounding
    assert c[("central", "float64")][at(u64 ** (1 / 3))] < 1e-9
    assert c[("central", "float64")][at(1e-14)] > 100 * c[("central", "float64")][at(u64 ** (1 / 3))]
    assert c[("central", "float32")][at(u32 ** (1 / 3))] < 1e-4
    # forward differences are first order: worse than central at central's best step
    assert c[("forward", "float64")][at(u64 ** (1 / 3))] > 10 * c[("central", "float64")][at(u64 ** (1 / 3))]
    # the complex step has no subtraction: near u at every small step
    assert np.max(c[("complex step", "float64")][STEPS < 1e-6]) < 1e-13
    path = draw("softmax", out_dir=tmp_path, steps=STEPS)
    assert path.exists() and path.stat().st_size > 10_000
