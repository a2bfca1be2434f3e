"""The aggregate test (checks.aggregate): the bias of the hand error along autodiff's gradient,
over the whole tensor and every slice, against the rounding model's own samples."""

import jax.numpy as jnp
import numpy as np
import pytest

import kernels
import reference
from checks import aggregate, check_layer, tolerances
from checks.engine import LayerCheck
from checks.verdict import Kind

U32 = tolerances.unit_roundoff(np.float32)


def test_slice_sums_are_the_sums_over_the_whole_tensor_and_over_every_index_of_every_axis():
    a = np.random.default_rng(0).standard_normal((3, 4, 5))
    sums = aggregate.slice_sums(a)
    expected = [a.sum()] + [a[i].sum() for i in range(3)] + [a[:, j].sum() for j in range(4)] \
        + [a[:, :, k].sum() for k in range(5)]
    np.testing.assert_allclose(sums, expected, rtol=1e-12)
    assert aggregate.slice_count(a.shape) == len(expected) == 13
    # the rounding model projects its samples with jax.numpy, a leading axis of samples
    stacked = np.stack([a, 2 * a])
    np.testing.assert_allclose(np.asarray(aggregate.slice_sums(jnp.asarray(stacked), lead=1,
                                                               xp=jnp)),
                               [expected, 2 * np.asarray(expected)], rtol=1e-12)
    # a vector has no slices (its slices would be elements): the whole tensor only
    assert aggregate.slice_count((7,)) == 1 and aggregate.slice_count(()) == 1
    labels = aggregate.slice_labels(a.shape, ("batch", "token", "feature"))
    assert labels[0] == "the whole tensor" and labels[5] == "index 1 of axis 'token'"
    assert a[aggregate.slice_mask(a.shape, 5)].sum() == pytest.approx(sums[5])


def test_a_band_is_its_floor_and_final_rounding_without_model_noise_plus_its_kinks():
    """Each term of the band, computed by hand for g = 1 everywhere on a (4, 3) tensor."""
    g = np.ones((4, 3))
    p = tolerances.DEFAULT
    sets = aggregate.slice_count(g.shape)
    zero = aggregate.bands(np.zeros(sets), np.zeros_like(g), g, 0.0, floor_u=U32,
                           final_u=U32, policy=p)
    n = aggregate.slice_sums(np.ones_like(g))  # elements per set: 12, then 3 (rows), 4 (columns)
    # the final rounding: its bound u (|r_i| <= u |g_i|), whatever the roundings' correlation
    np.testing.assert_allclose(zero.band, (p.BIAS_ULPS + 1) * U32, rtol=1e-12)
    moved = np.zeros_like(g)
    moved[1, 2] = 0.3  # one element within rounding of a kink may move by 0.3
    spread = np.full_like(g, 0.5)  # within its own rounding spread: kept
    plain = aggregate.bands(np.zeros(sets), spread, g, 0.0, floor_u=U32, final_u=U32, policy=p)
    kinked = aggregate.bands(np.zeros(sets), spread, g, moved, floor_u=U32, final_u=U32,
                             policy=p)
    assert kinked.band[0] - plain.band[0] == pytest.approx(0.3 / 12)
    assert kinked.band[1 + 1] - plain.band[1 + 1] == pytest.approx(0.3 / 3)   # row 1
    assert kinked.band[1 + 4 + 2] - plain.band[1 + 4 + 2] == pytest.approx(0.3 / 4)  # column 2
    assert kinked.band[1] == pytest.approx(plain.band[1])                     # row 0: none
    # errors independent between elements, of the model's rms s_i per element: a band at
    # least BIAS_LAMBDA sqrt(sum s_i^2 g_i^2) / sum g_i^2 wide, whatever the model's projection
    s = np.full_like(g, 1e-6)
    wide = aggregate.bands(np.zeros(sets), s, g, 0.0, floor_u=U32, final_u=U32, policy=p)
    np.testing.assert_allclose(wide.band - zero.band, p.BIAS_LAMBDA * 1e-6 / np.sqrt(n),
                               rtol=1e-9)
    # a set whose gradient is zero has nothing to be biased along: never judged
    g[2] = 0.0
    b = aggregate.bands(np.zeros(sets), np.zeros_like(g), g, 0.0, floor_u=U32, final_u=U32,
                        policy=p)
    assert np.isinf(b.band[1 + 2])
    e = np.zeros_like(g)
    e[2] = 1.0  # a large error where g is zero is the element-wise rule's to judge
    assert aggregate.worst(e, g, b)[1] is None


