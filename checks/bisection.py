"""Bisection of a composition of kernels: which stage's backward is wrong.

A model-level check says *that* a gradient is wrong, not *where*: one wrong layer smears into
every gradient below it.  Bisection checks each stage on its own, in backward order, at the
composition's own intermediate values, fed the REFERENCE upstream gradient — the oracle's
gradient with respect to that stage's output (as in an adjoint debug mode), so a wrong stage
cannot spoil the stages after it.  The first stage whose hand backward disagrees with its oracle
is named, then explained by the ordinary per-layer check (``check_layer``, all three legs and the
diagnosis) on that stage with its real inputs.

Two pieces make a composition bisectable:

* a ``Tape`` that runs its stages and records them: ``out, cache = tape.run(name, forward,
  backward, *inputs, params, oracle=..., **static)`` in the forward, ``tape.backward(name,
  backward, dout, cache)`` in the backward (optional: it records the upstream gradient the
  composition gave the stage, so a wrong gradient *between* stages shows too);
* the composition's oracle as a function of probes, ``oracle(probes) -> output``, adding
  ``probes[name]`` to the output of each stage (``reference.transformer.probe`` does it).

``bisect(tape, oracle, dout)`` then returns a ``Bisection``.  The lab's whole model runs through
a tape as it is (``kernels.model`` calls its stages through one): ``bisect_model``.  A failing
check of a composition (the registry's model row, whose ``Row.tape`` makes its tape) is bisected
in its diagnosis: ``bisect_check`` on the check's own inputs and backward, ``statement`` for its
failing tensors.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import reference
from checks import tolerances
from checks.engine import LayerCheck
from checks.legs import normwise
from checks.registry import BTD, BY_NAME, MHA_AXES, MHCA_AXES
from checks.report import Report
from kernels import model as whole_model
from kernels.backend import to_numpy
from reference import transformer


@dataclasses.dataclass
class Stage:
    """One recorded call of a composition: a kernel pair, its oracle and what it saw."""
    name: str
    forward: Callable   # forward(*inputs, params, **static) -> (out, cache)
    backward: Callable  # backward(dout, cache) -> (dinputs, dparams)
    oracle: Callable    # oracle(*inputs, params, **static) -> out, in jax.numpy
    inputs: tuple
    params: dict
    static: dict
    out: object         # the stage's output in the composition's forward
    cache: object
    dout: object = None  # the upstream gradient the composition's backward gave it, when seen
    axes: dict = dataclasses.field(default_factory=dict)
    input_names: tuple | None = None
    sizes: dict | None = None


class Tape:
    """Runs a composition's stages and records them, in forward order.

    oracles: stage name -> oracle, or a function of the name (used when ``run`` gets none).
    backwards: stage name -> a backward used instead of the composition's own (to plant a bug,
    or to try a fix), in the composition's backward and in the bisection alike.
    describe: stage -> dict of Stage fields (axes, input_names, sizes) for its reports.
    Also the tape of ``kernels.model`` (its ``forward`` and ``backward`` methods)."""

    def __init__(self, oracles=None, backwards=None, describe=None):
        self.oracles, self.backwards = oracles or {}, dict(backwards or {})
        self.describe = describe
        self.stages: list[Stage] = []

    def _oracle(self, name):
        oracle = self.oracles(name) if callable(self.oracles) else self.oracles.get(name)
        if oracle is None:
            raise ValueError(f"oracles: no oracle for the stage {name!r}")
        return oracle

    def run(self, name, forward, backward, *inputs, params, oracle=None, **static):
        """Run forward(*inputs, params, **static) as the stage ``name``: (out, cache)."""
        return self._record(name, forward, backward, inputs, params, static, oracle)

    def forward(self, name, forward, backward, inputs, params, static):
        """kernels.model's tape protocol: the same as run."""
        return self._record(name, forward, backward, inputs, params, static, None)

    def _record(self, name, forward, backward, inputs, params, static, oracle):
        if any(s.name == name for s in self.stages):
            raise ValueError(f"name: the stage {name!r} was recorded twice (one forward per tape)")
        out, cache = forward(*inputs, params, **static)
        stage = Stage(name, forward, self.backwards.get(name, backward),
                      oracle or self._oracle(name), tuple(inputs), params, dict(static), out,
                      cache)
        for key, value in (self.describe(stage) if self.describe else {}).items():
            setattr(stage, key, value)
        self.stages.append(stage)
        return out, cache

    def backward(self, name, backward, dout, cache):
        """The stage's backward, recording the upstream gradient: the planted one, if any, else
        the one the composition's backward calls (which the stage keeps from then on), so that
        the bisection checks the code the composition ran, even when the composition's backward
        is another version of the code that ran its forward (a mutant of its module)."""
        stage = self[name]
        stage.dout = dout
        if name not in self.backwards:
            stage.backward = backward
        return stage.backward(dout, cache)

    def __getitem__(self, name) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"no stage named {name!r}; the tape holds "
                       f"{', '.join(s.name for s in self.stages)}")


