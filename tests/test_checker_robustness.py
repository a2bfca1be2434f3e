"""A broken kernel or oracle gives a failing report naming what is wrong, never a crash; no
non-finite value passes; the checker's draws never touch the global RNG; the CLI fails cleanly."""
import math

import numpy as np
import jax.numpy as jnp
import pytest

import kernels
import reference
from checks import check_layer
from checks.__main__ import main
from checks.verdict import Finding, Kind, Verdict


def case(dtype=np.float64):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 6)).astype(dtype)
    params = {"W": rng.standard_normal((6, 5)).astype(dtype),
              "b": rng.standard_normal(5).astype(dtype)}
    return x, params


def check(backward=kernels.linear_backward, forward=kernels.linear_forward,
          oracle=reference.linear, dtype=np.float64, **kw):
    x, params = case(dtype)
    return check_layer(forward, backward, oracle, [x], params, name="linear", **kw)


def patched(**changes):
    """linear_backward with some gradients replaced: changes maps key -> f(grads) or None."""
    def backward(dy, cache):
        dx, grads = kernels.linear_backward(dy, cache)
        grads = dict(grads)
        for key, f in changes.items():
            if f is None:
                grads.pop(key)
            else:
                grads[key] = f(grads, dx)
        return dx, grads
    return backward


def test_wrong_shape_is_a_failing_report_naming_the_tensor():
    report = check(patched(W=lambda g, dx: g["W"][:, :4]))
    assert report.failing == ["W"]
    assert report.tensors[1].verdict == Verdict(Kind.MISSHAPEN, "(6, 4), expected (6, 5)")
    assert "wrong shape: (6, 4), expected (6, 5)" in str(report)


def test_missing_and_extra_gradient_keys():
    report = check(patched(b=None, c=lambda g, dx: g["W"]))
    assert report.failing == ["b", "c"]
    assert report.tensors[2].verdict.kind is Kind.NO_GRADIENT
    assert report.tensors[3].verdict == Verdict(Kind.EXTRA_GRADIENT, "'c' is not a parameter")


def test_wrong_dtype_and_wrong_number_of_input_gradients():
    assert check(patched(b=lambda g, dx: g["b"].astype(np.float32))).failing == ["b"]
    report = check(lambda dy, c: ((kernels.linear_backward(dy, c)[0],) * 2, {}))
    assert report.failing == ["backward"] and "expected a tuple of 1" in report.error


@pytest.mark.parametrize("part", ["forward", "backward", "oracle"])
def test_a_raising_part_is_named(part):
    def boom(*args, **kwargs):
        raise RuntimeError("boom")
    report = check(**{part: boom})
    assert not report.ok and report.failing == [part]
    assert "RuntimeError: boom" in report.error and part in str(report)


def test_a_backward_raising_in_both_formats_prints_its_traceback_once():
    from checks.report import format_table

    def boom(dy, cache):
        raise ValueError("matmul: size 12 is different from 8")
    reports = [check(backward=boom, dtype=d) for d in (np.float64, np.float32)]
    text = format_table(reports)
    assert text.count("Traceback") == 1, text
    assert "linear.backward [float32]  FAIL  the same error as in float64 above" in text, text


def test_forward_output_of_the_wrong_shape_or_dtype():
    report = check(forward=lambda x, p: (kernels.linear_forward(x, p)[0][:, :2],
                                         kernels.linear_forward(x, p)[1]))
    assert report.failing == ["forward"] and "shape" in report.error
    report = check(forward=lambda x, p: (lambda y, c: (y.astype(np.float32), c))(
        *kernels.linear_forward(x, p)))
    assert report.failing == ["forward"] and "dtype float32" in report.error


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_hand_gradient_never_passes(bad):
    def poisoned(g, dx):
        w = g["W"].copy()
        w[1, 2] = bad
        return w
    report = check(patched(W=poisoned))
    assert report.failing == ["W"]
    assert report.tensors[1].verdict == Verdict(Kind.NON_FINITE, "in the hand leg")