def _linear_check(dtype=np.float32, seed=0, shape=(4, 16, 32), width=24):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    params = {"W": (rng.standard_normal((shape[-1], width)) / np.sqrt(shape[-1])).astype(dtype),
              "b": (0.1 * rng.standard_normal(width)).astype(dtype)}
    check = LayerCheck(kernels.linear_forward, kernels.linear_backward, reference.linear, [x],
                       params, seed=seed, input_names=["x"])
    return check, check.run()


@pytest.fixture(scope="module")
def linear32():  # one compilation of the linear oracle's rounding model at these shapes
    return _linear_check()


@pytest.mark.slow  # compiles the linear oracle's rounding model
def test_the_models_bias_draws_obey_cauchy_schwarz_against_its_element_spreads(linear32):
    """Per part and sample, (sum_S d_i g_i)^2 <= sum_S d_i^2 sum_S g_i^2, so the rms of the
    projections is bounded by the elements' rms and |g| on every set; and not identically 0."""
    check, report = linear32
    assert report.ok, str(report)
    for judge in check.judges.values():
        spread = check._spread_of(judge.key)
        g2 = aggregate.slice_sums(judge.g_auto ** 2)
        for part in ("forward", "backward", "backward_sums", "inputs"):
            bias = getattr(spread.bias, part)
            bound = np.sqrt(aggregate.slice_sums(getattr(spread, part) ** 2) * g2)
            assert bias.shape == g2.shape
            assert np.all(bias <= bound * (1 + 1e-9) + 1e-300), (judge.name, part)
        assert spread.bias.backward_sums[0] > 0 or spread.bias.backward[0] > 0


@pytest.mark.slow  # compiles the linear oracle's rounding model
def test_a_correct_kernel_is_inside_every_band_and_a_uniform_1e_5_error_is_outside(linear32):
    """A float32 dW off by 1 + 2e-6 everywhere (34 u) passes the element-wise rule (its spread
    is several u per element) and fails the aggregate one, blamed on the hand with the reason."""
    check, report = linear32
    assert all(0 <= t.bias_score < 1 for t in report.tensors), str(report)
    judge = check.judges["W"]
    g = np.asarray(check.dparams["W"], np.float64)
    result = judge.judge((g * (1 + 2e-6)).astype(np.float32))
    assert result.score <= 1                         # invisible element by element
    assert not result.ok and result.bias_score > 1
    assert result.verdict.kind is Kind.HAND_WRONG
    assert "of W is scaled by 1 + 2e-06" in result.verdict.detail
    assert "its band" in result.verdict.detail
    judge.judge(check.dparams["W"])                  # leave the judge as the check left it


@pytest.mark.slow  # two checks in bfloat16 at the article's size
def test_one_row_scaled_by_1_05_in_a_plain_bfloat16_kernel_is_blamed_on_the_hand():
    """A row bug at the element-wise rule's edge in bfloat16 (5 % is 13 u): a plain-NumPy
    linear layer (checks.wild_plain) at the article's size."""
    import ml_dtypes
    from checks import wild_plain
    from checks.engine import check_layer
    dtype = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 16, 32)).astype(dtype)
    params = {"W": (rng.standard_normal((32, 128)) / np.sqrt(32)).astype(dtype),
              "b": (0.1 * rng.standard_normal(128)).astype(dtype)}

    def backward(dy, cache):
        dx, grads = wild_plain.linear_backward(dy, cache)
        dW = np.array(grads["W"])
        dW[7] = dW[7] * 1.05
        return dx, {**grads, "W": dW}

    correct = check_layer(wild_plain.linear_forward, wild_plain.linear_backward,
                          reference.linear, [x], params, seed=1, input_names=["x"])
    assert correct.ok, str(correct)
    report = check_layer(wild_plain.linear_forward, backward, reference.linear, [x], params,
                         seed=1, input_names=["x"])
    W = next(t for t in report.tensors if t.name == "W")
    # the element-wise rule sees it at about its edge (5 % is 13 u, the tolerance about 12 u
    # at LAMBDA = 8), the aggregate test at 3 times its band
    assert W.score < 1.5 < W.bias_score and not W.ok
    assert W.verdict.kind is Kind.HAND_WRONG
    assert "wrong only in index 7 of axis 0" in W.diagnosis, W.diagnosis
    assert all(t.ok for t in report.tensors if t.name != "W")


