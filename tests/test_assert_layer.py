"""assert_layer: the documented example passes for a right pair and raises, with the report,
for a wrong one."""
import importlib.util
import pathlib

import numpy as np
import pytest

from checks import assert_layer

EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "test_my_layer.py"


def _example():
    spec = importlib.util.spec_from_file_location("example_test_my_layer", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_test_file_passes():
    example = _example()
    example.test_gelu_float64()
    example.test_gelu_float32()


def test_a_wrong_pair_raises_with_the_report():
    example = _example()
    halved = lambda dy, cache: (0.5 * example.gelu_backward(dy, cache)[0], {})
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    with pytest.raises(AssertionError) as caught:
        assert_layer(example.gelu_forward, halved, example.gelu_oracle, [x], {}, name="gelu",
                     input_names=("x",))
    message = str(caught.value)
    assert message.startswith("gelu: the hand gradients disagree (x)")
    assert "hand is wrong (autodiff and FD agree)" in message
    assert "scaled by a constant: 1/2 x the right one" in message
    report = assert_layer(example.gelu_forward, example.gelu_backward, example.gelu_oracle, [x],
                          {})
    assert report.ok and report.tensors[0].hand_vs_autodiff < 1e-14
