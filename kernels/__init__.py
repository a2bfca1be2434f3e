"""Hand-derived forward/backward kernels for every layer of the lab's transformer.

Notation used in every shape comment of this package:

    B  batch                    T  tokens (decoder side: T + 1 with Start)
    S  encoder tokens (cross-attention keys and values)
    D  model width              H  heads            P = D / H  head width
    F  feed-forward width (4 D by default)          V  vocabulary size

Contract (docs/adding-a-layer.md): each layer family lives in one module, ``*_forward`` directly
above ``*_backward``.  ``name_forward(*inputs, params, **static) -> (out, cache)`` and
``name_backward(dout, cache) -> (dinputs, grads)`` where ``grads`` has exactly the keys of
``params`` and ``dinputs`` is the gradient of the single differentiable input, a tuple in
input order when there are several, and ``None`` for token ids.  Functions are pure, keep
the dtype of their inputs and take the array module (NumPy or CuPy) from their inputs.
"""
from kernels.activations import (leaky_relu_backward, leaky_relu_forward,
                                 softmax_backward, softmax_forward)
from kernels.attention import (mha_backward, mha_forward, mhca_backward, mhca_forward,
                               qknorm_mhca_backward, qknorm_mhca_forward)
from kernels.dropout import dropout_backward, dropout_forward
from kernels.embedding import embedding_backward, embedding_forward, orthogonal_embedding
from kernels.feedforward import ff_backward, ff_forward
from kernels.layernorm import layernorm_backward, layernorm_forward
from kernels.linear import linear_backward, linear_forward
from kernels.loss import cross_entropy_backward, cross_entropy_forward
from kernels.norm import rms_norm_backward, rms_norm_forward
from kernels.positional import positional_encoding, posenc_backward, posenc_forward

__all__ = [name for name in dir() if not name.startswith("_")]
