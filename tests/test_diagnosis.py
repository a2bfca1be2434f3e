"""The diagnosis names the bug shape that fits, the localisation names the axes, and a failing
report reads as a user needs it: which leg, how far off, what it looks like, where."""
import numpy as np
import pytest

import kernels
import reference
from checks import check_layer
from checks.verdict import Finding, Kind
from checks.diagnosis import NO_PATTERN, Context, constants_from, diagnose, locate

TOL = 1e-12
RNG = np.random.default_rng(7)
R = RNG.standard_normal((2, 4, 4))
OTHER = RNG.standard_normal((2, 4, 4))


def ctx(**kw):
    base = dict(trusted={"WQ": R, "WK": OTHER}, axes={"WQ": ("head", "row", "col")},
                constants=constants_from({"B": 3, "T": 5, "P": 6}, {"rate": 0.25}, [(3, 5, 6)]),
                masks=[], ids=[], dout=RNG.standard_normal((3, 5, 8)), slice_vjp=None)
    return Context(**{**base, **kw})


@pytest.mark.parametrize("g, phrase", [
    (np.zeros_like(R), "identically zero"),
    (-R, "wrong sign"),
    (2 * R, "scaled by a constant: 2 x"),
    (R / np.sqrt(6), "scaled by a constant: 1/sqrt(P) = 0.4082"),
    (15 * R, "scaled by a constant: B·T = 15"),
    (0.75 * R, "scaled by a constant: 1 - rate = 0.75"),
    (1.2345 * R, "1.234 (not a constant of this case)"),
    (R.transpose(0, 2, 1), "transposed per head"),
    (OTHER, "looks like dWQ and dWK are swapped"),
    (R + RNG.standard_normal(R.shape), NO_PATTERN),
])
def test_each_pattern_is_named(g, phrase):
    assert phrase in diagnose("WQ", g, R, ctx(), TOL)


def test_wrong_only_in_the_causal_triangle():
    scores = RNG.standard_normal((2, 3, 4, 4))   # (batch, head, query, key)
    g = scores + np.triu(RNG.standard_normal((4, 4)), k=1)  # wrong only for keys after the query
    c = ctx(trusted={"s": scores}, axes={"s": ("batch", "head", "query", "key")})
    assert "wrong only above the diagonal of (query, key)" in diagnose("s", g, scores, c, TOL)
    g_below = scores + np.tril(RNG.standard_normal((4, 4)), k=-1)
    assert "wrong only below the diagonal of (query, key)" in diagnose("s", g_below, scores, c, TOL)


def test_repeated_ids_assigned_not_accumulated():
    ids = np.array([[0, 2, 2], [3, 0, 1]])        # 0 and 2 repeat, 1 and 3 do not
    ref = RNG.standard_normal((5, 4))
    g = ref.copy()
    g[[0, 2]] *= 0.5
    c = ctx(trusted={"E": ref}, ids=[ids])
    assert "rows of repeated ids" in diagnose("E", g, ref, c, TOL)
    g[3] += 1  # a row that occurs once is wrong too: not that pattern
    assert "repeated ids" not in diagnose("E", g, ref, c, TOL)


def test_missing_sum_and_transposed_shapes():
    ref = RNG.standard_normal(6)
    per_token = RNG.standard_normal((5, 6))
    per_token[-1] = ref - per_token[:-1].sum(axis=0)
    assert "missing a sum over a broadcast axis" in diagnose("b", per_token, ref, ctx(), TOL)
    W = RNG.standard_normal((3, 5))
    assert "transpose of the expected" in diagnose("W", W.T.copy(), W, ctx(), TOL)


def test_heads_merged_with_the_wrong_transpose():
    ref = RNG.standard_normal((2, 3, 12))               # (B, T, D), D = H P with H = 2, P = 6
    g = ref.reshape(2, 3, 2, 6).swapaxes(-1, -2).reshape(2, 3, 12)
    c = ctx(trusted={"x": ref}, heads=2)
    assert "laid out as (P, H)" in diagnose("x", g, ref, c, TOL)
    assert "laid out" not in diagnose("x", g, ref, ctx(trusted={"x": ref}), TOL)  # H unknown


