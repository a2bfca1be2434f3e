"""Path attribution on an oracle the lab has never seen, and axis-by-axis localisation."""
import jax.numpy as jnp
import numpy as np

from checks import check_layer
from checks.localise import structure

RNG = np.random.default_rng(11)


def _cubic_forward(x, params):            # y = sin(x) + x ** 3
    return np.sin(x) + x ** 3, x


def _cubic_oracle(x, params):
    return jnp.sin(x) + x ** 3


def test_a_missing_path_and_a_wrong_sign_are_named_with_the_oracle_line():
    x = RNG.standard_normal((3, 4))
    missing = lambda dy, x: (dy * np.cos(x), {})                  # forgets 3 x^2
    signed = lambda dy, x: (dy * (-np.cos(x) + 3 * x ** 2), {})   # sin's path negated
    r1 = check_layer(_cubic_forward, missing, _cubic_oracle, [x], {}, name="cubic")
    r2 = check_layer(_cubic_forward, signed, _cubic_oracle, [x], {}, name="cubic")
    assert "missing the path through `integer_pow`" in r1.tensors[0].diagnosis
    assert "tests/test_attribution.py" in r1.tensors[0].diagnosis
    assert "the path through `sin`" in r2.tensors[0].diagnosis
    assert "has the wrong sign" in r2.tensors[0].diagnosis


def test_structure_names_exact_and_wrong_indices_along_each_axis():
    wrong = np.zeros((2, 4, 6), bool)
    wrong[:, 1:, 1::2] = True                 # exact at token 0 and at even features
    assert structure(wrong, ("batch", "token", "feature")) == \
        "exact at token 0 and at even features"
    head = np.zeros((2, 3, 4), bool)
    head[:, 2] = True
    assert structure(head, None) == "wrong only in index 2 (the last) of axis 1"
    assert structure(np.ones((2, 3), bool), None) == ""   # wrong everywhere: nothing to say


def test_failure_lines_carry_the_dtype():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    missing = lambda dy, x: (dy * np.cos(x), {})
    report = check_layer(_cubic_forward, missing, _cubic_oracle, [x], {}, name="cubic")
    lines = [l for l in str(report).splitlines() if "FAIL" in l and l.startswith("cubic.")]
    assert lines and all("[float32]" in l for l in lines)


def test_path_columns_are_built_once_per_case_and_never_shared_across_data():
    from checks import attribution
    from checks.legs import Oracle
    x = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    oracle = Oracle(lambda x, params: jnp.sin(x) * x, [x], {}, {}, [0])
    once = attribution._build(oracle, np.ones((2, 3)))
    again = attribution._build(oracle, np.ones((2, 3)))
    doubled = attribution._build(oracle, np.full((2, 3), 2.0))
    assert once is again and doubled is not once
    (cin, _), _ = once
    np.testing.assert_allclose(doubled[0][0][0], 2 * cin[0])   # contributions are linear in dout


def test_a_path_off_by_a_factor_per_row():
    """e = f c_k with f one value per row (constant along the last axis): that site and those
    axes; a constant f is a path scaled (fit_paths' answer, not this one); an unrelated error,
    or slices too short for a factor per slice to mean anything, fit nothing."""
    from checks.attribution import fit_path_per_slice
    rng = np.random.default_rng(0)
    columns = rng.standard_normal((3, 4, 5))          # three sites' contributions, (4, 5) each
    g = rng.standard_normal((4, 5))
    per_row = rng.uniform(0.5, 2.0, size=(4, 1))
    assert fit_path_per_slice(per_row * columns[1], columns, [None] * 3, g, 1e-9) == (1, (1,))
    assert fit_path_per_slice(0.5 * columns[1], columns, [None] * 3, g, 1e-9) is None
    assert fit_path_per_slice(rng.standard_normal((4, 5)), columns, [None] * 3, g, 1e-9) is None
    narrow = columns[:, :, :2]                         # two elements per row: anything fits
    assert fit_path_per_slice(per_row * narrow[1] + rng.standard_normal((4, 2)), narrow,
                              [None] * 3, g[:, :2], 1e-9) is None
