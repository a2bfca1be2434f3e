"""What a check found, tensor by tensor, and how it reads: the table, the failure lines, JSON.

A failing tensor reads like

    mha.WK  FAIL  hand vs autodiff 1.3e+00 (FD agrees with autodiff) — looks like dWQ and dWK
    are swapped; worst at head 0, row 3, col 1
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Sequence

from checks.verdict import BLAMES_ORACLE, Kind, Verdict


@dataclasses.dataclass
class TensorResult:
    """The comparison of one gradient tensor across the three legs."""
    name: str
    shape: tuple
    hand_vs_autodiff: float = math.nan   # normwise relative error: max |hand - auto| / max |auto|
    score: float = math.nan               # max_i |hand_i - auto_i| / tol_i: at most 1 passes
    hand_vs_fd: float = math.nan          # relative to |g| |v| (directional) or max |g| (elements)
    autodiff_vs_fd: float = math.nan
    max_abs: float = math.nan             # max |g_hand - g_autodiff|
    tol: float = math.nan                 # the largest element tolerance, relative to max |auto|
    tol_fd: float = math.nan              # tolerance of the finite-difference leg
    bias_score: float = math.nan          # worst |bias| / band of the aggregate test (at most
    #                                       1 passes; checks.aggregate), nan when not run
    verdict: Verdict | None = None
    ok: bool = False
    worst: tuple | None = None            # index of the largest difference from the trusted leg
    location: str = ""                    # the same, with the layer's axis names
    diagnosis: str = ""                   # the common bug shape that fits, when one does
    note: str = ""                        # something the user should know even when it passes
    difference: object = dataclasses.field(default=None, repr=False, compare=False)
    #                                       suspect minus trusted leg (failures), for plots
    axes: tuple = ()                      # the tensor's axis names, when the caller gave them


@dataclasses.dataclass
class Report:
    """What check_layer found: ``.ok``, ``.failing`` and a readable table from ``str()``."""
    layer: str
    dtype: str
    forward_error: float   # normwise relative error of the output against the oracle
    forward_score: float   # max_i |out_i - oracle_i| / tol_i: at most 1 passes
    forward_ok: bool
    tensors: list
    error: str = ""      # set when a leg could not be run at all
    error_in: str = ""   # which part raised or misbehaved: forward, backward or oracle
    notes: list = dataclasses.field(default_factory=list)  # checks.verdict.Note findings

    @property
    def note(self) -> str:
        return "; ".join(str(n) for n in self.notes)

    @property
    def ok(self) -> bool:
        return not self.error and self.forward_ok and all(t.ok for t in self.tensors)

    @property
    def failing(self) -> list:
        names = [self.error_in or "forward"] if self.error or not self.forward_ok else []
        return names + [t.name for t in self.tensors if not t.ok]

    def plot(self, out_dir) -> list:
        """One PNG heat map per failing tensor, hand minus trusted over its axes (checks.plots):
        the paths written."""
        from checks.plots import plot_report
        return plot_report(self, out_dir)

    def to_dict(self) -> dict:
        return {"layer": self.layer, "dtype": self.dtype, "ok": self.ok, "error": self.error,
                "error_in": self.error_in,
                "findings": [{"finding": n.finding.name, "message": str(n)} for n in self.notes],
                "forward": {"error": _num(self.forward_error),
                            "score": _num(self.forward_score), "ok": self.forward_ok},
                "tensors": [_tensor_dict(t) for t in self.tensors]}

    def __str__(self) -> str:
        return format_table([self])


def _tensor_dict(t):
    d = {f.name: _num(getattr(t, f.name)) for f in dataclasses.fields(t)
         if f.name not in ("verdict", "difference", "axes")}
    d["verdict"] = t.verdict.kind.name if t.verdict else None
    d["message"] = str(t.verdict) if t.verdict else ""
    return d


def _num(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def failure_line(layer: str, dtype: str, t: TensorResult) -> str:
    """One line saying which leg is wrong, by how much, what the bug looks like and where."""
    head = f"{layer}.{t.name} [{dtype}]  FAIL  "
    kind = t.verdict.kind if t.verdict else None
    if kind is Kind.HAND_WRONG and _by_bias(t):
        body = (f"hand vs autodiff {t.hand_vs_autodiff:.1e}, within its element tolerance "
                f"({t.score:.3g}x) but biased along autodiff's gradient {t.bias_score:.3g}x "
                f"the aggregate test's band (FD agrees with autodiff)")
    elif kind is Kind.HAND_WRONG:
        body = (f"hand vs autodiff {t.hand_vs_autodiff:.1e}, {_times(t.score)} "
                f"(FD agrees with autodiff)")
    elif kind in BLAMES_ORACLE:
        body = f"autodiff vs FD {t.autodiff_vs_fd:.1e} (FD agrees with hand): the oracle is wrong"
    elif math.isfinite(t.hand_vs_autodiff):
        body = f"hand vs autodiff {t.hand_vs_autodiff:.1e}: {t.verdict}"
    else:
        body = str(t.verdict)
    if t.diagnosis:
        body += f" — {t.diagnosis}"
    if t.location:
        body += f"; worst at {t.location}"
    return head + body


def _ratio(x: float) -> str:
    """An err/tol column entry: two decimals, or three digits and an exponent from 1000 on."""
    return f"{x:.2f}" if not x >= 1000 else f"{x:.3g}"


def _times(score: float) -> str:
    """'Nx its tolerance' of a hand gradient; an infinite ratio of finite values is an error
    where autodiff's value and its rounding are exactly 0 (the tolerance there is a few of the
    format's smallest numbers, and the ratio overflows)."""
    if math.isinf(score):
        return "beyond its tolerance where autodiff's value is exactly 0"
    return f"{score:.3g}x its tolerance"