@pytest.mark.slow  # one check of cross-attention
def test_a_peaked_attention_whose_gradient_cancels_in_the_oracle_is_no_false_alarm():
    """One query attending to two keys, one dominant (the calibration's "peaked attention",
    seed 17): x's gradient cancels along g in the oracle's program, so the model's projected
    deviations are tiny, while the kernel's own rounding there is not: the band takes the
    independent-elements rms of the same element spreads."""
    from checks.calibrate import ILL
    from checks.registry import BY_NAME, run_row
    sizes = {"B": 2, "D": 6, "F": 24, "H": 1, "S": 2, "T": 1, "V": 11}
    for dtype in (np.float64, np.float32):
        report = run_row(BY_NAME["mhca"], np.dtype(dtype), seed=17, sizes=sizes,
                         transform=ILL["peaked attention"][1])
        assert report.ok, str(report)


def test_an_element_a_kink_moves_beyond_its_rounding_is_left_out_of_every_set():
    """A kink's move larger than the element's own spread: the element leaves every set (its
    statistic, its band, FD's direction), and the rest of each set is judged as before."""
    g = np.ones((4, 3))
    p = tolerances.DEFAULT
    sets = aggregate.slice_count(g.shape)
    s = np.full_like(g, 1e-6)
    moved = np.zeros_like(g)
    moved[1, 2] = 0.3  # 3e5 spreads: a whole branch's difference
    b = aggregate.bands(np.zeros(sets), s, g, moved, floor_u=U32, final_u=U32, policy=p)
    assert b.keep[1, 2] == 0 and np.sum(b.keep) == 11
    n = aggregate.slice_sums(b.keep)  # elements kept per set: 11, then rows, columns
    assert n[0] == 11 and n[1 + 1] == 2 and n[1 + 4 + 2] == 3
    # no kink term: what is left is the rounding of the kept elements and the floors
    # (row 1 keeps 2 elements, fewer than BIAS_MIN_ELEMENTS: the element-wise rule's alone)
    expected = p.BIAS_LAMBDA * 1e-6 / np.sqrt(n) + (p.BIAS_ULPS + 1) * U32
    np.testing.assert_allclose(b.band, np.where(n >= p.BIAS_MIN_ELEMENTS, expected, np.inf),
                               rtol=1e-9)
    assert np.all(b.norms == n)
    # the moved element's error, however large, is not the statistic's: the element-wise rule
    # judges it (with the move in its tolerance)
    e = np.zeros_like(g)
    e[1, 2] = 0.3
    assert aggregate.worst(e, g, b)[1] is None
    # an error along g everywhere is still seen on the rest, at its full size
    ratio, out = aggregate.worst(1e-3 * g, g, b)
    assert out is not None and out.bias == pytest.approx(1e-3)


def test_below_the_normal_range_the_final_rounding_is_absolute():
    """Plain random gradients rounded to float16, nothing else wrong.  Around 2e-7 its
    subnormals are 6e-8 apart, so rounding errs by up to 15 % where the relative bound u is
    4.9e-4: without the absolute term the correct rounding fails the band, with it it passes.
    At the scale of normal numbers the term adds tiny sum|g| / sum g^2, under 1e-3 u."""
    p = tolerances.DEFAULT
    u16 = float(np.finfo(np.float16).eps) / 2
    rng = np.random.default_rng(3)
    sets = aggregate.slice_count((4, 16))
    for scale in (2e-7, 1.0):
        g = scale * rng.standard_normal((4, 16))
        e = np.asarray(g.astype(np.float16), np.float64) - g   # the final rounding, no more
        band = lambda tiny: aggregate.bands(np.zeros(sets), np.zeros_like(g), g, 0.0,
                                            floor_u=U32, final_u=u16, policy=p, tiny=tiny)
        floored, plain = band(p.tiny(np.float16)), band(0.0)
        assert aggregate.worst(e, g, floored)[1] is None
        if scale < 1:
            assert aggregate.worst(e, g, plain)[1] is not None
        else:
            judged = np.isfinite(plain.band)
            assert np.all(floored.band[judged] - plain.band[judged] < 1e-3 * u16)


