"""The lab's layers in jax.numpy, forward only: the autodiff oracle.

Same function names as ``kernels`` without the ``_forward`` suffix, same parameter names and
shapes.  Gradients always come from ``jax.vjp`` / ``jax.grad``, never written by hand.  This
package imports nothing from ``kernels``: an oracle that shared the kernels' code would share
their bugs.
"""
from reference.layers import (cross_entropy, dropout, embedding, ff, layernorm, leaky_relu, linear,
                              mha, mhca, posenc, qknorm_mhca, rms_norm,
                              softmax)
from reference.transformer import model

__all__ = sorted(name for name, value in globals().items()   # one list: the oracles imported
                 if callable(value) and not name.startswith("_"))
