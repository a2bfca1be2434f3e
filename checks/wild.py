"""Cases as users bring them: plain random inputs, nothing placed, and planted localised bugs.

The registry's rows draw inputs from each layer's domain; a user draws x ~ N(0, 1) and weights
of scale 1/sqrt(fan-in) and checks.  These cases are written apart from the kernels (nothing
here knows where a kink lies), for the checker's own tests and ``calibrate --wild``.

``plant`` wraps a correct backward so that one tensor's gradient carries a localised bug: one
element scaled by 1.5, one element negated, or one row (the first axis's slice) scaled by 1.05,
at an element whose gradient is at least the tensor's median magnitude (a bug on a gradient that
is zero is no bug at all).
"""
from __future__ import annotations

import numpy as np

BUGS = ("x1.5", "negated", "row x1.05")


def plain_ff(rng, dtype, B=8, T=64, D=128, F=512):
    """A feed-forward layer's (x, params) as a user draws them: standard-normal x, weights of
    scale 1/sqrt(fan-in), biases of scale 0.1; nothing kept away from leaky ReLU's kink."""
    normal = lambda shape, scale=1.0: (scale * rng.standard_normal(shape)).astype(dtype)
    return normal((B, T, D)), {"W1": normal((D, F), 1 / np.sqrt(D)), "b1": normal((F,), 0.1),
                               "W2": normal((F, D), 1 / np.sqrt(F)), "b2": normal((D,), 0.1)}


def plant(backward, tensor, bug, seed, input_names=("x",)):
    """backward with one localised bug (``BUGS``) in the gradient of `tensor` (an input's name
    or a parameter's key), at an element chosen by `seed`."""
    if bug not in BUGS:
        raise ValueError(f"bug: expected one of {BUGS}, got {bug!r}")

    def planted(dout, cache):
        dinputs, dparams = backward(dout, cache)
        single = not isinstance(dinputs, (tuple, list))
        dinputs = [dinputs] if single else list(dinputs)
        if tensor in input_names:
            i = list(input_names).index(tensor)
            dinputs[i] = _broken(dinputs[i], bug, seed)
        else:
            dparams = {**dparams, tensor: _broken(dparams[tensor], bug, seed)}
        return (dinputs[0] if single else tuple(dinputs)), dparams
    return planted


def _broken(g, bug, seed):
    g = np.array(g)
    flat = np.abs(g.astype(np.float64)).reshape(-1)
    large = np.flatnonzero(flat >= np.median(flat))
    at = np.unravel_index(int(np.random.default_rng(seed).choice(large)), g.shape)
    if bug == "x1.5":
        g[at] = g[at] * 1.5
    elif bug == "negated":
        g[at] = -g[at]
    else:
        g[at[0]] = g[at[0]] * 1.05
    return g
