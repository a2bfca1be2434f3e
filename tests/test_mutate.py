"""Mutation testing (checks/mutants.py, checks/mutate.py) on small slices: the mutants a kernel's
source gives, equivalence and raising mutants set aside, and the check's verdicts on the rest."""
import pathlib

import numpy as np
import pytest

import kernels.linear
from checks import mutate
from checks.__main__ import main
from checks.mutants import OPERATORS, Source

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "my_layers.py"


def test_linear_mutants_are_the_expected_mistakes():
    """linear's backward reads its cache and calls affine_backward (shared with the feed-forward
    block), which holds the products: both are backwards of the module, both are mutated."""
    source = Source.of_module(kernels.linear)
    assert {"linear_backward", "affine_backward"} <= set(source.backwards())
    mutants = source.mutants("affine_backward") + source.mutants("linear_backward")
    described = {(m.operator, m.before, m.after) for m in mutants}
    assert ("drop factor", "x2.T @ dy2", "dy2") in described
    assert ("transpose", "W.T", "W") in described
    assert ("swap cached", "cache.W, cache.x", "cache.x, cache.W") in described
    assert {m.operator for m in mutants} <= set(OPERATORS)
    # shape arithmetic (W.shape[0], the reshape arguments) is never mutated
    assert not any("shape" in m.before for m in mutants)
    linear = source.mutants("linear_backward")
    assert [m.index for m in linear] == list(range(len(linear)))


def test_two_mutants_of_one_name_on_one_line_are_told_apart_by_their_column(tmp_path):
    """A name read twice on a line gives two mutants of the same words: their descriptions
    differ by where on the line each starts."""
    path = tmp_path / "sigmoid_layer.py"
    path.write_text("def sigmoid_backward(dy, cache):\n"
                    "    s = cache.s\n"
                    "    return 0.5 * dy * (1 - s) + 0.5 * dy * s, {}\n")
    mutants = Source.of_file(path).mutants("sigmoid_backward")
    halves = [m for m in mutants if m.before == "0.5" and m.line == 3]
    assert len(halves) >= 2 and len({m.describe() for m in halves}) == len(halves), \
        [m.describe() for m in halves]
    described = [m.describe() for m in mutants]
    assert len(set(described)) == len(described), described


def test_a_mutant_runs_in_a_fresh_namespace_and_leaves_the_kernel_alone():
    source = Source.of_module(kernels.linear)
    text = pathlib.Path(kernels.linear.__file__).read_text()
    original = kernels.linear.linear_backward
    mutant = next(m for m in source.mutants("affine_backward")
                  if (m.before, m.after) == ("x2.T @ dy2", "dy2"))
    namespace = source.load(mutant)      # linear_backward there calls the mutated helper
    assert namespace["linear_backward"] is not original
    assert kernels.linear.linear_backward is original
    assert pathlib.Path(kernels.linear.__file__).read_text() == text
    x, W = np.ones((2, 3)), np.ones((3, 4))
    _, grads = namespace["linear_backward"](np.ones((2, 4)), kernels.linear.LinearCache(x, W))
    assert grads["W"].shape == (2, 4)  # dW = dy: the product with x^T dropped
    assert "-    return (dy2 @ W.T, x2.T @ dy2, column_sum(dy2))" in source.diff(mutant)


@pytest.mark.slow  # every mutant of the kernel, about 5 s
def test_linear_equivalent_raising_and_caught_mutants():
    outcomes = {(o.mutant.operator, o.mutant.before, o.mutant.after): o
                for o in mutate.run(kernels=["linear_backward", "affine_backward"],
                                    dtypes=("float64",), progress=False)}
    # dx = dy without W^T cannot be reshaped to x's shape (V != D): it raises
    assert outcomes[("drop factor", "dy2 @ W.T", "dy2")].status == "raises"
    live = [o for o in outcomes.values() if o.status == "live"]
    assert live and all(o.caught("float64") and o.blamed("float64") for o in live)
    dW = outcomes[("drop factor", "x2.T @ dy2", "dy2")]
    assert dW.status == "raises" or dW.rows == ("linear",)


