"""What a check concluded, as data: a kind that code branches on, and a message for people.

No logic in the lab matches the text of a message; it reads ``Verdict.kind`` and ``Verdict.ok``.
"""
from __future__ import annotations

import dataclasses
import enum


class Kind(enum.Enum):
    """Every conclusion a tensor's check can reach, with its message."""
    OK = "ok"
    FD_SET_ASIDE = "finite differences unreliable here (hand and autodiff agree)"
    HAND_WRONG = "hand is wrong (autodiff and FD agree)"
    ORACLE_WRONG = "oracle is wrong (hand and FD agree)"
    FD_DISAGREES = "hand and autodiff agree, finite differences disagree with both"
    FD_BORDERLINE = "hand and autodiff agree, FD is borderline"
    UNRESOLVED = "hand and autodiff disagree and finite differences are unreliable here"
    NO_TRIAGE = ("hand and autodiff disagree (no independent third leg: the complex step "
                 "differentiated the oracle, or finite differences were skipped)")
    ALL_DISAGREE = "all three legs disagree"
    NO_GRADIENT = "backward returned no gradient for this tensor"
    MISSHAPEN = "hand gradient has the wrong shape"
    NOT_FLOAT = "hand gradient is not a floating-point array"
    NON_FINITE = "non-finite values"
    EXTRA_GRADIENT = "backward returned a gradient for a tensor that is not differentiated"
    RAISED = "the kernel raised"


# hand and autodiff agree: finite differences near their tolerance (or set aside at a kink)
# are a note on that leg, never a failure of the kernel
PASSING = {Kind.OK, Kind.FD_SET_ASIDE, Kind.FD_BORDERLINE}
# the suspect leg, when a verdict names one (the diagnosis explains that leg's error)
BLAMES_ORACLE = {Kind.ORACLE_WRONG}


@dataclasses.dataclass(frozen=True)
class Verdict:
    kind: Kind
    detail: str = ""  # data for the message: a shape, the part that raised, a kink ...

    @property
    def ok(self) -> bool:
        return self.kind in PASSING

    def __str__(self) -> str:
        return self.kind.value + (f": {self.detail}" if self.detail else "")


class Finding(enum.Enum):
    """Precision quirks: reported, never failures by themselves, never a reason to skip a check."""
    PROMOTES = ("promotes {dtype} to {got}: look for a NumPy float64 scalar or an untyped "
                "constant (np.sqrt(2 / np.pi) * x promotes under NumPy 2), or a bfloat16 matrix "
                "product (ml_dtypes' @ returns float32: round it back with .astype)")
    LOW_PRECISION_FORWARD = ("the forward computes in lower precision than its {dtype} inputs "
                             "(its errors are {low}'s, {ratio:.2g}x what float64 rounding explains): "
                             "the forward and the inputs it rounds are judged at {low}'s "
                             "roundoff, the backward at {dtype}'s")
    LOW_PRECISION_BACKWARD = ("the backward computes in lower precision than its {dtype} inputs "
                              "(every gradient's errors are {low}'s, none a scaled copy of its "
                              "gradient): judged at {low}'s roundoff")
    KINKS = ("elements within rounding of a kink ({where}): a comparison in the oracle (leaky "
             "ReLU's x > 0, a max) flips under rounding there, so either branch is judged right")
    KINKS_UNNEEDED = ("{flipped} predicate elements within rounding of a kink: every element "
                      "agreed within the tolerances without either branch's allowance, so the "
                      "moves of their branches were not run")
    SIZES_UNMATCHED = ("sizes {sizes}: no axis of the inputs or parameters has that length, so "
                       "no scale factor is named by it (a size of another case?)")
    MIXED_FORMATS = ("the inputs and parameters are not all {dtype} ({mixed}): the check "
                     "judges {dtype}, the format of {first}, the first of them, and the kernel "
                     "computes in the wider format wherever it reads a wider tensor; cast every "
                     "float input and parameter to the format you mean to check")
    ARRANGEMENT = ("the oracle differentiates through a max (or min) that its maths does not "
                   "depend on, a stable formula's shift without stop_gradient: that path "
                   "carries no gradient but rounds otherwise, so each element is also judged "
                   "against the oracle with the max held constant (as jax.nn.softmax holds "
                   "it); elements whose tolerance that more than doubled: {where}")
    NO_ROUNDING_MODEL = ("the oracle could not be traced for the rounding model ({why}): every "
                         "element may err by {slack:.3g} x u x the tensor's largest element, "
                         "errors below that go unseen; "
                         "normwise fallback tolerance")
    NO_FINITE_DIFFERENCES = "finite differences skipped (fd='none'): hand against autodiff only"
    FD_JOINT = ("finite differences along {directions} joint directions, each moving the "
                "{tensors} tensors that agree with autodiff at once with equal shares, agree "
                "with autodiff (error {error:.2g} of their scale): a large program's check of "
                "many tensors; a failing tensor takes its own directions")
    FEW_SAMPLES = ("the rounding model ran {samples} samples per part, not more, for its program "
                   "of {elements} recorded elements: the tolerances allow {lam:.3g} spreads per "
                   "element and {bias:.3g} per set, the quantiles of a spread estimated from "
                   "{samples} samples")
    COMPLEX_STEP_ON_ORACLE = ("the hand forward does not take complex inputs: the complex step "
                              "ran on the oracle (an oracle self-check, kept out of triage)")


@dataclasses.dataclass(frozen=True)
class Note:
    finding: Finding
    values: tuple = ()  # (name, value) pairs for the message

    def __str__(self) -> str:
        return self.finding.value.format(**dict(self.values))
