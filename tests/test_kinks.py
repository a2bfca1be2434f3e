"""Kinks found by the checker, not avoided by the inputs: a pre-activation within rounding of
leaky ReLU's kink is reported and judged as either branch; everything else is judged as before."""
import numpy as np
import pytest

import kernels
import reference
from checks.engine import check_layer
from checks.verdict import Finding, Kind
from checks.wild import plain_ff, plant


def _ff_at_kink(dtype, pre_activation, seed=0):
    """A plain ff case with hidden unit 3 of token 5 at the given pre-activation."""
    x, p = plain_ff(np.random.default_rng(seed), dtype, B=2, T=8, D=16, F=32)
    z = x.astype(np.float64).reshape(-1, 16) @ p["W1"].astype(np.float64)
    p["b1"][3] = -z[5, 3] + pre_activation
    return x, p


@pytest.mark.parametrize("dtype,pre", [(np.float32, 1e-7),
                                       pytest.param(np.float32, -1e-7, marks=pytest.mark.slow),
                                       pytest.param(np.float64, 1e-15, marks=pytest.mark.slow)])
def test_a_pre_activation_within_rounding_of_the_kink_is_a_finding_not_a_fail(dtype, pre):
    """Before: "oracle is wrong" on x and W1 for the float32 flip at 1e-7."""
    x, p = _ff_at_kink(dtype, pre)
    report = check_layer(kernels.ff_forward, kernels.ff_backward, reference.ff, [x], p,
                         input_names=["x"])
    assert report.ok, str(report)
    # the kernel's own rounding took the oracle's branch: every element agrees without either
    # branch's allowance, so the check says how many predicates sit there and runs no move
    unneeded = [n for n in report.notes if n.finding is Finding.KINKS_UNNEEDED]
    assert unneeded and dict(unneeded[0].values)["flipped"] >= 1, str(report)


def _taking_the_other_branch(forward):
    """The ff forward whose cached gain takes the other branch of leaky ReLU at hidden unit 3
    of token 5 (``_ff_at_kink``'s element): the branch a kernel's rounding may take there."""
    def other(x, params, **static):
        y, cache = forward(x, params, **static)
        gain = cache.act.gain.copy()
        gain[0, 5, 3] = 0.1 if gain[0, 5, 3] == 1 else 1
        return y, cache._replace(act=cache.act._replace(gain=gain))
    return other


@pytest.mark.parametrize("defer", [True, False])
def test_the_other_branch_at_the_kink_is_judged_right_with_the_kinks_moves(defer):
    """A kernel that takes the other branch at the element within rounding of the kink fails
    without the kinks' allowance (deferred: the moves are then run) and passes with it; the
    finding names the tensors it moved.  The same verdict whether the moves are deferred to
    a failure or run with the spreads."""
    from checks.engine import LayerCheck
    x, p = _ff_at_kink(np.float32, 1e-7)
    check = LayerCheck(_taking_the_other_branch(kernels.ff_forward), kernels.ff_backward,
                       reference.ff, [x], p, input_names=["x"])
    check.defer_kinks = defer
    report = check.run()
    assert report.ok, str(report)
    assert check.flipped >= 1 and not check.kinks_deferred
    kinks = [n for n in report.notes if n.finding is Finding.KINKS]
    assert kinks and "of W1" in str(kinks[0]), str(report)
    assert not any(n.finding is Finding.KINKS_UNNEEDED for n in report.notes)


def test_without_the_kinks_moves_the_other_branch_fails():
    """What the moves excuse: the same kernel judged with them left out (a deferred check
    whose moves are stubbed to nothing) fails on W1, so the test above is not vacuous."""
    from checks.engine import LayerCheck
    x, p = _ff_at_kink(np.float32, 1e-7)
    check = LayerCheck(_taking_the_other_branch(kernels.ff_forward), kernels.ff_backward,
                       reference.ff, [x], p, input_names=["x"])
    check._find_kinks = lambda: None  # no move run: every element judged without its allowance
    report = check.run(diagnose=False)
    assert "W1" in report.failing, str(report)


def test_a_bug_beside_a_kink_still_fails():
    x, p = _ff_at_kink(np.float32, 1e-7)
    report = check_layer(kernels.ff_forward, plant(kernels.ff_backward, "W2", "x1.5", 0),
                         reference.ff, [x], p, input_names=["x"])
    assert report.failing == ["W2"], str(report)
    assert report.tensors[3].verdict.kind is Kind.HAND_WRONG


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_the_issues_plain_float32_ff_is_judged_correct(seed):
    x, p = plain_ff(np.random.default_rng(seed), np.float32)
    report = check_layer(kernels.ff_forward, kernels.ff_backward, reference.ff, [x], p,
                         seed=seed, input_names=["x"])
    assert report.ok, str(report)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [5, 7])