def reference_upstream(oracle, stages, dout) -> dict:
    """stage name -> the oracle's gradient with respect to that stage's output (float64), for
    the upstream gradient dout of the composition's output."""
    probes = {s.name: jnp.zeros(np.shape(to_numpy(s.out)), jnp.float64) for s in stages}
    out, vjp = jax.vjp(oracle, probes)
    (grads,) = vjp(jnp.asarray(np.asarray(to_numpy(dout), np.float64), out.dtype))
    return {name: np.asarray(g) for name, g in grads.items()}


@dataclasses.dataclass
class Bisection:
    """Stages in backward order with their screening reports; the first that disagrees."""
    screened: list            # (stage name, Report of hand vs autodiff at the reference dout)
    culprit: str | None       # the first stage, in backward order, whose backward is wrong
    report: Report | None     # its full check (three legs, diagnosis) with its real inputs
    glue: str = ""            # a wrong gradient between right stages, when every stage passes

    @property
    def ok(self) -> bool:
        return self.culprit is None and not self.glue

    def __str__(self) -> str:
        width = max([len(n) for n, _ in self.screened] + [5])
        lines = ["stages in backward order, each fed the oracle's upstream gradient:"]
        for name, r in self.screened:
            worst = max([t.score for t in r.tensors if math.isfinite(t.score)] + [0.0])
            verdict = "ok" if r.ok else "FAIL: " + ", ".join(r.failing)
            lines.append(f"  {name.ljust(width)}  err/tol {worst:9.3g}  {verdict}")
        if self.culprit:
            lines += ["", f"first wrong stage in backward order: {self.culprit}"
                      + ("; its own check with its real inputs:" if self.report else "")]
            lines += [str(self.report)] if self.report else []
        elif self.glue:
            lines += ["", self.glue]
        else:
            lines += ["", "every stage's backward agrees with its oracle"]
        return "\n".join(lines)


def bisect(tape: Tape, oracle: Callable, dout, *, seed=0, fd="central",
           policy: tolerances.Policy = tolerances.DEFAULT, explain=True) -> Bisection:
    """The first stage of the tape, in backward order, whose hand backward disagrees with its
    oracle when fed the oracle's upstream gradient, explained by check_layer on that stage.

    tape: the stages of one forward of the composition (``Tape``).  oracle(probes) -> the
    composition's output in jax.numpy, float64, adding probes[name] to each stage's output.
    dout: the upstream gradient of the composition's output (the one its backward was given).
    seed, fd, policy: as in check_layer, for the explaining check; explain=False names the stage
    without it (the diagnosis of an unfamiliar error costs seconds)."""
    if not tape.stages:
        raise ValueError("tape: no stage was recorded (run the composition's forward through it)")
    unknown = sorted(set(tape.backwards) - {s.name for s in tape.stages})
    if unknown:
        raise ValueError(f"backwards: no stage named {', '.join(map(repr, unknown))}; the "
                         f"stages are {', '.join(s.name for s in tape.stages)}")
    upstream = reference_upstream(oracle, tape.stages, dout)
    screened, culprit = [], None
    for stage in reversed(tape.stages):
        report = _check(stage, seed=seed, fd="none", policy=policy, dout=upstream[stage.name],
                        diagnose=False)
        screened.append((stage.name, report))
        if not report.ok and culprit is None:
            culprit = stage
    if culprit is not None:
        return Bisection(screened, culprit.name,
                         _check(culprit, seed=seed, fd=fd, policy=policy) if explain else None)
    return Bisection(screened, None, None, _glue(tape.stages, upstream))


def _check(stage, diagnose=True, **kwargs) -> Report:
    """check_layer on one stage with its recorded inputs."""
    return LayerCheck(stage.forward, stage.backward, stage.oracle, list(stage.inputs),
                      stage.params, static=stage.static, name=stage.name,
                      input_names=stage.input_names, axes=stage.axes, sizes=stage.sizes,
                      **kwargs).run(diagnose)


def _glue(stages, upstream) -> str:
    """Every stage is right: is the gradient the composition passed between them right?  The
    first stage, in backward order, whose recorded upstream gradient is off the reference by
    more than sqrt(u) relative (rounding through a few stages stays far below; a dropped or
    doubled path is of order one)."""
    for stage in reversed(stages):
        if stage.dout is None:
            continue
        seen = np.asarray(to_numpy(stage.dout), np.float64)
        u = tolerances.unit_roundoff(np.asarray(to_numpy(stage.out)).dtype)
        err = normwise(seen, upstream[stage.name])
        if not err <= math.sqrt(u):
            return (f"every stage's backward agrees with its oracle, but the gradient the "
                    f"composition passed to the output of {stage.name} is off the oracle's by "
                    f"{err:.2g} (relative): the glue between {stage.name} and the stages after "
                    f"it (a residual or a sum of paths) is wrong")
    return ""


# --- a failing check of a composition, bisected -------------------------------------------

BISECTED = "bisected (each stage fed the oracle's upstream gradient): "