def test_non_finite_forward_and_oracle_are_reported():
    def nan_forward(x, p):
        y, cache = kernels.linear_forward(x, p)
        return np.where(np.arange(y.size).reshape(y.shape) == 3, np.nan, y), cache
    report = check(forward=nan_forward)
    assert not report.ok and report.error_in == "forward"
    assert "non-finite values in the hand forward: 1 NaN, 0 Inf" in report.error
    report = check(oracle=lambda x, p: jnp.log(x - 10.0) @ p["W"] + p["b"])
    assert not report.ok and report.failing == ["oracle"]
    assert "non-finite values in the oracle" in report.error


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_non_finite_inputs_never_pass():
    x, params = case()
    x[0, 0, 0] = np.inf
    report = check_layer(kernels.linear_forward, kernels.linear_backward, reference.linear,
                         [x], params)
    assert not report.ok and "non-finite" in report.error


def test_a_forward_computing_in_float32_gets_a_note_not_a_failure():
    def forward32(x, p):
        y, cache = kernels.linear_forward(x.astype(np.float32),
                                          {k: v.astype(np.float32) for k, v in p.items()})
        return y.astype(np.float64), cache

    def backward32(dy, cache):
        dx, grads = kernels.linear_backward(dy.astype(np.float32), cache)
        return dx.astype(np.float64), {k: g.astype(np.float64) for k, g in grads.items()}

    report = check(backward32, forward32)
    assert report.ok, str(report)
    assert {n.finding for n in report.notes} == {Finding.LOW_PRECISION_FORWARD,
                                                Finding.LOW_PRECISION_BACKWARD}
    assert "lower precision than its float64 inputs" in str(report)
    # and a real bug in such a kernel is still caught
    bad = check(lambda dy, c: (lambda dx, g: (dx, {**g, "b": -g["b"]}))(*backward32(dy, c)),
                forward32)
    assert bad.failing == ["b"] and "wrong sign" in bad.tensors[2].diagnosis


def test_a_small_error_in_a_float64_forward_is_not_excused_as_float32():
    """An error of float32's size that is not float32 rounding (here a bias off by 1e-7) fails."""
    def nudged(x, p):
        y, cache = kernels.linear_forward(x, {**p, "b": p["b"] + 1e-7})
        return y, cache
    report = check(forward=nudged)
    assert "forward" in report.failing and not report.note


def test_kink_makes_finite_differences_unreliable_not_a_failure():
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    x[0, 0, 0] = 0.0  # leaky ReLU's kink, inside the FD step
    report = check_layer(kernels.leaky_relu_forward, kernels.leaky_relu_backward,
                         reference.leaky_relu, [x], {})
    assert report.ok
    assert "finite differences unreliable here" in report.tensors[0].note
    assert "kink" in report.tensors[0].note


def test_a_width_below_the_default_heads_is_a_size_of_rows_without_heads(capsys):
    """D = 1 with the default H = 2: no head width P (it was 0, refused as a size)."""
    assert main(["--layer", "linear", "--sizes", "D=1", "--dtype", "float64"]) == 0
    assert "1 of 1 layer checks agree" in capsys.readouterr().out


def test_checker_never_touches_the_global_rng_and_is_deterministic():
    np.random.seed(1234)
    before = np.random.get_state()
    first = check(patched(W=lambda g, dx: 2 * g["W"]), seed=3).to_dict()
    after = np.random.get_state()
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert check(patched(W=lambda g, dx: 2 * g["W"]), seed=3).to_dict() == first


@pytest.mark.parametrize("argv", [["--layer", "nope"], ["steps", "nope"], ["--dtype", "f16"],
                                  ["calibrate", "--seeds", "x"], ["calibrate", "--seeds", "0"],
                                  ["steps"], ["--bogus"], ["zoo", "extra"],
                                  ["--layer", "leaky_relu", "--fd", "complex"]])
def test_cli_errors_are_one_line_and_status_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("python -m checks")


def test_a_gradient_identically_zero_is_no_non_finite_value():
    """y = x^3 at x = 0: the three legs' gradients are 0, FD's up to its O(h^2) truncation.
    That is FD's step, not a non-finite value (before: "non-finite values: in the finite
    differences", from an error relative to a zero scale)."""
    report = check_layer(lambda x, p: (x ** 3, (x,)),
                         lambda dy, cache: (3 * cache[0] ** 2 * dy, {}),
                         lambda x, p: x ** 3, [np.zeros((3, 4))], {})
    assert report.ok and "non-finite" not in str(report), str(report)


