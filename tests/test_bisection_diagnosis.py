"""A failing check of a composition (the registry's whole model) is bisected in its diagnosis:
every tensor blamed on the hand names the wrong stage, or the wrong gradient passed between
stages, found by checking each stage fed the oracle's upstream gradient (checks.bisection).  A
wrong stage smears a different error into every gradient below it, which no pattern of one
tensor fits; the bisection names it.  A right model gets no statement, and a bisection that finds
nothing says nothing."""
import numpy as np
import pytest

from checks import bisection, engine
from checks.diagnosis import NO_PATTERN
from checks.mutants import Source
from checks.mutate import pattern_of
from checks.registry import BY_NAME, layer_check, run_row
from kernels import model as M

MODEL = BY_NAME["model"]


def model_copy(**replace):
    """kernels.model executed afresh from its source, as a mutant of it is, with some of its
    functions replaced: the copy's model_backward calls them, the kernel module is untouched."""
    namespace = Source.of_module(M).load()
    namespace.update({name: make(namespace) for name, make in replace.items()})
    return namespace


def residual_dropped_in(stage):
    """_pair whose backward for one stage leaves out the residual path (x + layer(norm(x)) taken
    back through the layer only)."""
    def make(namespace):
        pair = namespace["_pair"]

        def planted(name, qk_norm=False, norm_position="pre"):
            forward, backward = pair(name, qk_norm, norm_position)
            if name != stage:
                return forward, backward

            def dropped(dout, cache):
                dx, grads = backward(dout, cache)
                return dx - dout, grads
            return forward, dropped
        return planted
    return make


def dz_lost_in(stage):
    """_sublayer_backward that loses the Z gradient of one cross-attention stage: every stage is
    right, the sum over the decoder's blocks is not."""
    def make(namespace):
        original = namespace["_sublayer_backward"]

        def planted(tape, dx, name, cache, grads, watch=None):
            dx, dextra = original(tape, dx, name, cache, grads, watch)
            return dx, (0 * dextra if name == stage else dextra)
        return planted
    return make


@pytest.fixture
def no_tensor_pattern(monkeypatch):
    """The whole model's tensors (``enc0.attn.WQ`` ...) get the per-tensor diagnosis' answer that
    no pattern fits (its search of the whole model's paths takes seconds, and for the composition
    kernels' mistakes it mostly finds nothing): what is left is the bisection's statement.  A
    stage's own tensors (``x``, ``W1``) get the real diagnosis."""
    real = engine.diagnose
    monkeypatch.setattr(engine, "diagnose", lambda name, *args: NO_PATTERN if "." in name
                        else real(name, *args))


def blamed(report):
    return [t for t in report.tensors if not t.ok and t.diagnosis]


@pytest.mark.slow  # the whole model and its stages compiled: about 20 s (make test-slow)
def test_a_residual_dropped_in_one_stage_is_bisected_to_that_stage(no_tensor_pattern):
    planted = model_copy(_pair=residual_dropped_in("dec0.ff"))
    report = run_row(MODEL, np.float64, backward=planted["model_backward"])
    assert not report.ok and blamed(report)
    for t in report.tensors:
        if t.ok:
            continue
        assert "stage dec0.ff's backward is wrong" in t.diagnosis, t.diagnosis
        assert "skip connection" in t.diagnosis, t.diagnosis     # the stage's own check says why
        assert pattern_of(t.diagnosis), t.diagnosis


@pytest.mark.slow  # the whole model bisected stage by stage: 61 s on a loaded machine (make test-slow)
def test_a_gradient_lost_between_right_stages_is_named_as_glue(no_tensor_pattern):
    planted = model_copy(_sublayer_backward=dz_lost_in("dec1.cross"))
    report = run_row(MODEL, np.float64, backward=planted["model_backward"])
    failing = [t for t in report.tensors if not t.ok]
    assert failing and all("the glue between enc1.ff and the stages after it" in t.diagnosis
                           and pattern_of(t.diagnosis) == "wrong glue" for t in failing), \
        [t.diagnosis for t in failing]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_right_model_passes_with_no_pattern(dtype):
    report = run_row(MODEL, dtype)
    assert report.ok, str(report)
    assert not any(t.diagnosis for t in report.tensors), str(report)


@pytest.mark.slow  # bisects every stage of the model: 8 s, beside make test's 60 s budget
def test_a_bisection_that_finds_nothing_says_nothing():
    """The right model's check bisected (as if it had failed): every stage and every gradient
    between them agree with the oracle, so there is no statement to attach."""
    check = layer_check(MODEL, np.float64)
    assert check.run(diagnose=False).ok
    result = bisection.bisect_check(check, bisection.model_tape(), explain=False)
    assert result.ok, str(result)
    assert bisection.statement(result) == ""
    assert bisection.explain_failure(check, bisection.model_tape) == ""


def test_the_tape_checks_the_backward_the_composition_calls():
    """A stage keeps the backward its composition's backward called (a mutant's module runs its
    own), unless one is planted in its place."""
    double = lambda dout, cache: (2 * dout, {})
    triple = lambda dout, cache: (3 * dout, {})
    identity = lambda x, params: x
    tape = bisection.Tape(oracles={"a": identity, "b": identity}, backwards={"b": triple})
    for name in ("a", "b"):
        tape.run(name, lambda x, params: (x, None), double, np.ones(2), params={})
    calls = [lambda dout, cache: (5 * dout, {})] * 2
    assert tape.backward("a", calls[0], np.ones(2), None)[0].tolist() == [5, 5]
    assert tape.backward("b", calls[1], np.ones(2), None)[0].tolist() == [3, 3]
    assert tape["a"].dout is not None and tape["a"].backward is calls[0]


def test_a_bisection_that_cannot_run_leaves_the_check_as_it_was(no_tensor_pattern, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no tape")
    monkeypatch.setattr(bisection, "bisect_check", broken)
    planted = model_copy(_pair=residual_dropped_in("dec0.ff"))
    report = run_row(MODEL, np.float64, backward=planted["model_backward"])
    failing = [t for t in report.tensors if not t.ok]
    assert failing and all(t.diagnosis == NO_PATTERN for t in failing), str(report)