def test_a_plain_bfloat16_ff_with_hundreds_of_predicates_near_the_kink_passes(seed):
    """``calibrate --wild``'s plain bfloat16 ff at the article's size, seeds 5 and 7: hundreds of
    leaky ReLU predicates sit within rounding of the kink (the pre-activation is rounded twice in
    the format). They failed at 1.04-1.29x the tolerance when the bound summed each flip's move
    only up to 512 flips; the flips are now those within KINK_SIGMAS spreads of their margin,
    every one moved alone."""
    from checks.calibrate_wild import Task, run_task
    assert run_task(Task("plain ff", "bfloat16", "article", seed))[1] == "noted"


@pytest.mark.slow
@pytest.mark.parametrize("seed,tensor", [(0, "W1"), (1, "x")])
def test_one_element_x1_5_beside_hundreds_of_kinks_is_the_hands(seed, tensor):
    """The kink allowance does not swallow a localised bug in the same case."""
    from checks.calibrate_wild import Task, run_task
    assert run_task(Task("plain ff", "bfloat16", "article", seed, "x1.5", tensor))[1] == "hand"


def _leaky_relu_with_kinks_in_the_step(n_at_kink=5, seed=0):
    """float64 leaky ReLU on 64k plain draws, n_at_kink of them at 1e-12: inside the finite
    differences' step (about 5e-6 times the draws' rms along a unit direction) but far outside
    float64 rounding of the kink, so only the step crosses it."""
    x = np.random.default_rng(seed).standard_normal((4, 16, 1024))
    x.reshape(-1)[np.arange(n_at_kink) * 9973] = 1e-12
    return x


@pytest.mark.slow  # 2 M elements: 15 s
def test_a_kink_inside_the_fd_step_sets_fd_aside_when_hand_and_autodiff_agree():
    """The registry's leaky ReLU at the bench's large size in float64, plain draws: before, "hand
    and autodiff agree, finite differences disagree with both", a FAIL of a correct kernel (4 to
    6 of 2 M elements within the step along each direction, whose second differences stay
    under the kink test's threshold).  The crossing is now read from the oracle's comparisons."""
    from checks.calibrate import LARGE
    from checks.registry import BY_NAME, run_row
    report = run_row(BY_NAME["leaky_relu"], np.float64, seed=0, sizes=LARGE)
    assert report.ok, str(report)
    x = next(t for t in report.tensors if t.name == "x")
    assert x.hand_vs_autodiff == 0.0
    if x.verdict.kind is not Kind.OK:  # FD disagreed: set aside for the kink, not failed
        assert x.verdict.kind is Kind.FD_SET_ASIDE and "not smooth" in x.verdict.detail


def test_the_fd_step_crossing_a_kink_is_found_from_the_oracles_comparisons():
    from checks.legs import FiniteDifferences, Measured, Oracle
    x = _leaky_relu_with_kinks_in_the_step()
    dout = np.random.default_rng(1).standard_normal(x.shape)
    oracle = Oracle(reference.leaky_relu, [x], {}, {}, [0])
    fd = FiniteDifferences(kernels.leaky_relu_forward, [x], {}, {}, dout, oracle=oracle)
    v = np.random.default_rng(2).standard_normal(x.shape)
    v /= np.sqrt(np.mean(v * v))  # unit rms, as the checker draws them
    measured = Measured([v], [0.0], [0.0], None, None)
    size = float(np.sqrt(np.mean(x * x)))
    assert fd._branches_within_step(0, x, measured, size)
    clear = np.where(np.abs(x) < 1e-3, 1.0, x)  # every draw far from the kink: no crossing
    assert not fd._branches_within_step(0, clear, measured, size)


@pytest.mark.parametrize("seed", [2, 4])
def test_a_row_x1_05_in_bfloat16_is_blamed_along_its_row_beside_kinks(seed):
    """``calibrate --wild``'s ff in bfloat16 at the article's size, one row of W1 x 1.05: about
    3 tolerances per element, below the evidence's DECISIVE 4, but 12 bands along its row, and
    FD along random directions crosses kinks.  The row's own direction decides: the hand's
    (it was "unresolved" when only its elements were examined)."""
    from checks.calibrate_wild import Task, run_task
    assert run_task(Task("ff", "bfloat16", "article", seed, "row x1.05", "W1"))[1] == "hand"