def test_an_oracle_that_ignores_a_parameter_is_blamed_not_reported_non_finite():
    """The oracle's layer norm uses gain 1 instead of params['g']: autodiff's dg is
    identically zero, FD sides with the hand, and the oracle is blamed."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 8))
    params = {"g": 1 + 0.1 * rng.standard_normal(8), "b": rng.standard_normal(8)}
    report = check_layer(kernels.layernorm_forward, kernels.layernorm_backward,
                         lambda x, p: reference.layernorm(x, {**p, "g": p["g"] * 0 + 1}),
                         [x], params)
    g = next(t for t in report.tensors if t.name == "g")
    assert g.verdict.kind is Kind.ORACLE_WRONG, str(report)
    assert "non-finite" not in str(report) and math.isfinite(g.hand_vs_autodiff), str(report)


def _rows_with_zero_variance():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 5, 8))
    x[0, 1], x[1, 4] = 3.0, 0.0                      # a constant row and a row of zeros
    return x, {"g": 1 + 0.1 * rng.standard_normal(8), "b": rng.standard_normal(8)}


def test_fd_alone_disagreeing_with_an_exact_autodiff_is_set_aside():
    """Layer norm on rows of zero variance (the lab's kernel and oracle, float64): hand and
    autodiff agree to 1e-16, and central differences step across the curvature that eps
    leaves (1 / sqrt(eps) = 316).  Nothing in the oracle's program lets its autodiff differ
    from the derivative of its forward, so FD's disagreement is a note (before: a failure)."""
    x, params = _rows_with_zero_variance()
    report = check_layer(kernels.layernorm_forward, kernels.layernorm_backward,
                         reference.layernorm, [x], params)
    assert report.ok, str(report)
    assert all(t.verdict.kind in (Kind.OK, Kind.FD_SET_ASIDE) for t in report.tensors)


def test_fd_disagreeing_with_a_bug_hand_and_oracle_share_through_stop_gradient_fails():
    """The same rows, an oracle whose gradient of g is 0.99 times the true one (its value
    unchanged, through stop_gradient) and a hand backward with the same factor: hand and
    autodiff agree, FD disagrees with both, and the oracle's program holds a caveat."""
    import jax
    x, params = _rows_with_zero_variance()

    def oracle(x, p):
        g = 0.99 * p["g"] + 0.01 * jax.lax.stop_gradient(p["g"])
        return reference.layernorm(x, {**p, "g": g})

    def backward(dy, cache):
        dx, grads = kernels.layernorm_backward(dy, cache)
        return dx, {**grads, "g": 0.99 * grads["g"]}
    report = check_layer(kernels.layernorm_forward, backward, oracle, [x], params)
    g = next(t for t in report.tensors if t.name == "g")
    assert not report.ok and g.verdict.kind is Kind.FD_DISAGREES, str(report)


def test_wrong_arguments_are_named_before_any_leg_runs():
    x, params = case()
    args = (kernels.linear_forward, kernels.linear_backward, reference.linear, [x], params)
    with pytest.raises(TypeError, match="policy: expected a checks.tolerances.Policy"):
        check_layer(*args, policy="strict")
    with pytest.raises(ValueError, match="nondiff: expected indices of the inputs, 0 to 0"):
        check_layer(*args, nondiff=(3,))
    report = check_layer(kernels.linear_forward, kernels.linear_backward,
                         lambda x, p: (reference.linear(x, p), None), [x], params)
    assert not report.ok and report.error_in == "oracle"
    assert "the oracle returned a tuple of 2; expected one array" in report.error, report.error


def test_jax_arrays_for_the_hand_kernels_are_refused_not_run_through_jax():
    """Given JAX arrays, the hand kernel's arithmetic would be JAX's: the check compared
    autodiff with XLA's own products and passed whatever the kernel's maths.  The checker and
    the lab's kernels refuse them and say how to convert."""
    x, params = case()
    args = (kernels.linear_forward, kernels.linear_backward, reference.linear)
    with pytest.raises(TypeError, match=r"input0: expected NumPy \(or CuPy\) arrays"):
        check_layer(*args, [jnp.asarray(x)], params)
    with pytest.raises(TypeError, match=r"params\['W'\]: expected NumPy \(or CuPy\) arrays"):
        check_layer(*args, [x], {**params, "W": jnp.asarray(params["W"])})
    with pytest.raises(TypeError, match="x: expected a NumPy or CuPy array, got jaxlib's"):
        kernels.linear_forward(jnp.asarray(x), params)
    with pytest.raises(TypeError, match=r"linear params\['b'\]: expected a NumPy or CuPy array"):
        kernels.linear_forward(x, {**params, "b": jnp.asarray(params["b"])})


@pytest.mark.parametrize("sizes, error", [
    ({"H": 2.5}, "'H': 2.5"), ({"B": 0}, "'B': 0"), ({"H": True}, "'H': True"),
    ({3: 4}, "3: 4"), ([("H", 2)], None)])
def test_sizes_that_name_no_positive_integer_are_refused(sizes, error):
    x, params = case()
    args = (kernels.linear_forward, kernels.linear_backward, reference.linear, [x], params)
    if error is None:
        with pytest.raises(TypeError, match="sizes: expected a dict of size names"):
            check_layer(*args, sizes=sizes)
    else:
        with pytest.raises(ValueError, match="sizes: expected names .* of positive integers, "
                                             "got " + error):
            check_layer(*args, sizes=sizes)
    good = check_layer(*args, sizes={"B": 3, "T": np.int64(4)})
    assert good.ok and not any(n.finding is Finding.SIZES_UNMATCHED for n in good.notes)
    other = check_layer(*args, sizes={"B": 3, "T": 8, "Q": 7})   # the case's T is 4
    assert any(n.finding is Finding.SIZES_UNMATCHED and "T = 8, Q = 7" in str(n)
               for n in other.notes), other.notes


def test_an_error_where_autodiff_is_exactly_zero_is_said_so_without_a_warning(recwarn):
    """Max pooling with the gradient sent to every token: autodiff's gradient is exactly 0 off
    the argmax, its tolerance a few subnormals, and the ratio overflows: the failure line says
    where the error is instead of 'infx', and no overflow warning reaches the user."""
    from checks.report import failure_line

    def pool_forward(x, params):
        return x.max(1), x

    def to_every_token(dy, x):
        return np.repeat(dy[:, None, :], x.shape[1], axis=1), {}
    x = np.random.default_rng(0).standard_normal((2, 5, 4))
    report = check_layer(pool_forward, to_every_token, lambda x, p: x.max(1), [x], {})
    (t,) = report.tensors
    assert not report.ok and t.verdict.kind is Kind.HAND_WRONG, str(report)
    assert "beyond its tolerance where autodiff's value is exactly 0" in \
        failure_line("pool", "float64", t)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)
                and "overflow" in str(w.message)]