def test_skip_connection_dropped():
    dout = RNG.standard_normal((2, 3, 4))
    ref = RNG.standard_normal((2, 3, 4))
    c = ctx(trusted={"x": ref}, dout=dout)
    assert "skip connection" in diagnose("x", ref - dout, ref, c, TOL)


def test_location_with_and_without_axis_names():
    assert locate((0, 2, 3, 5), (1, 4, 8, 8), ("batch", "head", "query", "key")) == \
        "batch 0, head 2, query 3, key 5"
    assert locate((1, 2), (3, 4), None) == "index (1, 2)"      # a multi-index, never flat
    assert locate((1, 2), (3, 4), ("only one name",)) == "index (1, 2)"


def _attention_case(dtype=np.float64):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4, 12)).astype(dtype)  # the zoo's sizes: compiled once
    params = {k: (rng.standard_normal((2, 6, 6)) / 2.5).astype(dtype) for k in ("WQ", "WK", "WV")}
    params["WO"] = (rng.standard_normal((12, 12)) / 3.5).astype(dtype)
    return x, params


def test_failing_report_reads_as_a_user_needs_it():
    """`mha.WK  FAIL  hand vs autodiff 1.3e+00 (FD agrees with autodiff) — looks like dWK and
    dWQ are swapped ...; worst at head 0, row 3, col 5`, with the layer's axis names."""
    x, params = _attention_case(np.float32)

    def swapped(dout, cache):
        dx, grads = kernels.mha_backward(dout, cache)
        return dx, {**grads, "WQ": grads["WK"], "WK": grads["WQ"]}

    axes = {"x": ("batch", "token", "feature"), "WQ": ("head", "row", "col"),
            "WK": ("head", "row", "col")}
    report = check_layer(kernels.mha_forward, swapped, reference.mha, [x], params, name="mha",
                         axes=axes, input_names=("x",))
    assert report.failing == ["WQ", "WK"]
    line = next(l for l in str(report).splitlines() if l.startswith("mha.WK [float32]  FAIL"))
    wk = next(t for t in report.tensors if t.name == "WK")
    assert line.startswith(f"mha.WK [float32]  FAIL  hand vs autodiff {wk.hand_vs_autodiff:.1e}, "
                           f"{wk.score:.3g}x its tolerance (FD agrees with autodiff) — looks like "
                           "dWK and dWQ are swapped")
    h, r, c = wk.worst
    assert line.endswith(f"; worst at head {h}, row {r}, col {c}")


def test_scale_is_named_with_the_layer_sizes():
    x, params = _attention_case()

    def unscaled(dout, cache):
        dx, grads = kernels.mha_backward(dout, cache)
        return dx, {**grads, "WQ": grads["WQ"] * np.sqrt(6)}

    report = check_layer(kernels.mha_forward, unscaled, reference.mha, [x], params,
                         sizes={"B": 2, "T": 4, "D": 12, "H": 2, "P": 6})
    wq = next(t for t in report.tensors if t.name == "WQ")
    assert report.failing == ["WQ"] and "sqrt(P) = 2.449" in wq.diagnosis
    assert wq.location.startswith("index (")  # no axis names given