def test_dropout_slice_caught_blamed_and_explained():
    """Every mutant of dropout's one-line backward, float64: the counts and patterns computed."""
    outcomes = mutate.run(kernels=["dropout_backward"], dtypes=("float64",), progress=False)
    by_change = {(o.mutant.operator, o.mutant.after): o for o in outcomes}
    assert set(by_change) == {("drop factor", "dy"), ("drop factor", "cache.scale"),
                              ("flip sign", "-(dy * cache.scale)")}
    assert by_change[("drop factor", "dy")].patterns("float64") == ["derivative missing"]
    assert by_change[("drop factor", "cache.scale")].patterns("float64") == \
        ["dout factor missing"]
    assert by_change[("flip sign", "-(dy * cache.scale)")].patterns("float64") == ["sign"]
    total = mutate.scores(outcomes, lambda o: o.mutant.function, ("float64",))[-1]
    assert (total.mutants, total.live, total.equivalent, total.raises) == (3, 3, 0, 0)
    assert total.caught == total.blamed == total.explained == {"float64": 3}


@pytest.mark.slow  # two dtypes, a dozen checks with their diagnoses: about 7 s
def test_rms_norm_slice_scores_and_patterns():
    dtypes = ("float64", "float32")
    outcomes = mutate.run(kernels=["rms_norm_backward"], operators=["drop term", "flip sign"],
                          dtypes=dtypes, progress=False)
    by_change = {(o.mutant.before, o.mutant.after): o for o in outcomes}
    term = "y * mean_dy_y"
    missing = by_change[(f"dy - {term}", "dy")]
    flipped = by_change[(f"dy - {term}", f"dy + {term}")]
    for o in (missing, flipped):
        assert o.status == "live" and all(o.caught(d) and o.blamed(d) for d in dtypes)
    # a missing term and a sign error inside the derivative read apart
    assert missing.patterns("float64") == ["path missing"]
    assert flipped.patterns("float64") == ["path sign"]
    total = mutate.scores(outcomes, lambda o: o.mutant.operator, dtypes)[-1]
    assert total.mutants == len(outcomes)
    assert total.live == sum(o.status == "live" for o in outcomes)
    assert total.caught == {d: total.live for d in dtypes}
    assert mutate.survivors(outcomes, dtypes) == []


def test_pattern_of_reads_the_diagnosis():
    assert mutate.pattern_of("scaled by a constant: 2 x the right one") == "constant"
    assert mutate.pattern_of("missing the path through `mul` at x.py:3 (`a * b`)") == \
        "path missing"
    assert mutate.pattern_of("no common bug pattern fits") == ""
    assert mutate.pattern_of("") == ""


@pytest.mark.slow  # the example's oracle compiled and attributed: about 5 s
def test_a_users_module(capsys):
    status = main(["mutate", "--module", str(EXAMPLE), "--kernel", "softcap_backward",
                   "--dtype", "float64", "--operator", "flip sign"])
    out = capsys.readouterr().out
    assert status == 0  # no survivors
    assert "softcap_backward" in out and "no survivors" in out
    outcomes = mutate.run(module=EXAMPLE, kernels=["softcap_backward"],
                          operators=["flip sign"], dtypes=("float64",), progress=False)
    assert outcomes and all(o.status == "live" and o.caught("float64") for o in outcomes)


@pytest.mark.parametrize("argv, message", [
    (["mutate", "--kernel", "nope_backward"], "no backward named nope_backward"),
    (["mutate", "--limit", "0"], "--limit: expected a positive integer"),
    (["mutate", "--module", str(EXAMPLE), "--kernel", "nope"],   # a file's module is its stem
     "known: glu_backward, my_layers, softcap_backward"),
])
def test_usage_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


USER_MODULE = """
import numpy as np
import jax.numpy as jnp
from checks.registry import Row


def double_forward(x, params):
    return 2 * x, x


def double_backward(dy, cache):
    return {backward}, {{}}


ROWS = [Row("double", double_forward, double_backward, lambda x, params: 2 * x,
            lambda rng, dt, s: ([rng.standard_normal((s["B"], s["T"], s["D"])).astype(dt)], {{}}))]
"""


