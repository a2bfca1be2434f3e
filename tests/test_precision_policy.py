"""The half-precision policy of every layer (kernels.precision): a float16 or bfloat16 call is
exactly the layer's float32 code on the exactly upcast inputs, with what it returns rounded once
to the input's format — no other rounding anywhere, forward or backward."""
import numpy as np
import pytest

from checks.registry import ROWS
from kernels.precision import round_to, upcast

LAYERS = [row for row in ROWS if row.name != "model"]


def _floats(tree):
    if isinstance(tree, dict):
        return [a for v in tree.values() for a in _floats(v)]
    if isinstance(tree, (tuple, list)):
        return [a for v in tree for a in _floats(v)]
    return [tree] if hasattr(tree, "dtype") and tree.dtype.kind in "fV" else []


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("row", LAYERS, ids=lambda r: r.name)
def test_a_half_precision_call_is_the_float32_code_rounded_once(row, fmt):
    fmt = np.dtype(fmt)
    rng = np.random.default_rng(0)
    inputs, params, static = row.case(rng, fmt)
    out, cache = row.forward(*inputs, params, **static)
    inputs32 = [upcast(x, fmt) for x in inputs]
    params32 = {k: upcast(v, fmt) for k, v in params.items()}
    out32, cache32 = row.forward(*inputs32, params32, **static)
    assert out.dtype == fmt
    assert np.array_equal(np.asarray(out), np.asarray(round_to(out32, fmt)))
    dout = rng.standard_normal(np.shape(out)).astype(fmt)          # a random upstream gradient
    grads = row.backward(dout, cache)
    grads32 = round_to(row.backward(dout.astype(np.float32), cache32), fmt)
    half, exact = _floats(grads), _floats(grads32)
    assert half and len(half) == len(exact)
    for a, b in zip(half, exact):
        assert a.dtype == fmt and np.array_equal(a, b)