def test_mixed_formats_and_a_mask_without_nondiff_are_named():
    """float32 inputs with a float64 parameter: a finding names the wider tensor; a float mask
    the backward gives no gradient: the failure says how to declare it."""
    x, params = case(np.float32)
    report = check(dtype=np.float32)  # the plain case: one format
    assert not any(n.finding is Finding.MIXED_FORMATS for n in report.notes)
    mixed = check_layer(kernels.linear_forward, kernels.linear_backward, reference.linear, [x],
                        {**params, "b": params["b"].astype(np.float64)}, name="linear")
    assert any(n.finding is Finding.MIXED_FORMATS and "params['b'] is float64" in str(n)
               for n in mixed.notes), mixed.notes

    def masked_sum(x, mask, params):
        return (x * mask[..., None]).sum(1), mask

    def masked_sum_backward(dy, mask):
        return (dy[:, None, :] * mask[..., None], None), {}
    mask = (np.random.default_rng(1).random((3, 4)) < 0.5).astype(np.float64)
    args = (masked_sum, masked_sum_backward,
            lambda x, m, p: (x * m[..., None]).sum(1), [x.astype(np.float64), mask], {})
    report = check_layer(*args)
    assert not report.ok and "declare it: nondiff=(1,)" in str(report), str(report)
    assert check_layer(*args, nondiff=(1,)).ok