def test_a_dominant_classs_subnormal_logits_are_no_false_alarm_in_float16():
    """The half-precision calibration's case (cross-entropy, a dominant class, seed 28): the
    other classes' gradients are subnormal in float16; the hand, correct, failed at 8.9x its
    band before the band took their absolute rounding."""
    from checks.calibrate import ILL
    from checks.registry import BY_NAME, run_row
    sizes = {"B": 3, "D": 6, "F": 14, "H": 1, "S": 4, "T": 2, "V": 3}
    report = run_row(BY_NAME["cross_entropy"], np.dtype("float16"), seed=28, sizes=sizes,
                     transform=ILL["dominant class"][1])
    assert report.ok, str(report)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_bias_beyond_the_known_final_rounding_holds_a_correct_kernel_and_sees_far_less_than_u(
        dtype):
    """A half-precision kernel computing in float32 returns fl(g + d), d its float32 error.
    fl(g) is known, so the band of the bias beyond it (``final_rounding``: what the few
    elements within reach of a rounding boundary can move it by) holds 200 such kernels, plain
    random g and d of the model's rms s, and over a whole tensor of 4000 elements is a small
    part of u, the bound any rounding obeys without knowing fl(g): a uniform error of u / 4 is
    caught, which the bound u cannot see.  A tensor of one repeated value halfway between two
    of the format's numbers (a tie, as near-constant rows make) keeps a band of about u, and
    a kernel rounding every element of it the other way from fl(g) stays within it."""
    from kernels.precision import finfo
    p = tolerances.DEFAULT
    u = float(finfo(dtype).eps) / 2
    rng = np.random.default_rng(0)
    shape = (8, 500)
    sets = aggregate.slice_count(shape)
    g = rng.standard_normal(shape)
    s = 4 * U32 * np.abs(g)                 # a few float32 roundings per element
    b = aggregate.bands(np.zeros(sets), s, g, 0.0, floor_u=U32, final_u=u, policy=p,
                        tiny=p.tiny(dtype), dtype=dtype)
    assert b.beyond[0] < u / 20             # the whole tensor
    worst = 0.0
    for _ in range(200):
        d = s * rng.standard_normal(shape)  # the kernel's error before its final rounding
        h = (g + d).astype(np.float32).astype(dtype).astype(np.float64)
        ratio, outside = aggregate.worst(h - g, g, b)
        assert outside is None
        worst = max(worst, ratio)
    assert worst > 0.1                      # not vacuous: the crossings reach into the band
    scaled = (g * (1 + u / 4)).astype(np.float32).astype(dtype).astype(np.float64)
    assert aggregate.worst(scaled - g, g, b)[1] is not None
    assert aggregate.worst(scaled - g, g, b, rounded=False)[1] is None  # the bound u alone
    low = float(np.array(0.3, dtype=dtype))
    up = float(finfo(dtype).eps) * 2.0 ** np.floor(np.log2(low))  # the next number's distance
    tie = low + up / 2                                       # halfway to the next number up
    same = np.full(shape, tie)
    alike = aggregate.bands(np.zeros(sets), 4 * U32 * same, same, 0.0, floor_u=U32, final_u=u,
                            policy=p, tiny=p.tiny(dtype), dtype=dtype)
    assert alike.beyond[0] > u / 2
    other = np.where(same.astype(dtype).astype(np.float64) == low, low + 2 * (tie - low), low)
    assert aggregate.worst(other - same, same, alike)[1] is None  # every tie the other way
    # ... and a value away from any boundary cannot round elsewhere: its band is the floor
    far = aggregate.bands(np.zeros(sets), 4 * U32 * np.full(shape, low), np.full(shape, low),
                          0.0, floor_u=U32, final_u=u, policy=p, tiny=p.tiny(dtype), dtype=dtype)
    assert far.beyond[0] < u / 20