@pytest.mark.parametrize("backward, message", [
    ("dy * 1.0", "double_backward: the unmutated backward fails its own check (row double, "
                 "float64, failing: x), so every mutant of it would count as caught"),
    ("undefined_name", "double: its forward or backward raises before any mutation "
                       "(NameError: name 'undefined_name' is not defined)"),
    ("2 * (dy", "could not be imported: SyntaxError"),
    ("np.missing(dy)", "raises before any mutation (AttributeError"),
])
def test_a_users_module_that_is_wrong_before_any_mutation_is_one_line(backward, message,
                                                                      tmp_path, capsys):
    """A backward that fails its own check would score every mutant 'caught'; one that raises,
    or a module that does not import, is a one-line usage error, not a traceback."""
    path = tmp_path / "double_layer.py"
    path.write_text(USER_MODULE.format(backward=backward))
    assert main(["mutate", "--module", str(path), "--dtype", "float64"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_wrong_tensor_takes_a_same_shaped_local_defined_above():
    source = Source("demo", "def f_backward(dy, cache):\n"
                            "    a, b, w = cache\n"
                            "    da = dy * b\n"
                            "    db = dy * a + w.shape[0]\n"
                            "    return da, db\n", "demo.py")
    assert not [m for m in source.mutants("f_backward") if m.operator == "wrong tensor"]
    source.local_shapes("f_backward", {"a": {(3,)}, "b": {(3,)}, "dy": {(3,)}, "da": {(3,)},
                                       "db": {(3,)}, "w": {(2, 2)}})
    wrong = {(m.line, m.before, m.after) for m in source.mutants("f_backward")
             if m.operator == "wrong tensor"}
    assert (3, "b", "a") in wrong and (3, "dy", "b") in wrong and (4, "a", "da") in wrong
    assert (3, "b", "da") not in wrong          # da does not exist yet on line 3
    assert not any("w" in (m[1], m[2]) for m in wrong)  # no other local has w's shape
    namespace = source.load(next(m for m in source.mutants("f_backward")
                                 if (m.operator, m.line, m.before, m.after)
                                 == ("wrong tensor", 3, "b", "a")))
    da, db = namespace["f_backward"](np.ones(3), (np.full(3, 2.0), np.full(3, 5.0),
                                                  np.zeros((2, 2))))
    assert np.all(da == 2.0) and np.all(db == 4.0)


def markdown_table(text, first_header):
    """{first cell: {header: cell}} of the markdown table whose first header is first_header."""
    lines = text[text.index("| " + first_header):].splitlines()
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]
    head, table = cells(lines[0]), {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        table[cells(line)[0]] = dict(zip(head, cells(line)))
    return table


def test_docs_mutation_table_is_recomputed_for_one_kernel():
    """docs/zoo.md's row of dropout's backward (the command's output), recomputed in float64."""
    from checks import docs
    documented = markdown_table(docs.section(docs.DOCS / "zoo.md", mutate.DOCS_SECTION),
                                "kernel")["dropout_backward"]
    outcomes = mutate.run(kernels=["dropout_backward"], dtypes=("float64",), progress=False)
    text = mutate.format_scores(mutate.scores(outcomes, lambda o: o.mutant.function,
                                              ("float64",)), ("float64",), "kernel")
    got = markdown_table(text, "kernel")["dropout_backward"]
    for column in got:
        assert documented[column] == got[column], (column, documented, got)


@pytest.mark.slow  # checks the mutant of an attention kernel: seconds of compilation
def test_a_scale_of_sizes_is_a_constant_to_mutate():
    """1 / sqrt(P) is shape arithmetic, but also the scale a derivation forgets or inverts."""
    import kernels.attention
    found = {(m.before, m.after) for m in Source.of_module(kernels.attention).mutants(
        "_attention_backward") if m.operator == "constant"}
    # inverted, forgotten, or taken from another size of the function (a static argument)
    assert found == {("1 / math.sqrt(P)", "math.sqrt(P)"), ("1 / math.sqrt(P)", "1")} | {
        ("1 / math.sqrt(P)", f"1 / math.sqrt({n})") for n in "BDHST"}


def test_mistakes_written_so_that_the_shapes_fit():
    """The swap of a product's operands written with transposes, a mean for a sum, a count for
    another, a bias gradient left unsummed, a permutation with two axes exchanged, the
    neighbouring block's cache: each a mutant, and each computes what it says."""
    source = Source("demo", "def f_backward(dy, cache):\n"
                            "    B, T, D = dy.shape\n"
                            "    dW = cache.x.T @ dy.reshape(-1, D)\n"
                            "    db = column_sum(dy.reshape(-1, D)) / B\n"
                            "    s = (dy * cache.y).mean(axis=-1, keepdims=True)\n"
                            "    i = cache.i\n"
                            "    dx = dy.transpose(1, 0, 2) * cache.blocks[i]\n"
                            "    return dx, s, dW, db\n", "demo.py")
    found = {(m.operator, m.before, m.after) for m in source.mutants("f_backward")}
    assert ("swap operands", "cache.x.T @ dy.reshape(-1, D)",
            "dy.reshape(-1, D).swapaxes(-1, -2) @ cache.x") in found
    assert ("sum for mean", "(dy * cache.y).mean(axis=-1, keepdims=True)",
            "(dy * cache.y).sum(axis=-1, keepdims=True)") in found
    assert ("sum for mean", "column_sum(dy.reshape(-1, D))",
            "dy.reshape(-1, D).mean(axis=0)") in found
    assert ("drop reduction", "column_sum(dy.reshape(-1, D))", "dy.reshape(-1, D)") in found
    assert {("constant", "column_sum(dy.reshape(-1, D)) / B", f"column_sum(dy.reshape(-1, D)) / {n}")
            for n in "DT"} <= found
    assert {m[2] for m in found if m[0] == "transpose" and m[1] == "dy.transpose(1, 0, 2)"} == {
        "dy", "dy.transpose(2, 0, 1)", "dy.transpose(1, 2, 0)"}  # (0, 1, 2): no transpose at all
    assert {m[2] for m in found if m[0] == "shift" and "blocks" in m[1]} == {
        "cache.blocks[i + 1]", "cache.blocks[i - 1]"}
    mean = next(m for m in source.mutants("f_backward") if m.operator == "sum for mean"
                and m.before.startswith("column_sum"))
    namespace = source.load(mean)
    namespace["column_sum"] = lambda y: y.sum(axis=0)
    cache = type("Cache", (), {"x": np.ones((6, 2)), "y": np.ones((2, 3, 4)),
                               "blocks": [np.ones((3, 2, 4))], "i": 0})
    _, _, _, db = namespace["f_backward"](np.ones((2, 3, 4)), cache)
    assert np.allclose(db, 1 / 2)  # the mean of six ones over B = 2, not their sum (6 / 2)


def test_wrong_cached_takes_a_field_of_the_same_shape():
    """One read of a cached tensor replaced by another field of the cache with its shape (in
    some row's case: recorded under 'cache.NAME'); never a field of another shape, and never a
    cache field in place of a local."""
    source = Source("demo", "def f_backward(dy, cache):\n"
                            "    q, k = cache.q, cache.k\n"
                            "    return dy * q + cache.w.sum() * k\n", "demo.py")
    source.local_shapes("f_backward", {"q": {(3,)}, "k": {(3,)}, "dy": {(3,)},
                                       "cache.q": {(3,)}, "cache.k": {(3,)}, "cache.w": {(2,)}})
    found = {(m.operator, m.before, m.after) for m in source.mutants("f_backward")}
    assert {(b, a) for o, b, a in found if o == "wrong cached"} == {
        ("cache.q", "cache.k"), ("cache.k", "cache.q")}
    assert not any(a.startswith("cache.") for o, b, a in found if o == "wrong tensor")
    mutant = next(m for m in source.mutants("f_backward") if m.operator == "wrong cached"
                  and m.before == "cache.q")
    Cache = type("Cache", (), {"q": np.full(3, 2.0), "k": np.full(3, 5.0), "w": np.zeros(2)})
    assert np.all(source.load(mutant)["f_backward"](np.ones(3), Cache) == 5.0)
