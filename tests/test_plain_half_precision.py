"""Half precision as plain NumPy computes it (kernels.precision.PLAIN): kernels written without
the lab's decorators pass in bfloat16 and float16, the lab's "float32 inside" model would fail
them, a kernel may declare its compute format, a result in another dtype than the inputs' is a
finding assert_layer fails on, and a bug in a plain kernel is still the hand's."""
import numpy as np
import pytest

import reference
from checks import assert_layer, check_layer
from checks import wild_plain as plain
from checks.verdict import Finding, Kind
from kernels.precision import FLOAT32_INSIDE, PLAIN, compute_format_of, computes_in

B, T, D, F, V = 2, 8, 16, 32, 6


def _case(layer, dtype, seed=0):
    """(forward, backward, oracle, inputs, params, input names) of a plain kernel, plain draws."""
    rng = np.random.default_rng(seed)
    n = lambda shape, scale=1.0: (scale * rng.standard_normal(shape)).astype(dtype)
    cases = {
        "linear": ([n((B, T, D))], {"W": n((D, F), D ** -0.5), "b": n((F,), 0.1)}, ["x"]),
        "leaky_relu": ([n((B, T, F))], {}, ["x"]),
        "ff": ([n((B, T, D))], {"W1": n((D, F), D ** -0.5), "b1": n((F,), 0.1),
                                "W2": n((F, D), F ** -0.5), "b2": n((D,), 0.1)}, ["x"]),
        "layernorm": ([n((B, T, D))], {"g": 1 + n((D,), 0.5), "b": n((D,), 0.1)}, ["x"]),
        "softmax": ([n((B, T, V), 2.0)], {}, ["x"]),
        "cross_entropy": ([n((B, T, V), 2.0), rng.integers(0, V, (B, T))], {},
                          ["logits", "targets"]),
    }
    inputs, params, names = cases[layer]
    return (getattr(plain, f"{layer}_forward"), getattr(plain, f"{layer}_backward"),
            getattr(reference, layer), inputs, params, names)


LAYERS = ["linear", "leaky_relu", "ff", "layernorm", "softmax", "cross_entropy"]


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("layer", LAYERS)
def test_a_plain_numpy_half_precision_kernel_passes(layer, dtype):
    """Products in float32, every other result and sum rounded in the format, term by term:
    correct maths, judged by that model (before: 3 of 5 layers failed, up to 29.8x)."""
    from kernels.precision import finfo  # noqa: F401  (bfloat16 through ml_dtypes)
    forward, backward, oracle, inputs, params, names = _case(layer, np.dtype(dtype))
    assert compute_format_of(forward, backward) == PLAIN
    # leaky ReLU's kink is found by the checker (plain draws), a finding this test accepts
    assert_layer(forward, backward, oracle, inputs, params, input_names=names,
                 allow=["KINKS"])


@pytest.mark.parametrize("layer", ["layernorm", "softmax"])
def test_the_float32_inside_model_fails_a_plain_kernel_it_does_not_describe(layer):
    """The same plain bfloat16 kernel declared "float32 inside": its sums in bfloat16 exceed
    what one rounding explains, so the declaration matters (layer norm's mean and variance,
    softmax's row sums)."""
    forward, backward, oracle, inputs, params, names = _case(layer, np.dtype("bfloat16"))
    declared = computes_in(FLOAT32_INSIDE)(lambda *args, **kw: forward(*args, **kw))
    report = check_layer(declared, backward, oracle, inputs, params, input_names=names)
    assert not report.ok, str(report)


def test_a_declaration_names_a_known_compute_format():
    with pytest.raises(ValueError, match="compute: expected one of"):
        computes_in("float8")


def test_a_bfloat16_product_left_in_float32_is_a_finding_assert_layer_fails_on():
    """ml_dtypes' bfloat16 @ returns float32: a kernel that does not round it back returns
    float32 for bfloat16 inputs, from the forward and from the backward."""
    forward, backward, oracle, inputs, params, names = _case("linear", np.dtype("bfloat16"))

    def forward32(x, p):
        return x @ p["W"] + p["b"], plain.LinearCache(x, p["W"])

    def backward32(dy, cache):
        dx, grads = backward(dy, cache)
        return dx, {**grads, "W": cache.x.reshape(-1, D).T @ dy.reshape(-1, F)}
    for f, b in ((forward32, backward), (forward, backward32)):
        report = check_layer(f, b, oracle, inputs, params, input_names=names)
        assert Finding.PROMOTES in {n.finding for n in report.notes}, str(report)
        assert "promotes bfloat16 to float32" in str(report)
        with pytest.raises(AssertionError, match="PROMOTES"):
            assert_layer(f, b, oracle, inputs, params, input_names=names)


@pytest.mark.parametrize("bug", ["x1.5", "negated"])
def test_a_bug_in_a_plain_bfloat16_kernel_is_the_hands(bug):
    from checks.wild import plant
    forward, backward, oracle, inputs, params, names = _case("linear", np.dtype("bfloat16"))
    report = check_layer(forward, plant(backward, "W", bug, seed=3), oracle, inputs, params,
                         input_names=names)
    assert report.failing == ["W"], str(report)
    assert next(t for t in report.tensors if t.name == "W").verdict.kind is Kind.HAND_WRONG
