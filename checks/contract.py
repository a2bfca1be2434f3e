"""What a user's forward, backward and oracle must give the checker, and one sentence for each
way a call can miss it, naming what was expected and what came.

    forward(*inputs, params, **static) -> (out, cache)
    backward(dout, cache)              -> (input gradients, {parameter name: gradient})
    oracle(*inputs, params, **static)  -> out, the forward's output (same shape, a float dtype)

The engine calls these at its edges (``checks.engine``), so a user's mistake is reported as
that mistake, not as an error deeper inside the check (a bare array given as ``inputs`` would
otherwise be split along its first axis into many inputs).
"""
from __future__ import annotations

import numpy as np


def _describe(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"an array of shape {tuple(shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} value{'' if len(value) == 1 else 's'}"
    return f"a {type(value).__name__}"


def inputs_list(inputs) -> list:
    """``inputs`` as a list; a bare array is a TypeError (check_layer(..., [x], ...) is meant)."""
    if hasattr(inputs, "shape") and hasattr(inputs, "dtype"):
        raise TypeError(f"inputs: expected a list of the forward's positional inputs ([x] for a "
                        f"layer with one input), got {_describe(inputs)}")
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(f"inputs: expected a list of the forward's positional inputs, got "
                        f"{_describe(inputs)}")
    return list(inputs)


def _is_jax_array(value) -> bool:
    """A JAX array (jax.Array, a tracer): jax is imported only when the value's type is JAX's."""
    if not type(value).__module__.startswith(("jax", "jaxlib")):
        return False
    import jax
    return isinstance(value, jax.Array)


def hand_arrays(names, inputs, params) -> None:
    """The hand pair runs on the given arrays, so they must be NumPy or CuPy ones: a JAX array
    would run the "hand" kernel through XLA (its products and sums are JAX's), and the check
    would compare autodiff with JAX's own arithmetic, agreeing whatever the kernel's maths."""
    tensors = list(zip(names, inputs)) + [(f"params[{k!r}]", v) for k, v in params.items()]
    jax_ones = [name for name, value in tensors if _is_jax_array(value)]
    if jax_ones:
        raise TypeError(f"{', '.join(jax_ones)}: expected NumPy (or CuPy) arrays for the hand "
                        f"kernels, got JAX arrays: the hand pair would run through JAX, not "
                        f"as written; pass numpy.asarray(x) (the oracle gets its own copy)")


def axis_lengths(arrays) -> set:
    """Every axis length of the given arrays: what a named size of their case can be."""
    return {int(n) for a in arrays for n in np.shape(a)}


def named_sizes(sizes) -> None:
    """``sizes``: None or a dict of names (str) to positive integers."""
    if sizes is None:
        return
    if not isinstance(sizes, dict):
        raise TypeError(f"sizes: expected a dict of size names to integers ({{'B': 4, 'H': 2}}), "
                        f"got {_describe(sizes)}")
    wrong = [f"{k!r}: {v!r}" for k, v in sizes.items()
             if not isinstance(k, str) or isinstance(v, (bool, np.bool_))
             or not isinstance(v, (int, np.integer)) or v < 1]
    if wrong:
        raise ValueError(f"sizes: expected names (str) of positive integers, got "
                         f"{', '.join(wrong)}")


def forward_result(result):
    """(out, cache) from what the forward returned."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise TypeError(f"the forward returned {_describe(result)}; expected a tuple (out, "
                        f"cache): the output and what the backward needs")
    return result


def backward_result(result):
    """(input gradients, parameter gradients) from what the backward returned."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise TypeError(f"the backward returned {_describe(result)}; expected a tuple of 2: "
                        f"(the input gradients, a dict of the parameter gradients)")
    return result


def backward_takes(backward, cache, out) -> bool:
    """Whether the hand backward takes an upstream gradient of the forward's own output shape
    (and returns a well-formed result): when the forward and the oracle disagree on the output's
    shape, a hand pair consistent with itself puts the fault on the oracle."""
    try:
        backward_result(backward(out * 0 + 1, cache))
    except Exception:
        return False
    return True


def oracle_output(oracle_shape, oracle_dtype, out_shape) -> str | None:
    """The oracle's fault, in one sentence, when its output cannot be the forward's; else None.
    The oracle runs in float64 (``jax_enable_x64``): any other dtype means it casts inside."""
    oracle_shape, out_shape = tuple(oracle_shape), tuple(out_shape)
    if oracle_shape != out_shape:
        return (f"the oracle returned shape {oracle_shape}, the forward {out_shape}: an oracle "
                f"returns the forward's output (its first value), the same shape")
    dtype = np.dtype(oracle_dtype)
    if dtype != np.float64:
        return (f"the oracle returned {dtype} for float64 inputs: it must compute in the dtype "
                f"it is given (a cast inside it, astype or jnp.float32, loses the precision the "
                f"check relies on)")
    return None
