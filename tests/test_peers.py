"""The bench's peers compute the lab's model: PyTorch's loss and gradients equal the kernels'."""
import numpy as np
import pytest

from experiments import shares
from kernels import model


def _case(dtype, blocks=1):
    config = model.ModelConfig(D=8, H=2, F=12, V=6, blocks=blocks)
    rng = np.random.default_rng(3)
    src, tgt = rng.integers(0, 4, (3, 5)), rng.integers(0, 4, (3, 4))
    return (src, tgt, model.init_params(config, seed=2, dtype=dtype, bias_std=0.1),
            model.embedding_table(config, dtype))


# Two implementations of the same two-block model, each summing in its own order: measured
# 14 u (float64) and 20 u (float32) of max |g| apart; the bounds are ~9000 u and ~170 u, far
# below any bug in the maths (order one) yet above reordering on other BLAS builds.
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_torch_model_has_the_labs_loss_and_gradients(dtype, tol):
    torch = pytest.importorskip("torch")
    from experiments import peers_torch
    src, tgt, params, embedding = _case(dtype, blocks=2)
    dloss = dtype(np.random.default_rng(5).standard_normal())  # a random upstream gradient
    loss, cache = model.model_forward(src, tgt, params, embedding=embedding)
    _, grads = model.model_backward(dloss, cache)
    tensors, (s, t), table = peers_torch.to_torch(params, src, tgt, embedding)
    t_loss = peers_torch.loss(s, t, tensors, table)
    t_grads = torch.autograd.grad(t_loss * float(dloss), list(tensors.values()))
    assert abs(float(t_loss.detach()) - float(loss)) <= tol * abs(float(loss))
    for key, g in zip(tensors, t_grads):
        scale = max(float(np.abs(grads[key]).max()), 1e-30)
        assert float(np.abs(g.numpy() - grads[key]).max()) <= tol * scale, key


def test_torch_adam_step_is_the_labs():
    pytest.importorskip("torch")
    from experiments import peers_torch
    from kernels.optim import adam_init, adam_step
    src, tgt, params, embedding = _case(np.float64)
    loss, cache = model.model_forward(src, tgt, params, embedding=embedding)
    lab, _ = adam_step(params, model.model_backward(1.0, cache)[1], adam_init(params), 1e-3)
    tensors, (s, t), table = peers_torch.to_torch(params, src, tgt, embedding)
    peers_torch.train_step(peers_torch.loss, tensors, peers_torch.adam_state(tensors), s, t, table)
    for key, p in tensors.items():
        np.testing.assert_allclose(p.detach().numpy(), lab[key], rtol=1e-12, atol=1e-15)


def test_layer_shares_time_every_layer_and_add_up_to_the_timed_step():
    src, tgt, params, embedding = _case(np.float64)

    def forward_backward():
        _, cache = model.model_forward(src, tgt, params, embedding=embedding)
        return model.model_backward(1.0, cache)[1]

    originals = {name: getattr(model, name) for name in shares.KERNELS}
    m = shares.measure((forward_backward, lambda grads: grads), repeats=1, warmup=0)
    assert {name: getattr(model, name) for name in shares.KERNELS} == originals  # restored
    layers = {layer for layer, _ in m}
    assert set(shares.LAYERS) <= layers
    parts = sum(v for (layer, _), v in m.items() if layer in shares.LAYERS + ("glue",))
    assert parts == pytest.approx(m[("timed step", "")], rel=1e-9)  # one repeat: an identity
    text = shares.format_shares({"tiny": m})
    assert all(layer in text for layer in shares.LAYERS)