def _by_bias(t: TensorResult) -> bool:
    """Whether the aggregate test alone is what the tensor fails by: its bias beyond the band,
    every element within its tolerance."""
    return t.bias_score > 1 and not t.score > 1


def _tensor_ratio(t: TensorResult) -> str:
    """The err/tol entry of a tensor: the worst element's ratio, or the aggregate test's
    (marked "bias") when that is what the tensor fails by."""
    return f"{_ratio(t.bias_score)} bias" if _by_bias(t) else _ratio(t.score)


def format_table(reports: Sequence[Report]) -> str:
    """One line per layer x tensor: the three legs' errors, the tolerance and the verdict;
    then one explaining line per failure and the notes."""
    head = ("layer", "dtype", "tensor", "shape", "hand-autodiff", "hand-FD", "autodiff-FD",
            "err/tol", "verdict")
    rows, details, errors = [], [], {}  # errors: (layer, part, text) -> the dtype shown first
    for r in reports:
        fwd = "ok" if r.forward_ok else "FAIL: forward disagrees with the oracle"
        if r.error:
            part = r.error_in or "forward"
            fwd = f"FAIL: {part}: " + r.error.splitlines()[0]
            first = errors.setdefault((r.layer, part, r.error), r.dtype)
            if first == r.dtype:
                details.append(f"{r.layer}.{part} [{r.dtype}]  FAIL  {r.error}")
            else:  # the same error and traceback in another dtype: said once
                details.append(f"{r.layer}.{part} [{r.dtype}]  FAIL  the same error as in "
                               f"{first} above")
        elif not r.forward_ok:
            details.append(f"{r.layer}.forward [{r.dtype}]  FAIL  forward vs oracle "
                           f"{r.forward_error:.1e}, {r.forward_score:.3g}x its tolerance: "
                           f"gradient comparisons are moot until the forward agrees")
        for n in r.notes:
            details.append(f"{r.layer} [{r.dtype}]  finding  {n}")
        part = (r.error_in or "forward") if r.error else "forward"  # the part that raised
        rows.append((r.layer, r.dtype, part, "", f"{r.forward_error:.1e}", "", "",
                     _ratio(r.forward_score), fwd))
        for t in r.tensors:
            rows.append((r.layer, r.dtype, t.name, "x".join(map(str, t.shape)) or "scalar",
                         f"{t.hand_vs_autodiff:.1e}", f"{t.hand_vs_fd:.1e}",
                         f"{t.autodiff_vs_fd:.1e}", _tensor_ratio(t),
                         "ok" if t.ok else f"FAIL: {t.verdict}"))
            if not t.ok:
                details.append(failure_line(r.layer, r.dtype, t))
            if t.note:
                details.append(f"{r.layer}.{t.name} [{r.dtype}]  note  {t.note}")
    widths = [max(len(str(row[i])) for row in rows + [head]) for i in range(len(head))]
    line = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
    table = [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
    return "\n".join(table + ([""] + details if details else []))


def reports_to_json(reports: Sequence[Report]) -> str:
    return json.dumps([r.to_dict() for r in reports], indent=2)
