"""Sparse cross-entropy on logits with integer targets, mean over every position."""
from typing import NamedTuple

from kernels.activations import per_row, row_max, row_sum
from kernels.backend import array_module, check_float, check_ids, check_params
from kernels.precision import half_precision_backward, half_precision


class CrossEntropyCache(NamedTuple):
    probs: object    # (..., V) softmax of the logits
    targets: object  # (...) integer targets


@half_precision
def cross_entropy_forward(logits, targets, params):
    """loss = mean over positions of -log softmax(logits)[target].  logits: (..., V)."""
    check_float("logits", logits)
    check_ids("targets", targets, logits.shape[-1])
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"targets: expected shape {tuple(logits.shape[:-1])} (logits without V), "
                         f"got {tuple(targets.shape)}")
    check_params("cross_entropy", params, {}, logits.dtype)
    xp = array_module(logits)
    V = logits.shape[-1]
    shifted = logits - row_max(logits)                                     # (..., V)
    log_z = row_sum(xp.exp(shifted))                                       # (..., 1) then in place:
    xp.log(log_z, out=log_z)
    log_p = shifted                                                        # (..., V) log-softmax, in place
    log_p -= per_row(log_z, V)
    picked = log_p.reshape(-1)[xp.arange(targets.size) * V + targets.reshape(-1)]  # (N,) at the targets
    loss = -picked.mean()                                                  # () scalar
    return loss, CrossEntropyCache(xp.exp(log_p), targets)


@half_precision_backward
def cross_entropy_backward(dloss, cache):
    """dlogits = dloss * (softmax - onehot) / N, N = number of positions (B * T)."""
    xp = array_module(cache.probs)
    probs, targets = cache
    V = probs.shape[-1]
    onehot = targets[..., None] == xp.arange(V)                 # (..., V) boolean
    scale = xp.asarray(dloss, dtype=probs.dtype) / targets.size  # () upstream over N positions
    dlogits = (probs - onehot) * scale                           # (..., V)
    return (dlogits, None), {}  # targets are not differentiable
