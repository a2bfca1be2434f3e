"""Two cached tensors read in each other's place, named by replaying the hand backward with them
exchanged (checks.replay).  The layer is written here, as a user would, not taken from kernels/:
a gated unit y = (x Wa) * sigmoid(x Wb) whose cache holds the two branches a and s, of one
shape, so a backward that unpacks them in the wrong order runs and returns wrong gradients."""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from checks import replay
from checks.engine import check_layer
from checks.mutate import pattern_of
from checks.verdict import Kind

RNG = np.random.default_rng(11)
X = RNG.standard_normal((6, 4))
PARAMS = {"Wa": RNG.standard_normal((4, 5)), "Wb": RNG.standard_normal((4, 5))}


class Cache(NamedTuple):
    x: np.ndarray
    a: np.ndarray
    s: np.ndarray
    Wa: np.ndarray
    Wb: np.ndarray


def oracle(x, params):
    return (x @ params["Wa"]) * jax.nn.sigmoid(x @ params["Wb"])


def forward(x, params, nested=False):
    a = x @ params["Wa"]                                   # (N, F)
    s = 1 / (1 + np.exp(-(x @ params["Wb"])))              # (N, F)
    if nested:
        return a * s, {"x": x, "branches": (a, s), "W": [params["Wa"], params["Wb"]]}
    return a * s, Cache(x, a, s, params["Wa"], params["Wb"])


def gate_backward(dy, a, s):
    """The gate's share: the upstream gradient through y = a * sigmoid(z), into z."""
    return dy * a * s * (1 - s)                            # (N, F)


def on(xp, dy):
    """A helper handed its array module (``xp``, as backends do): not an array argument."""
    return xp.asarray(dy)


def backward(dy, cache, *, swapped=False, nested=False, half_slope=False, call_swapped=False):
    if nested:
        x, (a, s), (Wa, Wb) = cache["x"], cache["branches"], cache["W"]
        if swapped:
            s, a = cache["branches"]
    elif swapped:
        x, s, a, Wa, Wb = cache                            # a and s in each other's place
    else:
        x, a, s, Wa, Wb = cache
    dy = on(np, dy)                                        # (N, F)
    da = dy * s                                            # (N, F)
    dz = (gate_backward(dy, s, a) if call_swapped else gate_backward(dy, a, s)) \
        * (0.5 if half_slope else 1.0)                     # (N, F)
    return da @ Wa.T + dz @ Wb.T, {"Wa": x.T @ da, "Wb": x.T @ dz}


def run(dtype=np.float64, **bug):
    nested = bug.get("nested", False)
    return check_layer(lambda x, p: forward(x, p, nested=nested),
                       lambda d, c: backward(d, c, **bug), oracle,
                       [X.astype(dtype)], {k: v.astype(dtype) for k, v in PARAMS.items()},
                       name="gated", input_names=("x",))


def test_the_right_backward_passes():
    assert run().ok and run(nested=True).ok


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_two_cached_tensors_read_in_each_others_place_are_named(dtype):
    report = run(dtype, swapped=True)
    failing = [t for t in report.tensors if not t.ok]
    assert failing, str(report)
    for t in failing:
        assert t.verdict.kind is Kind.HAND_WRONG, str(report)
        assert "reads cache.a and cache.s in each other's place" in t.diagnosis, t.diagnosis
        assert pattern_of(t.diagnosis) == "cache exchanged"