@pytest.mark.slow  # about 15 s: the model's rounding model compiled, 31 flipped runs
def test_beyond_the_one_by_one_work_the_bound_covers_the_flips_subsets_a_kernel_may_take():
    """The whole model at D 32, H 4, F 64 in bfloat16 has about 800 predicates within rounding
    of a kink.  The bound taken without moving them one by one (the move of all of them plus
    SUBSET_SIGMAS sqrt(2) rms of 16 random halves, ``RoundingModel._moves``) covers the move of
    every element under 30 subsets drawn with probabilities 0.1, 0.5 and 0.9 per flip (measured:
    at most 0.72 of the bound over 8e5 moved elements), where the move of all of them alone
    does not."""
    import jax
    from checks import rounding
    from checks.registry import model_at
    from checks.registry import layer_check
    check = layer_check(model_at(D=32, H=4, F=64), np.dtype("bfloat16"), seed=0,
                        sizes={"B": 4, "T": 16})
    check.run()
    model, args = check.ref._model(check.dout64)
    flat = jax.tree_util.tree_leaves(args)
    _, flips = model.spread_and_flips(args, check.seed, check._kink_us())
    assert sum(int(f.sum()) for f in flips) > 100
    every = [np.asarray(m) for m in model._moves_run(flat, flips, 0)[0]]  # |M|: all flipped
    bound = [np.asarray(b) for b in model._moves_run(flat, flips, rounding.SUBSETS)[0]]
    rng = np.random.default_rng(1)
    beyond_every = 0.0
    for r in range(30):
        subset = [f & (rng.random(f.shape) < (0.1, 0.5, 0.9)[r % 3]) for f in flips]
        moved = model._moves_run(flat, subset, 0)[0]  # |move| of that subset, all flipped
        for m, a, b in zip(moved, every, bound):
            assert np.all(np.asarray(m) <= b)
            beyond_every = max(beyond_every, float(np.max(m / np.maximum(a, 1e-300))))
    # the halves' spread is needed: |M| alone is exceeded where the flips' moves cancel (by
    # about 3e4 times at one element here)
    assert beyond_every > 10


def test_a_check_failing_beside_agreeing_gradients_is_judged_with_the_kinks_moves():
    """A backward whose gradients all agree with autodiff without the kinks' moves but which
    returns a gradient for no parameter fails all the same: its legs are judged again with the
    moves run, so its report (verdicts, scores, findings) is the one of a check that ran them
    with the spreads, and no finding is counted twice."""
    from checks.engine import LayerCheck
    x, p = _ff_at_kink(np.float32, 1e-7)

    def extra(dout, cache):
        d_in, d_params = kernels.ff_backward(dout, cache)
        return d_in, {**d_params, "W3": np.zeros_like(d_params["W1"])}
    reports = []
    for defer in (True, False):
        check = LayerCheck(kernels.ff_forward, extra, reference.ff, [x], p, input_names=["x"])
        check.defer_kinks = defer
        reports.append(check.run())
        assert not check.kinks_deferred and check.flipped >= 1
    deferred, run = reports
    assert deferred.failing == run.failing == ["W3"], str(deferred)
    assert [(t.name, t.verdict, t.score) for t in deferred.tensors] == \
        [(t.name, t.verdict, t.score) for t in run.tensors]
    # the legs again along the same finite-difference directions: the same measurements
    assert [t.hand_vs_fd for t in deferred.tensors] == [t.hand_vs_fd for t in run.tensors]
    assert [str(n) for n in deferred.notes] == [str(n) for n in run.notes]


def test_the_one_by_one_bound_sums_each_flip_once():
    """Where the flips are moved one at a time (``RoundingModel._each_flip``), the bound is the
    sum over the flips of |move of that flip alone|, each flip counted once: equal, element by
    element, to the same sum from separate exact runs with one flip each.  (A short last batch
    was once padded with copies of its first flip, which counted that flip up to 127 more
    times: the whole model's moves in float16 at the registry's size came out 100 times too
    large, and no whole-tensor error up to 1 was caught there.)"""
    import jax
    from checks.engine import LayerCheck
    from checks.rounding import _Noise
    x, p = _ff_at_kink(np.float32, 1e-7)
    check = LayerCheck(kernels.ff_forward, kernels.ff_backward, reference.ff, [x], p,
                       input_names=["x"])
    check.run()
    model, args = check.ref._model(check.dout64)
    flat = jax.tree_util.tree_leaves(args)
    _, flips = model.spread_and_flips(args, check.seed, check._kink_us())
    where = [(k, i) for k, f in enumerate(flips) for i in np.flatnonzero(f)]
    assert 1 <= len(where) < 16  # fewer than one batch: the batch is padded
    exact = [np.asarray(e, np.float64) for e in model._eval(flat, _Noise("exact", None))]
    alone = [np.zeros_like(e) for e in exact]
    for k, i in where:
        mask = [np.zeros(f.shape, bool) for f in flips]
        mask[k].reshape(-1)[i] = True
        run = model._eval(flat, _Noise("exact", None, flips=mask))
        alone = [a + np.abs(np.asarray(r, np.float64) - e) for a, r, e in zip(alone, run, exact)]
    each = [np.asarray(m, np.float64) for m in model._each_flip(flat, flips)]
    assert max(float(np.max(a)) for a in alone) > 1e-3  # the flips move something
    # the batched (vmapped) and the single runs are compiled apart: they agree to float64's
    # rounding of the program's values (1e-13 seen here), 1e-12 of each output's largest
    # magnitude, far below the moves; a flip counted twice would double its elements' moves
    for a, m, e in zip(alone, each, exact):
        np.testing.assert_allclose(m, a, rtol=1e-9, atol=1e-12 * max(1.0, float(np.max(np.abs(e)))))
