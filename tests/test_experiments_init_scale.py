"""init_scale at a tiny size: the per-product gain n sigma^2, normalisation pins |x|^2/n at 1,
a non-zero mean collapses the vectors onto one line and centring undoes it."""
import math

import numpy as np
import pytest

from experiments import init_scale as study

TINY = study.Config(width=16, depth=6, vectors=4, trials=24, seed=4)


pytestmark = pytest.mark.usefixtures("study_sandbox")


def test_gain_normalisation_and_centring():
    m = study.measure(TINY)
    n = TINY.width
    for name, (_, std) in study.scales(n, TINY.depth).items():
        if name.startswith("uniform"):
            continue
        per_chain = m[name, "raw"][1].mean(axis=(1, 2))            # (trials,) independent chains
        se = per_chain.std(ddof=1) / math.sqrt(len(per_chain))
        # E|Wx|^2/|x|^2 = n sigma^2 exactly: the Monte Carlo mean within 3 standard errors
        assert abs(per_chain.mean() - n * std ** 2) <= 3 * se, name
        # RMS norm gives ms / (ms + eps), eps = 1e-8, with ms ~ n sigma^2 after the product (its
        # spread over rows is a factor of a few): 1 - eps / (n sigma^2) to within a factor 3
        np.testing.assert_allclose(m[name, "normalised"][0][1:], 1.0, atol=3e-8 / (n * std ** 2))
    assert m["uniform [0, 1)", "raw"][2][-1].mean() > 0.99          # all on the all-ones line
    centred = m["uniform [0, 1)", "centred"][2][1].mean()
    assert centred < 0.5 and centred < m["uniform [0, 1)", "raw"][2][1].mean()
    result = study.run(TINY)
    assert len(result.figures) == 2 and all(h.agrees for h in result.headlines[:3])


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match=r"^vectors: expected an integer in \[2, inf\], got 1"):
        study.Config(vectors=1)
