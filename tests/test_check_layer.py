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