def test_fd_schemes_agree_on_a_correct_pair_and_catch_a_bug():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 4))
    params = {"W": rng.standard_normal((4, 4)), "b": rng.standard_normal(4)}
    wrong = lambda dy, c: (lambda dx, g: (dx, {**g, "W": g["W"].T}))(*kernels.linear_backward(dy, c))
    for fd in ("central", "richardson", "complex"):
        good = check_layer(kernels.linear_forward, kernels.linear_backward, reference.linear,
                           [x], params, fd=fd)
        bad = check_layer(kernels.linear_forward, wrong, reference.linear, [x], params, fd=fd)
        assert good.ok, (fd, str(good))
        assert bad.failing == ["W"] and "transposed" in bad.tensors[1].diagnosis, fd
        # the lab's kernels take real inputs only: the complex step then differentiates the
        # oracle, a self-check that cannot blame the hand leg
        expected = Kind.NO_TRIAGE if fd == "complex" else Kind.HAND_WRONG
        assert bad.tensors[1].verdict.kind is expected, fd
        assert (Finding.COMPLEX_STEP_ON_ORACLE in {n.finding for n in bad.notes}) == (fd == "complex")


def test_complex_step_on_a_hand_forward_that_takes_complex_inputs_is_an_independent_leg():
    """A user's kernel written with NumPy arithmetic takes complex inputs: the complex step then
    perturbs the hand forward, and an oracle bug is blamed on the oracle."""
    rng = np.random.default_rng(4)
    x, s = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    forward = lambda x, p: (x * p["s"], (x, p["s"]))
    backward = lambda dy, c: (dy * c[1], {"s": dy * c[0]})
    report = check_layer(forward, backward, lambda x, p: 2 * x * p["s"], [x], {"s": s},
                         fd="complex")
    assert not report.notes[:0] and all(n.finding is not Finding.COMPLEX_STEP_ON_ORACLE
                                        for n in report.notes)
    assert report.error_in == "" and not report.forward_ok
    assert {t.verdict.kind for t in report.tensors} == {Kind.ORACLE_WRONG}


def test_a_static_argument_ignored_is_named_and_only_a_flag_or_a_default_is_tried():
    from checks.engine import _other_statics

    def oracle(x, params, *, causal=False, offset=0, rate):
        return x
    assert list(_other_statics(oracle, {"causal": True, "offset": 3, "rate": 0.25})) == \
        [("causal", False), ("offset", 0)]
    assert list(_other_statics(oracle, {"offset": 0})) == []   # already the default
    other = [("causal = False (the case has causal = True)", {"WQ": OTHER})]
    assert "the right one for causal = False" in diagnose(
        "WQ", OTHER, R, ctx(trusted={"WQ": R}, other_static=lambda: other), TOL)
    assert NO_PATTERN in diagnose("WQ", R + 1, R, ctx(trusted={"WQ": R},
                                                      other_static=lambda: other), TOL)


def test_a_scale_near_one_is_named_by_its_difference_from_one():
    """A tensor off by 1 + 1.5e-6 (a float32 kernel's uniform bias) reads as that, not as "1"."""
    from checks.diagnosis import name_constant
    assert name_constant(1 + 1.5e-6, [], 1e-3).startswith("1 + 1.5e-06 ")
    assert name_constant(1 - 7e-5, [], 1e-3).startswith("1 - 7e-05 ")
    assert name_constant(1.05, [], 1e-3).startswith("1.05 ")
    assert name_constant(2.0, [(2.0, "2")], 1e-3) == "2"


def test_a_scale_names_every_declared_size_it_could_be():
    """A length two sizes share is named by both ('T or D'): the case cannot tell them apart.
    A small number stays the number (the 0.5 of GELU dropped is no mean over B = 2)."""
    from checks.diagnosis import constants_from, name_constant
    constants = constants_from({"B": 2, "T": 5, "D": 5, "H": 7}, {}, [(2, 5, 5)])
    assert name_constant(0.5, constants, 1e-9) == "1/2"
    assert name_constant(5.0, constants, 1e-9) == "T or D = 5"
    assert name_constant(0.2, constants, 1e-9) == "1/(T or D) = 0.2"
    assert name_constant(4.0, constants, 1e-9) == "4"             # no size of this case is 4
    assert name_constant(7.0, constants, 1e-9) == "7 (not a constant of this case)"  # H unused
