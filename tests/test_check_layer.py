"""check_layer, the public entry point: it passes correct pairs and flags broken ones."""
import numpy as np

import kernels
import reference
from checks import check_layer
from checks.verdict import Kind


def linear_case(dtype=np.float64):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 6)).astype(dtype)
    params = {"W": rng.standard_normal((6, 5)).astype(dtype), "b": rng.standard_normal(5).astype(dtype)}
    return x, params


def test_correct_pair_passes():
    x, params = linear_case()
    report = check_layer(kernels.linear_forward, kernels.linear_backward, reference.linear,
                         [x], params, name="linear")
    assert report.ok and report.failing == []
    assert "linear" in str(report) and "ok" in str(report)


def test_transposed_weight_gradient_is_flagged():
    x, params = linear_case()
    W_sq = np.random.default_rng(1).standard_normal((6, 6))  # square so the transpose has the right shape
    params = {"W": W_sq, "b": np.zeros(6)}

    def broken_backward(dy, cache):
        dx, grads = kernels.linear_backward(dy, cache)
        return dx, {**grads, "W": grads["W"].T}

    report = check_layer(kernels.linear_forward, broken_backward, reference.linear, [x], params,
                         name="linear")
    assert not report.ok
    assert report.failing == ["W"]
    bad = next(t for t in report.tensors if t.name == "W")
    assert bad.hand_vs_autodiff > 0.1 and bad.autodiff_vs_fd < bad.tol_fd
    assert bad.verdict.kind is Kind.HAND_WRONG
    assert "FAIL" in str(report)


def test_wrong_oracle_is_named():
    x, params = linear_case()
    wrong_oracle = lambda x, p: x @ p["W"] + 2 * p["b"]
    report = check_layer(kernels.linear_forward, kernels.linear_backward, wrong_oracle, [x], params)
    assert not report.forward_ok and "forward" in report.failing
    bad = next(t for t in report.tensors if t.name == "b")
    assert bad.verdict.kind is Kind.ORACLE_WRONG


def test_scalar_loss_and_integer_inputs():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((2, 3, 5)).astype(np.float32)
    targets = rng.integers(0, 5, (2, 3))
    report = check_layer(kernels.cross_entropy_forward, kernels.cross_entropy_backward,
                         reference.cross_entropy, [logits, targets], {}, name="ce",
                         input_names=("logits", "targets"))
    assert report.ok, str(report)
    assert [t.name for t in report.tensors] == ["logits"] and report.dtype == "float32"


def test_gradient_off_by_factor_two_is_flagged_in_float32():
    """A gradient off by a constant factor of 2 fails in float32 too, tensor by tensor."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    params = {k: (rng.standard_normal((2, 4, 4)) / 2).astype(np.float32) for k in ("WQ", "WK", "WV")}
    params["WO"] = (rng.standard_normal((8, 8)) / 3).astype(np.float32)

    def broken(dout, cache):
        dx, grads = kernels.mha_backward(dout, cache)
        return dx, {**grads, "WQ": grads["WQ"] * 2.0}

    report = check_layer(kernels.mha_forward, broken, reference.mha, [x], params)
    assert report.failing == ["WQ"]


def test_raising_backward_is_a_failing_report():
    x, params = linear_case()

    def raising(dy, cache):
        raise RuntimeError("boom")

    report = check_layer(kernels.linear_forward, raising, reference.linear, [x], params)
    assert not report.ok and "RuntimeError" in report.error and "boom" in report.error


def test_missing_gradient_key_fails_by_name():
    x, params = linear_case()

    def missing(dy, cache):
        dx, grads = kernels.linear_backward(dy, cache)
        return dx, {"W": grads["W"]}

    report = check_layer(kernels.linear_forward, missing, reference.linear, [x], params)
    assert report.failing == ["b"]


def test_an_oracle_calling_numpy_on_token_ids_runs_eagerly():
    """np.asarray on an integer input cannot be traced by jax.jit (nor by jax.eval_shape for the
    output's shape): the oracle runs eagerly, without a rounding model, and still judges."""
    def eager_embedding(ids, params):
        return params["E"][np.asarray(ids)]                    # a NumPy call on the token ids

    rng = np.random.default_rng(2)
    ids, E = rng.integers(0, 5, (2, 3)), rng.standard_normal((5, 4))
    right = check_layer(kernels.embedding_forward, kernels.embedding_backward, eager_embedding,
                        [ids], {"E": E}, input_names=("ids",))
    assert right.ok and "runs eagerly only" in right.note, str(right)
    doubled = lambda dy, cache: (None, {"E": 2 * kernels.embedding_backward(dy, cache)[1]["E"]})
    wrong = check_layer(kernels.embedding_forward, doubled, eager_embedding, [ids], {"E": E},
                        input_names=("ids",))
    assert wrong.failing == ["E"] and wrong.tensors[0].verdict.kind is Kind.HAND_WRONG
    assert "scaled by a constant: 2 x the right one" in wrong.tensors[0].diagnosis


def test_unknown_axes_keys_are_an_error_naming_the_argument():
    import pytest
    x, params = linear_case()
    with pytest.raises(ValueError, match=r"axes: no tensor named 'w'; the tensors are input0, W, b"):
        check_layer(kernels.linear_forward, kernels.linear_backward, reference.linear, [x], params,
                    axes={"w": ("row", "col")})


def _noisy_backward(only_float32):
    """linear's backward with dW off by 7.5e-6 of its largest element, in a fixed random pattern
    (no bug shape fits it): in every dtype, or only when it runs in float32."""
    def backward(dy, cache):
        dx, grads = kernels.linear_backward(dy, cache)
        W = grads["W"]
        if only_float32 and W.dtype != np.float32:
            return dx, grads
        noise = np.random.default_rng(3).uniform(-1, 1, W.shape)
        return dx, {**grads, "W": (W + 7.5e-6 * np.abs(W).max() * noise).astype(W.dtype)}
    return backward


def test_a_small_float32_error_is_rounding_only_when_float64_passes():
    """A float32 failure within a few tolerances: rounding in an ill-conditioned case only when
    the same kernel's float64 check passes; a real bug, which fails in float64 too, is not."""
    x, params = linear_case(np.float32)
    check = lambda backward: check_layer(kernels.linear_forward, backward, reference.linear, [x],
                                         params, name="linear")
    bug = {t.name: t for t in check(_noisy_backward(only_float32=False)).tensors}["W"]
    rounding = {t.name: t for t in check(_noisy_backward(only_float32=True)).tensors}["W"]
    assert not bug.ok and not rounding.ok and bug.score > 1 and rounding.score > 1
    assert "rounding" not in bug.diagnosis and bug.diagnosis == "no common bug pattern fits"
    assert "the float64 check of the same kernel passes (rounding in an ill-conditioned case)" \
        in rounding.diagnosis
