"""Bad input at the public edges raises an error naming the argument and what was expected."""
import numpy as np
import pytest

import kernels


def attn_params(H=2, P=4, dtype=np.float64):
    rng = np.random.default_rng(0)
    p = {k: rng.standard_normal((H, P, P)).astype(dtype) for k in ("WQ", "WK", "WV")}
    p["WO"] = rng.standard_normal((H * P, H * P)).astype(dtype)
    return p


def test_wrong_rank():
    with pytest.raises(ValueError, match=r"x: expected rank 3"):
        kernels.mha_forward(np.zeros((5, 8)), attn_params())


def test_width_not_divisible_by_heads():
    params = attn_params(H=3, P=3)
    with pytest.raises(ValueError, match=r"not divisible by H = 3"):
        kernels.mha_forward(np.ones((2, 4, 8)), params)


def test_weight_shape_mismatch_names_the_key():
    params = attn_params()
    params["WO"] = np.zeros((8, 7))
    with pytest.raises(ValueError, match=r"params\['WO'\]: expected shape \(8, 8\)"):
        kernels.mha_forward(np.ones((2, 4, 8)), params)


@pytest.mark.parametrize("bad", [-1, 6])
def test_token_ids_outside_vocabulary(bad):
    E = np.eye(6, 8)
    ids = np.array([[0, 1, bad]])
    with pytest.raises(ValueError, match=r"ids: token ids must lie in \[0, 6\)"):
        kernels.embedding_forward(ids, {"E": E})


def test_float_ids_are_rejected():
    with pytest.raises(TypeError, match="ids: expected an integer array"):
        kernels.embedding_forward(np.zeros((1, 2)), {"E": np.eye(6, 8)})


def test_targets_outside_vocabulary():
    with pytest.raises(ValueError, match="targets: token ids must lie"):
        kernels.cross_entropy_forward(np.zeros((1, 2, 4)), np.array([[0, -2]]), {})


def test_mixed_dtypes_are_rejected():
    params = attn_params(dtype=np.float64)
    with pytest.raises(TypeError, match=r"expected dtype float32"):
        kernels.mha_forward(np.ones((2, 4, 8), np.float32), params)


def test_odd_width_positional_encoding():
    with pytest.raises(ValueError, match="even width"):
        kernels.posenc_forward(np.zeros((1, 3, 5)), {})


def test_orthogonal_embedding_needs_v_le_d():
    with pytest.raises(ValueError, match="V <= D"):
        kernels.orthogonal_embedding(12, 8)


def test_kernels_preserve_dtype_and_do_not_mutate():
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)
    params = attn_params(dtype=np.float32)
    x0, p0 = x.copy(), {k: v.copy() for k, v in params.items()}
    out, cache = kernels.mha_forward(x, params, causal=True)
    dx, grads = kernels.mha_backward(np.ones_like(out), cache)
    assert out.dtype == dx.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads.values()) and set(grads) == set(params)
    assert np.array_equal(x, x0) and all(np.array_equal(params[k], p0[k]) for k in params)
