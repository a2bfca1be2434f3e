"""One row per layer: the suite, the table and the calibration all enrol every row.

A row pairs a kernel's forward/backward with its oracle and says how to make inputs:
``make(rng, dtype, sizes) -> (inputs, params)`` or ``(inputs, params, static)``: plain random
draws and the lab's initialisation, as a user's are.  Nothing is placed away from a kink (leaky
ReLU at 0): the checker finds the elements that sit within rounding of one (``checks.rounding``,
``RoundingModel.kinks``) and judges either branch right there.  Integer inputs (ids, targets) are
never differentiated; ``nondiff`` names further inputs that are not.  ``axes`` names the axes of
each tensor so a failure can say where it is.  ``analytic`` rows (no kink, no comparison on the
data) can also be checked with the complex step.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

import kernels
import reference
from checks import contract
from kernels import model as whole_model

# Small enough that every tensor also gets an element-wise finite-difference check, with S != T
# and V != D so that transposed or swapped gradients cannot pass by accident.
DEFAULT_SIZES = {"B": 2, "T": 5, "S": 3, "D": 8, "H": 2, "F": 12, "V": 6}


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    forward: Callable
    backward: Callable
    oracle: Callable
    make: Callable
    static: dict = dataclasses.field(default_factory=dict)
    nondiff: tuple = ()
    input_names: tuple = ("x",)
    axes: dict = dataclasses.field(default_factory=dict)
    analytic: bool = False
    min_sizes: dict = dataclasses.field(default_factory=dict)  # where the maths is well posed
    # size names of the row's own beyond DEFAULT_SIZES, with their defaults ({"G": 2}: key/value
    # heads); --sizes accepts them for this row
    sizes: dict = dataclasses.field(default_factory=dict)
    fixed: dict = dataclasses.field(default_factory=dict)  # sizes the row sets itself (--sizes
    #                                                        rejects them for it)
    # overrides of checks.tolerances.Policy: {field: value} or {dtype name: {field: value}}
    tolerance: dict = dataclasses.field(default_factory=dict)
    # a composition of stages (the whole model): () -> a checks.bisection.Tape for its forward's
    # tape= (its oracle takes probes=), so that a failure is bisected to its wrong stage
    tape: Callable | None = None

    def policy(self, dtype):
        """The tolerance policy this row is checked under at one dtype."""
        from checks.tolerances import DEFAULT
        return DEFAULT.override(self.tolerance, dtype)

    def size_names(self) -> dict:
        """Every size the row's case is drawn at, with its default (or the value it fixes)."""
        return {**DEFAULT_SIZES, **self.sizes, **self.fixed}

    def case(self, rng, dtype, sizes=None):
        """(inputs, params, static) for one check at the given sizes."""
        made = self.make(rng, np.dtype(dtype), {**self.size_names(), **(sizes or {})})
        inputs, params = made[0], made[1]
        static = {**self.static, **(made[2] if len(made) > 2 else {})}
        return list(inputs), params, static


