"""Finite differences along joint directions: a large program's check of many tensors (the whole
model at the bench's size) moves every agreeing tensor at once, with equal shares, instead of
running six forwards per tensor.  These cases are made "large" by lowering the rounding
model's threshold, so the same code path runs on a small layer of 20 weight tensors
y = sum_k a_k x W_k, whose gradients differ in scale by 1e3 (a_k from 1 to 1e-3)."""
import numpy as np
import pytest

from checks import legs, rounding
from checks.engine import check_layer
from checks.verdict import Finding, Kind

K, B, D = 20, 6, 8
A = np.geomspace(1.0, 1e-3, K)  # the smallest gradient last


def _case(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, D)).astype(dtype)
    params = {f"W{k:02d}": (rng.standard_normal((D, D)) / np.sqrt(D)).astype(dtype)
              for k in range(K)}
    return x, params


def forward(x, params):
    y = sum(np.asarray(a, x.dtype) * (x @ params[f"W{k:02d}"]) for k, a in enumerate(A))
    return y, (x, params)


def backward_with(factor):
    """The hand backward with dW of the smallest-gradient tensor scaled by ``factor``."""
    def backward(dy, cache):
        x, params = cache
        grads = {f"W{k:02d}": np.asarray(a, x.dtype) * (x.T @ dy) for k, a in enumerate(A)}
        grads[f"W{K - 1:02d}"] = grads[f"W{K - 1:02d}"] * np.asarray(factor, x.dtype)
        dx = sum(np.asarray(a, x.dtype) * (dy @ params[f"W{k:02d}"].T) for k, a in enumerate(A))
        return dx, grads
    return backward


def oracle_with(factor):
    """The oracle whose gradient of the last tensor is ``factor`` times the true one (its
    value unchanged): an oracle bug that a hand backward may share."""
    import jax
    import jax.numpy as jnp

    def oracle(x, params):
        y = 0.0
        for k, a in enumerate(A):
            w = params[f"W{k:02d}"]
            if k == K - 1 and factor != 1.0:
                w = factor * w + (1.0 - factor) * jax.lax.stop_gradient(w)
            y = y + a * jnp.matmul(x, w)
        return y
    return oracle


@pytest.fixture
def large(monkeypatch):
    """Every program counts as large (one sample per call, joint FD for many tensors)."""
    monkeypatch.setattr(rounding, "LARGE_ELEMENTS", 0)
    monkeypatch.setattr(legs, "_ROUNDING_MODELS", {})


def _check(backward_factor=1.0, oracle_factor=1.0, dtype=np.float64):
    x, params = _case(dtype)
    return check_layer(forward, backward_with(backward_factor), oracle_with(oracle_factor),
                       [x], params, input_names=["x"])


def _findings(report):
    return {n.finding for n in report.notes}


@pytest.mark.slow  # the large path compiles its programs with XLA's passes: seconds each
def test_a_correct_layer_is_settled_by_the_joint_directions(large):
    report = _check()
    assert report.ok, str(report)
    assert Finding.FD_JOINT in _findings(report)
    for t in report.tensors:
        assert t.verdict.kind is Kind.OK
        # autodiff against the joint FD: far inside FD's tolerance (float64, linear layer)
        assert t.autodiff_vs_fd < 0.1 * t.tol_fd, (t.name, t.autodiff_vs_fd, t.tol_fd)


@pytest.mark.slow
def test_an_oracle_bug_shared_by_the_hand_in_the_smallest_gradient_is_seen(large):
    """Hand and autodiff agree (both 1 % off in the tensor whose gradient is 1e3 times smaller
    than the largest): the joint directions disagree with autodiff, every tensor takes its own
    directions, and that tensor's FD says both are wrong.  A 1 % error moves D by about
    1e-2 |g_k| |w_k| / sqrt(64) (a random direction): with every tensor at its own step the
    last tensor's share is 1e-3 / 3.3 of the joint scale and the error 3.8e-7 of it, at FD's
    tolerance (2.3e-7); with equal shares it is 1e-2 / (20 x 8) = 6.3e-5, 270 times that."""
    report = _check(backward_factor=0.99, oracle_factor=0.99)
    assert Finding.FD_JOINT not in _findings(report)
    bad = {t.name: t for t in report.tensors}[f"W{K - 1:02d}"]
    assert bad.verdict.kind is Kind.FD_DISAGREES, str(report)
    assert not report.ok
    assert all(t.verdict.kind is Kind.OK for t in report.tensors if t is not bad)


@pytest.mark.slow
def test_a_hand_bug_is_judged_on_its_own_directions_beside_the_joint(large):
    report = _check(backward_factor=1.01, dtype=np.float32)
    assert report.failing == [f"W{K - 1:02d}"], str(report)
    bad = {t.name: t for t in report.tensors}[f"W{K - 1:02d}"]
    assert bad.verdict.kind is Kind.HAND_WRONG
    assert Finding.FD_JOINT in _findings(report)  # the 20 agreeing tensors joined


@pytest.mark.slow  # 20 tensors' own directions: two seconds
def test_a_small_program_keeps_each_tensors_own_directions():
    report = _check()
    assert report.ok, str(report)
    assert Finding.FD_JOINT not in _findings(report)


def test_the_joint_shares_are_equal_and_no_tensor_moves_beyond_its_own_step():
    from checks import tolerances
    x, params = _case()
    dout = np.random.default_rng(1).standard_normal((B, D))  # a random upstream gradient
    fd = legs.FiniteDifferences(forward, [x], params, {}, dout)
    g = {k: np.asarray(a) * (x.T @ dout) for k, a in zip(params, A)}
    joint = fd.measure_joint({k: (params[k], g[k]) for k in params}, np.random.default_rng(0))
    assert joint is not None and len(joint.keys) == K
    for w in joint.moves:
        shares = [np.linalg.norm(g[k]) * np.linalg.norm(w[k]) for k in joint.keys]
        assert np.allclose(shares, shares[0], rtol=1e-12)
        for k in joint.keys:
            size = np.sqrt(np.mean(params[k] ** 2))
            rms = np.sqrt(np.mean(w[k] ** 2))
            assert rms <= tolerances.fd_step(size) * (1 + 1e-12)
    # the layer is linear in each W: FD is exact up to rounding
    assert joint.autodiff_agrees and joint.autodiff_error < 1e-9
