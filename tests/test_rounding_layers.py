"""The rounding model of a composition (``checks.rounding``): inside a layer the operations
round at the compute format, every operation between layers at the checked format, and what a
layer returns a second time only where the checked format is coarser than the compute one."""
import numpy as np
import pytest

from checks import rounding
from checks.tolerances import unit_roundoff
from reference.layers import as_layer

U32, U16 = unit_roundoff(np.float32), unit_roundoff(np.float16)


def program(x, w, dout):
    """A layer of one product, then a residual sum between layers: y = x w + x."""
    return as_layer("scale", lambda a, b: a * b, x, w) + x


@pytest.mark.parametrize("fmt", ["float32", "float16"])
def test_a_layers_result_rounds_again_only_to_a_coarser_format(fmt):
    """Expected variance of y_i at the compute roundoff u (float32) and the format's u_f: the
    product's rounding u^2 m_i^2, the sum's u_f^2 y_i^2 and, where the format is coarser than
    the compute one, the returned product's second rounding u_f^2 m_i^2 (m = x w; the model
    draws each rounding with rms u times the result's magnitude, module docstring).  The
    model's squares over its samples, pooled over 4096 elements, must sit within 5 standard
    errors of that: 64 samples x 4096 elements make the pooled mean's relative standard error
    sqrt(2 / 262144) = 0.3 %, where charging the float32 layer's return a second time adds
    22 % on these draws (the model before it was told apart: a ratio of 1.225)."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(4096), rng.uniform(0.5, 2.0, 4096)
    dout = rng.standard_normal(4096)
    model = rounding.RoundingModel(program, (x, w, dout), dout_index=2)
    spread = model.spread((x, w, dout))
    u_f = U32 if fmt == "float32" else U16
    m, y = x * w, x * w + x
    expected = U32 ** 2 * m ** 2 + u_f ** 2 * y ** 2 + (u_f ** 2 * m ** 2 if u_f > U32 else 0.0)
    ratio = spread.at((U32, U32), format=u_f) ** 2 / expected           # (4096,)
    se = ratio.std(ddof=1) / np.sqrt(ratio.size)
    assert abs(ratio.mean() - 1.0) <= 5 * se, (ratio.mean(), se)
    assert 5 * se < 0.05                                                # a 22 % excess shows
