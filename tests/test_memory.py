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


def test_the_kink_runs_reuse_the_spreads_draws_and_find_what_their_own_draws_find(monkeypatch):
    """One set of normal draws feeds the spreads and the kink runs (the draws are the costliest
    host work of a large model's check): the flip at a pre-activation of 1e-7 is found from
    the spread's draws, without drawing again, as a kink run with its own draws finds it."""
    from checks.legs import Oracle
    from checks.wild import plain_ff
    x, p = plain_ff(np.random.default_rng(0), np.float32, B=2, T=8, D=16, F=32)
    z = x.astype(np.float64).reshape(-1, 16) @ p["W1"].astype(np.float64)
    p["b1"][3] = -z[5, 3] + 1e-7  # hidden unit 3 of token 5 within rounding of the kink
    inputs = [x.astype(np.float64)]
    params = {k: v.astype(np.float64) for k, v in p.items()}
    dout = np.random.default_rng(1).standard_normal(x.shape)
    u = float(np.finfo(np.float32).eps) / 2
    us = (u,) * len(rounding.PARTS)
    alone = Oracle(reference.ff, inputs, params, {}, [0]).kinks(dout, us, seed=0)
    shared_oracle = Oracle(reference.ff, inputs, params, {}, [0])
    shared_oracle.spread(dout, seed=0, kink_us=us)

    def no_second_draw(*args, **kwargs):
        raise AssertionError("the kink runs drew their own noise")
    monkeypatch.setattr(rounding.RoundingModel, "_add_flips", no_second_draw)
    shared = shared_oracle.kinks(dout, us, seed=0)
    assert alone[3] >= 1 and shared[3] >= 1  # predicates flipped
    for a, b in ((alone[0], shared[0]), (alone[2]["W1"], shared[2]["W1"])):
        assert np.any(a > 0) and np.any(b > 0)
        assert np.unravel_index(a.argmax(), a.shape) == np.unravel_index(b.argmax(), b.shape)
