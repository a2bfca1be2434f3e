"""A step of a hand backward that reads the wrong tensor: the substitution columns of the oracle's
program (checks.substitution) and the diagnosis that names the two tensors."""
import jax.numpy as jnp
import numpy as np
import pytest

from checks.engine import check_layer
from checks.substitution import Substitutions

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 5))
W = {"w": RNG.standard_normal(5), "V": RNG.standard_normal((5, 5))}


def gated_oracle(x, params):
    """y = tanh(x) * w, then a product with V: a value, an element-wise product, a matmul."""
    return (jnp.tanh(x) * params["w"]) @ params["V"]


def gated_forward(x, params):
    t = np.tanh(x)                                        # (N, D)
    h = t * params["w"]                                   # (N, D)
    return h @ params["V"], (x, t, h, params)


def gated_backward(dy, cache, *, dw_from="t", dh_from="dh", dx_is=None, gain=True):
    x, t, h, params = cache
    dh = dy @ params["V"].T                               # (N, D)
    dV = h.T @ dy                                         # (D, D)
    dt = dh * params["w"] if gain else dh                 # (N, D)
    tensors = {"t": t, "x": x, "dh": dh, "dy": dy, "one": 1.0}
    dw = (tensors[dh_from] * tensors[dw_from]).sum(axis=0)  # (D,)
    dx = tensors[dx_is] if dx_is else dt * (1 - t * t)    # (N, D)
    return dx, {"w": dw, "V": dV}


def _check(**bug):
    report = check_layer(gated_forward, lambda d, c: gated_backward(d, c, **bug), gated_oracle,
                         [X], W, name="gated", input_names=("x",))
    return report


def _only_w_fails(**bug):
    """The diagnosis of the one failing tensor, w, of ``_check(**bug)``."""
    report = _check(**bug)
    bad = {t.name: t for t in report.tensors if not t.ok}
    assert set(bad) == {"w"}, str(report)
    return bad["w"].diagnosis


def test_a_correct_backward_passes_and_is_not_diagnosed():
    report = _check()
    assert report.ok
    assert all(not t.diagnosis for t in report.tensors)


def test_the_input_read_in_place_of_a_forward_value_is_named():
    """dw = sum(dh * x) for sum(dh * tanh(x)): the product's other operand is the input x."""
    text = _only_w_fails(dw_from="x")
    assert "reads the input x in place of the other operand" in text
    assert "`mul`" in text and "jnp.tanh(x) * params[\"w\"]" in text


def test_past_the_work_cap_no_substitution_is_searched_and_the_bug_is_still_the_hands(
        monkeypatch):
    """Substitutions x cotangent elements above MAX_COTANGENT_WORK (an attention layer at the
    article's size: 942 x 755,712) are not searched: the check still fails w on the hand,
    without naming the substitution the search names below the cap."""
    import checks.substitution as substitution
    from checks.verdict import Kind
    monkeypatch.setattr(substitution, "MAX_COTANGENT_WORK", 0)
    monkeypatch.setattr(substitution, "_BUILT", substitution.collections.OrderedDict())
    report = _check(dw_from="x")
    bad = {t.name: t for t in report.tensors if not t.ok}
    assert set(bad) == {"w"} and bad["w"].verdict.kind is Kind.HAND_WRONG, str(report)
    assert "reads the input x" not in bad["w"].diagnosis


def test_a_gradient_read_in_place_of_the_step_upstream_gradient_is_named():
    """dw = sum(dy * tanh(x)): the layer's dout where the step's own upstream gradient
    (dh = dy V^T, the cotangent of the product) belongs."""
    text = _only_w_fails(dh_from="dy")
    assert "reads the upstream gradient dout of the layer in place of the upstream " \
           "gradient of that step" in text


DOUT = RNG.standard_normal((3, 5))


@pytest.fixture(scope="module")
def gated():
    """The gated layer's substitutions and their columns, built once."""
    s = Substitutions(lambda d, p: gated_oracle(d[0], p), [X], W, DOUT, ["x"])
    return s, s.columns()


def test_columns_are_the_hand_error_of_the_substitution_exactly(gated):
    """The column of 'w's path reads x for tanh(x)' is sum over rows of dh (x - tanh(x)), to
    float64 rounding; the other tensors' columns are zero (the error stays in dw)."""
    s, (cin, cpar) = gated
    k = next(i for i, sub in enumerate(s.subs) if sub.kind == "operand"
             and sub.primitive == "mul" and sub.alt.kind == "input" and sub.operand == 1)
    dh = DOUT @ W["V"].T
    expected = np.sum(dh * (X - np.tanh(X)), axis=0)
    np.testing.assert_allclose(cpar["w"][k], expected, rtol=0, atol=1e-12 * np.abs(expected).max())
    assert np.all(cin[0][k] == 0) and np.all(cpar["V"][k] == 0)