def bisect_check(check, tape: Tape, *, explain=True) -> Bisection:
    """The bisection of a composition checked as one layer (a registry row such as the whole
    model): its forward run again through ``tape`` (it takes ``tape=``) with the check's inputs,
    the check's own backward run on that cache with the check's upstream gradient (so the stages
    record the backwards the checked code calls), and the oracle driven with probes (it takes
    ``probes=``).  check: a ``LayerCheck`` whose oracle and hand stages have run."""
    _, cache = check.forward_fn(*check.inputs, check.params, tape=tape, **check.static)
    check.backward_fn(check.dout, cache)
    oracle = lambda probes: check.oracle_fn(*check.inputs64, check.params64, **check.static,
                                            probes=probes)
    fd = check.fd_scheme if check.fd_scheme in ("central", "richardson") else "central"
    return bisect(tape, oracle, check.dout64, seed=check.seed, fd=fd, explain=explain)


def statement(result: Bisection) -> str:
    """What a bisection found, as one statement for the composition's failing tensors: the
    wrong stage with what its own check says, or the wrong glue; '' when it found nothing (the
    composition's failure is then left unexplained: nothing is claimed that was not found)."""
    if result.culprit is not None:
        screened = dict(result.screened)[result.culprit]
        own = result.report
        failing = [t for t in own.tensors if not t.ok] if own is not None else []
        said = "; ".join(f"{t.name}: {t.diagnosis}" for t in failing if t.diagnosis)
        detail = (f"; its own check with its real inputs: {said}" if said else
                  f" (its check fails in {', '.join(screened.failing) or 'its run'})")
        return (f"{BISECTED}stage {result.culprit}'s backward is wrong, the stages after it "
                f"agree with their oracles{detail}")
    if result.glue:
        return BISECTED + result.glue
    return ""


def explain_failure(check, tape_factory: Callable) -> str:
    """The bisection's statement for a failing check of a composition (``statement``), or ''
    when the bisection finds nothing or cannot run: a diagnosis never breaks the check it
    explains."""
    try:
        return statement(bisect_check(check, tape_factory()))
    except Exception:  # an explanation that cannot be computed is no explanation
        if os.environ.get("GRADLAB_DEBUG"):
            raise
        return ""


# --- the lab's model ------------------------------------------------------------------------

# a stage of the model by its kind (the last part of its name, ``dec0.cross`` -> cross)
STAGE_ORACLES = {"attn": transformer.attention_sublayer, "self": transformer.attention_sublayer,
                 "cross": transformer.cross_sublayer, "ff": transformer.ff_sublayer,
                 "out": transformer.head, "loss": reference.cross_entropy}
STAGE_AXES = {"attn": MHA_AXES, "self": MHA_AXES, "cross": MHCA_AXES, "ff": BY_NAME["ff"].axes,
              "out": {"y": BTD, "W": ("row", "col"), "b": ("class",)},
              "loss": BY_NAME["cross_entropy"].axes}
STAGE_INPUTS = {"cross": ("x", "z"), "out": ("y",), "loss": ("logits", "targets")}


def _kind(name):
    return name.rsplit(".", 1)[-1]


def model_stage(stage) -> dict:
    """Axes, input names and named sizes of one of the model's stages, for its reports."""
    kind = _kind(stage.name)
    x = stage.inputs[0]
    sizes = {"B": int(x.shape[0]), "T": int(x.shape[1])}
    if "WQ" in stage.params:
        H, P = stage.params["WQ"].shape[:2]
        sizes.update(H=int(H), P=int(P), D=int(H * P))
    if kind in ("out", "loss"):
        sizes["V"] = int((stage.params["W"] if kind == "out" else x).shape[-1])
    return {"axes": STAGE_AXES[kind], "input_names": STAGE_INPUTS.get(kind, ("x",)),
            "sizes": sizes}


def model_tape(backwards=None) -> Tape:
    """A tape for kernels.model: its stages' oracles from reference.transformer, found by the
    stage's kind (``dec0.cross`` -> cross)."""
    return Tape(lambda name: STAGE_ORACLES[_kind(name)], backwards, describe=model_stage)


def bisect_model(src, tgt, params, *, embedding, dloss, backwards=None, dropout=0.0,
                 dropout_mask=None, seed=0, fd="central", explain=True) -> Bisection:
    """Run the lab's model forward and backward through a tape (with ``backwards`` planted in
    place of stages' own) and bisect it against reference.model.  dloss: the upstream scalar."""
    tape = model_tape(backwards)
    _, cache = whole_model.model_forward(src, tgt, params, embedding=embedding, dropout=dropout,
                                         dropout_mask=dropout_mask, tape=tape)
    whole_model.model_backward(np.asarray(dloss, dtype=params["out.W"].dtype), cache)
    params64 = {k: np.asarray(to_numpy(v), np.float64) for k, v in params.items()}
    oracle = lambda probes: reference.model(src, tgt, params64, embedding=embedding,
                                            dropout=dropout, dropout_mask=dropout_mask,
                                            probes=probes)
    return bisect(tape, oracle, dloss, seed=seed, fd=fd, explain=explain)
