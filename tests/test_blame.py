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

    def derivative(self, key, x, e, size):
        return float(np.sum(self.derivatives * e)), lambda scale: 1e-9

    def _kinked(self, key, x, e, size, threshold):
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