def test_columns_built_a_few_substitutions_at_a_time_are_the_same(gated, monkeypatch):
    """Chunks of one or three substitutions (the last one padded) give the columns of one chunk:
    which substitutions share a run changes nothing but the memory held."""
    import checks.substitution as substitution
    s, (cin, cpar) = gated
    for elements in (1, 3 * s.cotangent_elements()):
        monkeypatch.setattr(substitution, "CHUNK_ELEMENTS", elements)
        cin2, cpar2 = s.columns()
        for a, b in [*zip(cin.values(), cin2.values()), *zip(cpar.values(), cpar2.values())]:
            assert a.shape == b.shape
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14 * np.abs(a).max())


@pytest.mark.parametrize("kind", ["value", "cotangent", "operand", "skipped"])
def test_no_substitution_replaces_a_tensor_by_itself(gated, kind):
    """A candidate equal to the tensor it replaces would give a zero column: none is made."""
    s, (cin, cpar) = gated
    for k, sub in enumerate(s.subs):
        if sub.kind == kind:
            total = sum(float(np.abs(c[k]).max()) for c in [*cin.values(), *cpar.values()])
            assert total > 0, sub


def test_another_tensor_returned_whole_is_named():
    """dx = dh (the gradient of the product's result) returned in place of dx."""
    text = next(t for t in _check(dx_is="dh").tensors if not t.ok).diagnosis
    assert "the hand dx is the gradient of" in text and "another tensor returned in place " \
        "of dx" in text


def test_a_factor_of_a_product_left_out_is_named_by_its_source():
    """dw = sum(dh) for sum(dh * tanh(x)): the path into w reads 1 in place of the other
    operand, tanh(x)."""
    text = _only_w_fails(dw_from="one")
    assert "reads 1 (a factor left out) in place of the other operand" in text
    assert "of `mul`" in text and "(`jnp.tanh(x) * params[\"w\"]`)" in text


def test_a_field_of_the_hand_cache_read_in_place_of_dout_is_named():
    """A layer norm's backward written with the normalised x (``xhat``), a value the oracle
    never forms (it computes g (x - mean) / sqrt(var + eps)): dxhat = xhat g for dy g is named
    by the hand forward's cached field, a candidate beside the program's own tensors."""
    from checks.registry import BY_NAME, run_row
    from kernels import layernorm as L

    def backward(dy, cache):
        dx = L.standardise_backward(cache.xhat * cache.g, cache.xhat, cache.inv_std)
        D = dy.shape[-1]
        return dx, {"g": (dy * cache.xhat).reshape(-1, D).sum(axis=0),
                    "b": dy.reshape(-1, D).sum(axis=0)}
    report = run_row(BY_NAME["layernorm"], np.float64, backward=backward)
    bad = {t.name: t for t in report.tensors if not t.ok}
    assert set(bad) == {"x"}, str(report)
    assert "the hand's cached `xhat` (a field of its forward's cache)" in bad["x"].diagnosis, \
        bad["x"].diagnosis


def test_the_hand_cache_fields_are_named_and_only_float_arrays_kept():
    from collections import namedtuple
    from checks.substitution import cached_arrays
    Cache = namedtuple("Cache", "y inv ids scale")
    y = np.ones((2, 3), np.float32)
    got = cached_arrays(Cache(y, np.ones((2, 1)), np.arange(3), 0.5))
    assert [name for name, _ in got] == ["y", "inv"]
    assert got[0][1].dtype == np.float64 and np.array_equal(got[0][1], y)
    assert [name for name, _ in cached_arrays((y, None, {"a": y}))] == ["cache[0]"]
    assert cached_arrays(object()) == [] and cached_arrays(None) == []


def test_a_cached_field_equal_to_an_input_is_named_as_the_input():
    """The gated layer caches x itself: reading it is named as the input, not as the field."""
    text = _only_w_fails(dw_from="x")
    assert "reads the input x in place of the other operand" in text
    assert "cached" not in text


