"""Blame follows element-wise evidence: localised bugs are the hand's, never the oracle's."""
import numpy as np
import pytest

import kernels
import reference
from checks.engine import check_layer
from checks.evidence import DECISIVE, Element, autodiff_caveats, blame, examine
from checks.verdict import Kind
from checks.wild import BUGS, plain_ff, plant


def _ff_verdict(seed, bug, tensor, **sizes):
    x, params = plain_ff(np.random.default_rng(seed), np.float32, **sizes)
    report = check_layer(kernels.ff_forward, plant(kernels.ff_backward, tensor, bug, seed),
                         reference.ff, [x], params, seed=seed, input_names=["x"])
    return report, next(t for t in report.tensors if t.name == tensor)


@pytest.mark.parametrize("bug,tensor", [("negated", "x"),
                                        pytest.param("x1.5", "W1", marks=pytest.mark.slow),
                                        pytest.param("row x1.05", "W1", marks=pytest.mark.slow),
                                        pytest.param("x1.5", "x", marks=pytest.mark.slow),
                                        pytest.param("negated", "W1", marks=pytest.mark.slow),
                                        pytest.param("row x1.05", "x", marks=pytest.mark.slow)])
def test_a_localised_bug_in_a_small_float32_ff_is_blamed_on_the_hand(bug, tensor):
    report, bad = _ff_verdict(1, bug, tensor, B=2, T=8, D=16, F=32)
    assert bad.verdict.kind is Kind.HAND_WRONG, str(report)
    assert all(t.ok for t in report.tensors if t.name != tensor), str(report)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bug", BUGS)
@pytest.mark.parametrize("tensor", ["W1", "x"])
def test_a_localised_bug_in_the_issues_float32_ff_is_blamed_on_the_hand(seed, bug, tensor):
    """B 8, T 64, D 128, F 512, plain standard-normal inputs: before element-wise evidence, 5-9
    of 12 seeds said "oracle is wrong"."""
    report, bad = _ff_verdict(seed, bug, tensor)
    assert bad.verdict.kind is Kind.HAND_WRONG, str(report)


def _element(hand, autodiff, fd, side, fd_tol=1e-6, tol=1e-7):
    return Element((0,), hand, autodiff, fd, fd_tol, tol, side, False)


def test_blame_needs_a_reason_before_it_says_the_oracle_is_wrong():
    on_hand = [_element(1.0, 2.0, 1.0, "hand")]
    assert blame(on_hand, [], True, "").kind is Kind.UNRESOLVED
    assert "nothing lets the oracle's autodiff differ" in str(blame(on_hand, [], True, ""))
    assert blame(on_hand, ["stop_gradient"], True, "").kind is Kind.ORACLE_WRONG
    # one element where FD sides with autodiff outweighs any number on the hand's side
    mixed = on_hand * 3 + [_element(2.0, 1.0, 1.0, "autodiff")]
    assert blame(mixed, ["stop_gradient"], True, "").kind is Kind.HAND_WRONG


def test_without_decisive_elements_a_kink_leaves_the_verdict_unresolved():
    close = [_element(1.0 + 1e-6, 1.0, 1.0, "")]  # FD cannot separate the legs
    assert blame(close, [], True, "").kind is Kind.HAND_WRONG  # FD confirms autodiff
    assert blame(close, [], False, "a kink").kind is Kind.UNRESOLVED
    assert blame(close, [], False, "").kind is Kind.ALL_DISAGREE
    assert DECISIVE > 1  # the disagreeing leg must clearly miss FD


class _FiniteDifferences:
    """FD along e_i returns the given derivatives; the kink test says what it is told (and
    counts its calls)."""
    scheme = "central"

    def __init__(self, derivatives, kinked):
        self.derivatives, self.kinked, self.asked = derivatives, kinked, 0

    def derivative(self, key, x, e, size, scheme=None):
        return float(np.sum(self.derivatives * e)), lambda scale: 1e-9

    def _kinked(self, key, x, e, size, threshold, scheme=None):
        self.asked += 1
        return self.kinked


@pytest.mark.parametrize("kinked", [False, True])
def test_fd_on_autodiffs_side_needs_no_kink_test(kinked):
    """FD within eps of autodiff and the hand far from both: a kink cannot have put FD there (FD
    across a kink sits between the one-sided slopes, halfway where the hand took the other
    branch), so the kink test (whose second differences carry the loss's rounding noise over
    the step, a false kink on a deep program) is not asked and the hand is blamed."""
    g = np.array([1.0, -2.0, 3.0])
    h = g + np.array([0.5, 0.0, 0.0])          # one element wrong
    fd = _FiniteDifferences(g, kinked)
    elements = examine(fd, "x", np.ones(3), h, g, np.full(3, 1e-12), 3.0, [0])
    assert elements[0].side == "autodiff" and not elements[0].kinked and fd.asked == 0
    assert blame(elements, [], False, "").kind is Kind.HAND_WRONG
    # FD on the hand's side needs a smooth loss before the oracle is blamed
    fd = _FiniteDifferences(h, kinked)
    elements = examine(fd, "x", np.ones(3), h, g, np.full(3, 1e-12), 3.0, [0])
    assert fd.asked == 1 and elements[0].kinked is kinked
    assert elements[0].side == ("" if kinked else "hand")
    assert blame(elements, ["stop_gradient"], False, "").kind is \
        (Kind.UNRESOLVED if kinked else Kind.ORACLE_WRONG)