def test_a_tensor_failing_by_its_bias_alone_shows_the_bias_ratio_not_a_passing_one():
    """The err/tol column and the failure line of a tensor whose elements pass and whose bias
    fails: the aggregate test's ratio, named, not the elements' 0.94 beside a FAIL."""
    from checks.report import Report, TensorResult, failure_line
    from checks.verdict import Verdict
    t = TensorResult("W", (32, 24), hand_vs_autodiff=1.9e-6, score=0.944, bias_score=7.99,
                     hand_vs_fd=1e-7, autodiff_vs_fd=3e-13, ok=False,
                     verdict=Verdict(Kind.HAND_WRONG, "the whole tensor of W is scaled"))
    ok = TensorResult("b", (24,), hand_vs_autodiff=7e-8, score=0.06, bias_score=0.3,
                      hand_vs_fd=7e-8, autodiff_vs_fd=7e-11, ok=True)
    table = str(Report("linear", "float32", 2e-7, 0.25, True, [t, ok]))
    row = next(line for line in table.splitlines() if line.startswith("linear  float32  W"))
    assert "7.99 bias" in row and "0.94" not in row, row
    assert "  0.06  " in table                      # a passing tensor: its elements' ratio
    line = failure_line("linear", "float32", t)
    assert "within its element tolerance (0.944x) but biased along autodiff's gradient 7.99x" \
        in line, line
    # elements beyond their tolerance too: theirs, as for any failure
    t.score = 1.5
    assert "1.50  " in str(Report("linear", "float32", 2e-7, 0.25, True, [t]))
    assert "1.5x its tolerance" in failure_line("linear", "float32", t)


ROOT_2_OVER_PI, CUBIC = np.sqrt(2.0 / np.pi), 0.044715


def gelu_mlp_forward(x, params):
    """A user's tanh-GELU MLP, as written apart from the lab: x W1 + b1, GELU, W2 + b2."""
    h = x @ params["W1"] + params["b1"]                            # (B, T, F)
    t = np.tanh(ROOT_2_OVER_PI * (h + CUBIC * h ** 3))             # (B, T, F)
    a = 0.5 * h * (1 + t)                                          # (B, T, F)
    return a @ params["W2"] + params["b2"], (x, h, t, a, params)


def gelu_mlp_backward(dy, cache):
    x, h, t, a, params = cache
    D, F = params["W1"].shape
    da = dy @ params["W2"].T                                       # (B, T, F)
    dh = da * (0.5 * (1 + t) + 0.5 * h * (1 - t ** 2) * ROOT_2_OVER_PI * (1 + 3 * CUBIC * h ** 2))
    return dh @ params["W1"].T, {"W1": x.reshape(-1, D).T @ dh.reshape(-1, F),
                                 "b1": dh.reshape(-1, F).sum(0),
                                 "W2": a.reshape(-1, F).T @ dy.reshape(-1, D),
                                 "b2": dy.reshape(-1, D).sum(0)}


def gelu_mlp_oracle(x, params):
    import jax
    h = x @ params["W1"] + params["b1"]
    return jax.nn.gelu(h, approximate=True) @ params["W2"] + params["b2"]


@pytest.mark.parametrize("seed", [214, 216, 240, 277])
def test_a_correct_float64_gelu_mlp_is_no_false_alarm_of_the_aggregate_test(seed):
    """Seeds where this correct float64 kernel failed by its bias alone (1.03-1.45 bands, every
    element within 0.6 of its tolerance): the reference is itself a float64 run, its tanh off
    by up to 2 ulp, so the model's spreads are not cut to correctly rounded ones in float64
    (``Policy.bias_lambda``).  Plain standard normal inputs and parameters, B 2, T 5, D 4, F 6."""
    rng = np.random.default_rng(seed)
    n = lambda *shape: rng.standard_normal(shape)
    x = n(2, 5, 4)
    params = {"W1": n(4, 6), "b1": n(6), "W2": n(6, 4), "b2": n(4)}
    report = check_layer(gelu_mlp_forward, gelu_mlp_backward, gelu_mlp_oracle, [x], params,
                         name="mlp")
    assert report.ok, str(report)
    assert max(t.bias_score for t in report.tensors) < 1


def test_the_bias_band_of_a_float64_check_is_not_cut_to_correctly_rounded_spreads():
    p = tolerances.DEFAULT
    assert p.bias_lambda(np.float64) == pytest.approx(p.BIAS_LAMBDA * np.sqrt(3))
    assert p.bias_lambda(np.float32) == p.BIAS_LAMBDA and p.bias_lambda(None) == p.BIAS_LAMBDA
