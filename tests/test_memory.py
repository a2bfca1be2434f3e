"""Bounded memory: the rounding model's samples run in chunks sized from the memory available,
with the same spreads' scale whatever the chunk."""
import numpy as np
import pytest

import kernels
import reference
from checks import rounding
from checks.engine import check_layer


def test_chunks_add_up_to_the_samples_and_shrink_with_the_budget(monkeypatch):
    assert rounding._chunks(16, 10) == [16]
    monkeypatch.setattr(rounding, "MEMORY_CAP", 16 * 4 * rounding.BYTES_PER_SAMPLE_ELEMENT)
    assert rounding._chunks(16, 16) == [4, 4, 4, 4]
    assert rounding._chunks(16, 10 ** 9) == [1] * 16
    assert rounding._chunks(12, 16) == [3, 3, 3, 3]
    assert sum(rounding._chunks(10, 16)) == 10


@pytest.mark.slow  # compiles the rounding model twice
def test_a_check_in_chunks_of_one_sample_gives_the_spreads_of_one_pass(monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 8)).astype(np.float32)
    params = {"W": (rng.standard_normal((8, 5)) / np.sqrt(8)).astype(np.float32),
              "b": (0.1 * rng.standard_normal(5)).astype(np.float32)}
    run = lambda: check_layer(kernels.linear_forward, kernels.linear_backward,
                              reference.linear, [x], params, seed=3)
    whole = run()
    monkeypatch.setattr(rounding, "MEMORY_CAP", 1)   # one sample per chunk
    from checks import legs
    monkeypatch.setattr(legs, "_ROUNDING_MODELS", {})
    chunked = run()
    assert whole.ok and chunked.ok, str(chunked)
    for a, b in zip(whole.tensors, chunked.tensors):
        # the same model, other noise draws: tolerances agree to the estimate's own spread
        # (16 samples: a relative standard error of about 1 / sqrt(32) per element)
        assert 0.5 < a.tol / b.tol < 2, (a.name, a.tol, b.tol)