def test_oracle_caveats_are_read_from_its_program():
    import jax
    import jax.numpy as jnp
    read = lambda f: autodiff_caveats(jax.make_jaxpr(f)(jnp.ones(3)).jaxpr)
    assert read(lambda x: jnp.sin(x) * x) == []
    assert read(lambda x: jax.lax.stop_gradient(x) * x) == ["stop_gradient"]
    assert "a custom JVP rule (custom_jvp)" in read(jax.nn.relu)
    assert read(lambda x: jnp.floor(x) + x.astype(jnp.int32)) == [
        "a conversion of a float to an integer", "a non-differentiable operation (floor)"]


def test_an_oracle_with_stop_gradient_is_named_wrong_on_element_wise_evidence():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6))
    forward = lambda x, p: (x * x, x)
    backward = lambda dy, x: (2 * dy * x, {})
    import jax
    oracle = lambda x, p: jax.lax.stop_gradient(x) * x  # its autodiff misses half
    report = check_layer(forward, backward, oracle, [x], {})
    assert report.forward_ok and report.tensors[0].verdict.kind is Kind.ORACLE_WRONG, str(report)


def _layernorm_case():
    rng = np.random.default_rng(1)
    return rng.standard_normal((2, 5, 8)), {"g": 1 + 0.1 * rng.standard_normal(8),
                                            "b": rng.standard_normal(8)}


def test_an_oracle_off_by_float32_rounding_is_blamed_not_the_hand():
    """An oracle that computes in float32 and casts back (float64 check): its gradients differ
    from the correct hand's by about 1e-7, below central differences' resolution (2e-7 of the
    derivative), so the elements are differenced again by Richardson's extrapolation, which
    sides with the hand (before: "hand is wrong", from FD's confirmation of autodiff along
    random directions); the diagnosis speaks of autodiff's gradient, not the hand's."""
    def oracle32(x, p):
        import jax.numpy as jnp
        p32 = {k: v.astype(jnp.float32) for k, v in p.items()}
        return reference.layernorm(x.astype(jnp.float32), p32).astype(x.dtype)
    x, params = _layernorm_case()
    report = check_layer(kernels.layernorm_forward, kernels.layernorm_backward, oracle32,
                         [x], params)
    kinds = {t.name: t.verdict.kind for t in report.tensors if t.verdict is not None}
    assert not report.ok and kinds and set(kinds.values()) == {Kind.ORACLE_WRONG}, str(report)
    assert not any("the hand" in t.diagnosis for t in report.tensors), str(report)


def test_an_oracles_wrong_gradient_is_not_explained_by_its_own_program():
    """An oracle with eps 1.02e-5 against the kernel's 1e-5: the oracle is blamed, and its
    gradient is not "another tensor returned in place of dg" (before: the substitution test
    found autodiff's dg among the oracle's own gradients, and named it as the hand's)."""
    def oracle(x, p, eps=1.02e-5):
        import jax.numpy as jnp
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return p["g"] * (x - m) / jnp.sqrt(v + eps) + p["b"]
    x, params = _layernorm_case()
    report = check_layer(kernels.layernorm_forward, kernels.layernorm_backward, oracle, [x],
                         params)
    failing = [t for t in report.tensors if t.verdict is not None and not t.verdict.ok]
    assert failing and all(t.verdict.kind is Kind.ORACLE_WRONG for t in failing), str(report)
    assert not any("in place of" in t.diagnosis or "the hand" in t.diagnosis
                   for t in failing), str(report)


def test_a_hand_off_by_1e_7_in_float64_is_blamed_on_fds_evidence():
    """The hand's dg scaled by 1 + 1e-7 (float64): Richardson's differences side with autodiff
    at the element, so the blame rests on evidence, not on the fallback."""
    x, params = _layernorm_case()

    def backward(dy, cache):
        dx, grads = kernels.layernorm_backward(dy, cache)
        return dx, {**grads, "g": grads["g"] * (1 + 1e-7)}
    report = check_layer(kernels.layernorm_forward, backward, reference.layernorm, [x], params)
    bad = next(t for t in report.tensors if t.name == "g")
    assert bad.verdict.kind is Kind.HAND_WRONG, str(report)
    assert "FD sides with autodiff" in bad.verdict.detail, bad.verdict.detail