def normal(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def ids(rng, shape, V):
    return rng.integers(0, V, size=shape)


def attention_params(rng, dtype, s):
    P = s["D"] // s["H"]
    w = lambda shape: normal(rng, shape, dtype, 1 / np.sqrt(shape[-2]))
    return {"WQ": w((s["H"], P, P)), "WK": w((s["H"], P, P)), "WV": w((s["H"], P, P)),
            "WO": w((s["D"], s["D"]))}


def ff_params(rng, dtype, s, x=None):
    """Feed-forward weights of scale 1/sqrt(fan-in) and biases of scale 0.1, drawn once: no
    pre-activation is kept away from leaky ReLU's kink (x, the layer's input, is unused: kept
    for callers that pass it)."""
    return {"W1": normal(rng, (s["D"], s["F"]), dtype, 1 / np.sqrt(s["D"])),
            "b1": normal(rng, (s["F"],), dtype, 0.1),
            "W2": normal(rng, (s["F"], s["D"]), dtype, 1 / np.sqrt(s["F"])),
            "b2": normal(rng, (s["D"],), dtype, 0.1)}


BTD = ("batch", "token", "feature")
HEAD_W = ("head", "row", "col")
MHA_AXES = {"x": BTD, "WQ": HEAD_W, "WK": HEAD_W, "WV": HEAD_W, "WO": ("row", "col")}
MHCA_AXES = {**MHA_AXES, "z": ("batch", "key", "feature")}


def _x(rng, dtype, s):
    return normal(rng, (s["B"], s["T"], s["D"]), dtype)


def _mhca_case(rng, dtype, s):
    return ([_x(rng, dtype, s), normal(rng, (s["B"], s["S"], s["D"]), dtype)],
            attention_params(rng, dtype, s))


def _ff_case(rng, dtype, s):
    x = _x(rng, dtype, s)
    return [x], ff_params(rng, dtype, s, x)


def _dropout_case(rng, dtype, s):
    x = _x(rng, dtype, s)
    return [x], {}, {"mask": rng.random(x.shape) >= 0.25}


MODEL_SIZES = {"D": 6, "H": 2, "F": 8, "V": 4}


def _model_tape():
    """The model's tape (checks.bisection imports this module: looked up when a check fails)."""
    from checks.bisection import model_tape
    return model_tape()


def _model_case(rng, dtype, s):
    """The whole model, two blocks per side at sizes that keep every tensor's
    element-wise finite differences quick: D = 6, H = 2 (P = 3), F = 8, V = 4 (digits 0 and 1,
    Start, Finish), so V != D != F; B and T as given."""
    return model_case(rng, dtype, {**s, **MODEL_SIZES})  # fixed; B and T from the sizes given


def model_case(rng, dtype, s):
    """The whole model, two blocks per side, at the sizes given (V = 4).  The lab's
    initialisation: weights of scale 1/sqrt(fan-in) and random biases (attention far from
    uniform), drawn once, nothing placed away from leaky ReLU's kink.  The fixed table stays
    float64 (the model casts it to the parameters' dtype), so both dtypes' checks share one
    compiled oracle."""
    s = {**s, "V": MODEL_SIZES["V"]}
    config = whole_model.ModelConfig(D=s["D"], H=s["H"], F=s["F"], V=s["V"], blocks=2)
    table = whole_model.embedding_table(config, np.float64)
    src, tgt = ids(rng, (s["B"], s["T"]), s["V"]), ids(rng, (s["B"], s["T"]), s["V"] - 2)
    params = whole_model.init_params(config, seed=int(rng.integers(2 ** 32)), dtype=dtype,
                                     std=1 / np.sqrt(s["D"]), bias_std=0.1)
    return [src, tgt], params, {"embedding": table}


ROWS = [
    Row("embedding", kernels.embedding_forward, kernels.embedding_backward, reference.embedding,
        lambda rng, dt, s: ([ids(rng, (s["B"], s["T"]), s["V"])],
                            {"E": normal(rng, (s["V"], s["D"]), dt)}),
        input_names=("ids",), axes={"E": ("token id", "feature")}, analytic=True),
    Row("posenc", kernels.posenc_forward, kernels.posenc_backward, reference.posenc,
        lambda rng, dt, s: ([_x(rng, dt, s)], {}), axes={"x": BTD}, analytic=True),
    Row("rms_norm", kernels.rms_norm_forward, kernels.rms_norm_backward, reference.rms_norm,
        lambda rng, dt, s: ([_x(rng, dt, s)], {}), axes={"x": BTD}, analytic=True),
    Row("softmax", kernels.softmax_forward, kernels.softmax_backward, reference.softmax,
        lambda rng, dt, s: ([normal(rng, (s["B"], s["T"], s["V"]), dt, 2.0)], {}),
        axes={"x": ("batch", "token", "class")}, analytic=True),
    Row("leaky_relu", kernels.leaky_relu_forward, kernels.leaky_relu_backward,
        reference.leaky_relu,
        lambda rng, dt, s: ([normal(rng, (s["B"], s["T"], s["F"]), dt)], {}),
        axes={"x": ("batch", "token", "hidden")}),
    Row("linear", kernels.linear_forward, kernels.linear_backward, reference.linear,
        lambda rng, dt, s: ([_x(rng, dt, s)],
                            {"W": normal(rng, (s["D"], s["V"]), dt, 1 / np.sqrt(s["D"])),
                             "b": normal(rng, (s["V"],), dt, 0.1)}),
        axes={"x": BTD, "W": ("row", "col"), "b": ("class",)}, analytic=True),
    Row("ff", kernels.ff_forward, kernels.ff_backward, reference.ff, _ff_case,
        axes={"x": BTD, "W1": ("row", "col"), "W2": ("row", "col"), "b1": ("hidden",),
              "b2": ("feature",)}),
    Row("mha", kernels.mha_forward, kernels.mha_backward, reference.mha,
        lambda rng, dt, s: ([_x(rng, dt, s)], attention_params(rng, dt, s)), axes=MHA_AXES,
        analytic=True),
    Row("mha-causal", kernels.mha_forward, kernels.mha_backward, reference.mha,
        lambda rng, dt, s: ([_x(rng, dt, s)], attention_params(rng, dt, s)),
        static={"causal": True}, axes=MHA_AXES, analytic=True),
    Row("mhca", kernels.mhca_forward, kernels.mhca_backward, reference.mhca, _mhca_case,
        input_names=("x", "z"), axes=MHCA_AXES, analytic=True),
    Row("cross_entropy", kernels.cross_entropy_forward, kernels.cross_entropy_backward,
        reference.cross_entropy,
        lambda rng, dt, s: ([normal(rng, (s["B"], s["T"], s["V"]), dt, 2.0),
                             ids(rng, (s["B"], s["T"]), s["V"])], {}),
        input_names=("logits", "targets"), axes={"logits": ("batch", "token", "class")},
        analytic=True),
    Row("layernorm", kernels.layernorm_forward, kernels.layernorm_backward, reference.layernorm,
        lambda rng, dt, s: ([_x(rng, dt, s)], {"g": normal(rng, (s["D"],), dt, 1.0),
                                               "b": normal(rng, (s["D"],), dt, 0.1)}),
        axes={"x": BTD, "g": ("feature",), "b": ("feature",)}, analytic=True,
        # over 2 features the output is +-g + b whatever x is (up to eps): the gradient is pure
        # cancellation and no relative comparison means anything (docs/tolerances.md)
        min_sizes={"D": 4}),
    Row("dropout", kernels.dropout_forward, kernels.dropout_backward, reference.dropout,
        _dropout_case, static={"rate": 0.25}, axes={"x": BTD}, analytic=True),
    # element-wise finite differences of all 42 tensors would run the whole model 2000 times
    # per check; every layer gets them in its own row, the model its random directions
    Row("model", whole_model.model_forward, whole_model.model_backward, reference.model,
        _model_case, input_names=("src", "tgt"), tolerance={"FD_ELEMENTWISE_MAX": 0},
        fixed=MODEL_SIZES, tape=_model_tape),
    # QK-norm cross-attention (S != T); self-attention is z = x, checked through the model.
    # Gains are standard normals, not the initial ones, so a gradient missing a gain shows.  Each
    # head's layer norm over P = 2 features is +-1 whatever q is (pure cancellation, as the
    # layernorm row at D = 2): D >= 16 keeps P = D / H >= 4 for every H the calibration draws
    Row("qknorm-mhca", kernels.qknorm_mhca_forward, kernels.qknorm_mhca_backward,
        reference.qknorm_mhca,
        lambda rng, dt, s: (lambda inputs, params: (inputs, {
            **params, "gq": normal(rng, (s["H"], s["D"] // s["H"]), dt),
            "gk": normal(rng, (s["H"], s["D"] // s["H"]), dt)}))(*_mhca_case(rng, dt, s)),
        input_names=("x", "z"), axes={**MHCA_AXES, "gq": ("head", "feature"),
                                      "gk": ("head", "feature")},
        analytic=True, sizes={"D": 16}, min_sizes={"D": 16}),
]

BY_NAME = {row.name: row for row in ROWS}


def model_at(**widths) -> Row:
    """The model row at other widths (D, H, F; the row fixes its own, and --sizes rejects
    them): the bench's large size, for the checker's own cost (experiments/checker_cost.py)."""
    unknown = sorted(set(widths) - {"D", "H", "F"})
    if unknown:
        raise ValueError(f"widths: expected D, H or F, got {', '.join(unknown)}")
    own = {k: MODEL_SIZES[k] for k in ("D", "H", "F")}  # the row's, unless given
    return dataclasses.replace(BY_NAME["model"], make=model_case,
                               fixed={"V": MODEL_SIZES["V"]}, sizes={**own, **widths})


def named_sizes(sizes=None, row=None):
    """The sizes a row's case is drawn at, with P = D / H: names for a wrong scale factor."""
    s = {**(row.size_names() if row else DEFAULT_SIZES), **(sizes or {}),
         **(row.fixed if row else {})}
    if s["D"] >= s["H"]:  # the head width, where there is one (D = 1 with the default H has none)
        s["P"] = s["D"] // s["H"]
    return s


def layer_check(row, dtype, *, seed=0, sizes=None, xp=np, fd="central", backward=None,
                transform=None):
    """The check of one row at one dtype on one backend (xp: numpy or cupy), ready to run:
    ``layer_check(...).run()`` is the report, and the check keeps what its stages computed.
    ``backward`` replaces the row's own (the bug zoo checks broken ones this way);
    ``transform(rng, inputs, params) -> (inputs, params)`` reshapes the drawn inputs (the
    calibration's ill-conditioned cases)."""
    from checks.engine import LayerCheck
    if fd == "complex" and not row.analytic:
        raise ValueError(f"fd: the complex step needs an analytic layer; {row.name} is not")
    rng = np.random.default_rng(seed)
    inputs, params, static = row.case(rng, dtype, sizes)
    if transform is not None:
        inputs, params = transform(rng, inputs, params)
    inputs = [xp.asarray(x) for x in inputs]
    params = {k: xp.asarray(v) for k, v in params.items()}
    # the sizes the case has: the registry's defaults name every size any row uses
    lengths = contract.axis_lengths([*inputs, *params.values()])
    named = {k: v for k, v in named_sizes(sizes, row).items() if v in lengths}
    return LayerCheck(row.forward, backward or row.backward, row.oracle, inputs, params,
                      static=static, nondiff=row.nondiff, seed=seed, name=row.name,
                      input_names=row.input_names, axes=row.axes, sizes=named,
                      fd=fd, policy=row.policy(dtype), tape=row.tape)


def run_row(row, dtype, **options):
    """Check one row at one dtype: the report (options as ``layer_check``)."""
    return layer_check(row, dtype, **options).run()