def test_a_tensor_factor_taken_too_often_or_left_out_is_named():
    """db = sum(dy g) for sum(dy) (the gain applied to the bias gradient): the hand db is the
    right one times g, element by element; and the times pattern never fits a right gradient
    nor a constant factor (a scale, named before it)."""
    from checks.registry import BY_NAME, run_row
    from checks.substitution import Tensor, times
    from kernels import layernorm as L

    def backward(dy, cache):
        dx, grads = L.layernorm_backward(dy, cache)
        return dx, {**grads, "b": (dy * cache.g).reshape(-1, dy.shape[-1]).sum(axis=0)}
    report = run_row(BY_NAME["layernorm"], np.float64, backward=backward)
    bad = {t.name: t for t in report.tensors if not t.ok}
    assert set(bad) == {"b"}, str(report)
    assert "the hand db is the right gradient times the input g, element by element" \
        in bad["b"].diagnosis, bad["b"].diagnosis
    ref, f = RNG.standard_normal(6), RNG.standard_normal(6)
    tensors = [(Tensor("input", "", "", "f", 0), f), (Tensor("one", "", "", "", 0), np.full(6, 2.0))]
    assert times(ref * f, ref, tensors, 1e-8)[1] is True
    assert times(ref / f, ref, tensors, 1e-8)[1] is False
    assert times(ref, ref, tensors, 1e-8) is None and times(2 * ref, ref, tensors, 1e-8) is None


def test_a_step_with_no_line_of_the_oracles_own_is_said_so_in_a_sentence():
    """A value inside a library function the oracle calls (jax.nn.silu) has no source text:
    the description names its primitive and says why no line is given."""
    from checks.substitution import UNPLACED, Tensor
    value = Tensor("value", "mul", "", "", 0)
    assert value.describe() == f"the forward value of a `mul`{UNPLACED}"
    cotangent = Tensor("cotangent", "mul", "", "", 0)
    assert cotangent.describe() == \
        f"the gradient of the result of a `mul`{UNPLACED} (its cotangent)"
    placed = Tensor("value", "mul", "oracle.py:3", "h * s", 0)
    assert placed.describe() == "the forward value `h * s` at oracle.py:3"


def silu_gated_forward(x, params):
    u, h = x @ params["W1"], x @ params["W3"]             # (N, F) value and gate
    s = 1 / (1 + np.exp(-h))                              # (N, F) sigmoid(h)
    return (u * (h * s)) @ params["W2"], (x, u, h, s, params)


def silu_gated_backward(dy, cache):
    """The bug: silu's derivative s (1 + h (1 - s)) written with silu(h) = h s in place of h."""
    x, u, h, s, params = cache
    dg = dy @ params["W2"].T                              # (N, F)
    du = dg * (h * s)                                     # (N, F)
    dh = dg * u * (s * (1 + (h * s) * (1 - s)))           # (N, F) the bug: h s read for h
    return du @ params["W1"].T + dh @ params["W3"].T, \
        {"W1": x.T @ du, "W3": x.T @ dh, "W2": (u * h * s).T @ dy}


def test_a_step_inside_a_library_function_is_placed_at_the_oracles_call_of_it():
    """The oracle calls jax.nn.silu, whose steps have no line of the oracle's own: the
    diagnosis names the step by the line that calls it and the call's expression."""
    import jax
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 4))
    params = {"W1": rng.standard_normal((4, 5)) / 2, "W3": rng.standard_normal((4, 5)) / 2,
              "W2": rng.standard_normal((5, 4)) / 2}

    def oracle(x, params):
        return (x @ params["W1"] * jax.nn.silu(x @ params["W3"])) @ params["W2"]
    report = check_layer(silu_gated_forward, silu_gated_backward, oracle, [x], params,
                         input_names=("x",))
    bad = {t.name: t for t in report.tensors if not t.ok}
    assert set(bad) == {"x", "W3"}, str(report)
    for t in bad.values():
        assert "inside `jax.nn.silu(x @ params[\"W3\"])`" in t.diagnosis, t.diagnosis
        assert "test_substitution.py:" in t.diagnosis and "no line of its own" not in t.diagnosis

    def sign_flipped(dy, cache):  # s (1 - h (1 - s)): a sign flipped inside silu's derivative
        x, u, h, s, params = cache
        dg = dy @ params["W2"].T
        du, dh = dg * (h * s), dg * u * (s * (1 - h * (1 - s)))
        return du @ params["W1"].T + dh @ params["W3"].T, \
            {"W1": x.T @ du, "W3": x.T @ dh, "W2": (u * h * s).T @ dy}
    report = check_layer(silu_gated_forward, sign_flipped, oracle, [x], params,
                         input_names=("x",))
    for t in (t for t in report.tensors if not t.ok):   # the scale attribution's sentence
        assert "the path through `logistic` at " in t.diagnosis \
            and "inside `jax.nn.silu(x @ params[\"W3\"])` has the wrong sign" in t.diagnosis, \
            t.diagnosis