def test_a_nested_cache_is_searched_level_by_level():
    report = run(swapped=True, nested=True)
    failing = [t for t in report.tensors if not t.ok]
    assert failing, str(report)
    assert all("reads cache['branches'][0] and cache['branches'][1] in each other's place"
               in t.diagnosis for t in failing), [t.diagnosis for t in failing]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_two_arguments_of_a_call_in_each_others_place_are_named_with_the_call(dtype):
    """gate_backward(dy, s, a) for gate_backward(dy, a, s): no exchange of the cache undoes it
    (the cache is right), the replay that exchanges a and s in that one call does.  A call
    before it hands a helper the NumPy module (whose ``dtype`` and ``ndim`` are a class and a
    function): its arguments are no arrays, and the calls after it are still recorded."""
    report = run(dtype, call_swapped=True)
    failing = [t for t in report.tensors if not t.ok]
    assert failing, str(report)
    for t in failing:
        assert t.verdict.kind is Kind.HAND_WRONG, str(report)
        assert ("the call of gate_backward at tests/test_replay.py:" in t.diagnosis
                and "in backward (`dz = (gate_backward(dy, s, a) if call_swapped" in t.diagnosis
                and "passes its arguments a and s in each other's place" in t.diagnosis), \
            t.diagnosis
        assert pattern_of(t.diagnosis) == "arguments exchanged"


def test_the_functions_patched_for_a_replay_are_restored():
    run(call_swapped=True)
    assert gate_backward.__name__ == "gate_backward" and not hasattr(gate_backward,
                                                                     "__wrapped__")


def test_a_bug_no_exchange_undoes_is_not_named_an_exchange():
    """A gate's derivative at half its slope: no pair of cached tensors exchanged makes the
    backward right, so the replay names nothing and another explanation (or none) is given."""
    report = run(half_slope=True)
    failing = [t for t in report.tensors if not t.ok]
    assert failing, str(report)
    assert not any("in each other's place" in t.diagnosis for t in failing)
    assert not any("arguments" in t.diagnosis for t in failing)


def test_exchanged_swaps_two_fields_at_any_level_and_leaves_the_cache_as_it_was():
    a, b, c = np.zeros(2), np.ones(2), np.full(2, 2.0)
    cache = {"top": Cache(a, b, c, a, b), "list": [a, b], "tuple": (a, (b, c))}
    new = replay.exchanged(cache, ("top",), "a", "s")
    assert new["top"].a is c and new["top"].s is b and cache["top"].a is b
    new = replay.exchanged(cache, ("list",), 0, 1)
    assert new["list"][0] is b and new["list"][1] is a and isinstance(new["list"], list)
    new = replay.exchanged(cache, ("tuple", 1), 0, 1)
    assert new["tuple"][1][0] is c and new["tuple"][1][1] is b and cache["tuple"][1][0] is b
    labels = [(la, lb) for _, _, _, la, lb in replay.pairs(cache)]
    assert ("cache['list'][0]", "cache['list'][1]") in labels
    assert ("cache['tuple'][1][0]", "cache['tuple'][1][1]") in labels
    assert ("cache['top'].a", "cache['top'].s") in labels


def test_the_replays_are_silent(recwarn):
    """A wrong pair may overflow (the input, scaled near the largest float, exchanged with the
    branch a that multiplies the upstream gradient): the replays warn nothing; what the user
    sees is the verdict."""
    cache = forward(X, PARAMS)[1]
    cache = cache._replace(x=cache.x * 1e307)                           # finite, near the top
    found = replay.find_exchange(backward, cache, np.full((6, 5), 100.0), ("x",),
                                 {"x": (np.zeros((6, 4)), 0.0)})
    assert found is None
    assert not [w for w in recwarn.list if issubclass(w.category, RuntimeWarning)]


def test_a_patched_function_swaps_only_in_the_replaying_thread():
    """While a replay has put its wrapper in place, a call of the function from the same line
    in another thread is the function's own (a Dask worker with several threads)."""
    import threading

    def caller(f):
        return f(1, 2)                                     # the site: this line, this code

    sites = []
    probe = lambda *args: sites.append(args) or args     # noqa: E731
    site = replay.Site(caller.__code__, caller.__code__.co_firstlineno + 1, probe.__code__,
                       ("x", "y"), ())
    patched = replay._swapping(lambda x, y: (x, y), site, "x", "y")
    assert caller(patched) == (2, 1)                       # this thread, this line: exchanged
    out = []
    thread = threading.Thread(target=lambda: out.append(caller(patched)))
    thread.start()
    thread.join()
    assert out == [(1, 2)]
