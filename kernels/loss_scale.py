"""Loss scaling for half-precision training (Micikevicius et al. 2018, "Mixed precision training").

float16 keeps 5 exponent bits: its smallest normal number is 2^-14 (6.1e-5) and its smallest
subnormal 2^-24 (6.0e-8).  The gradients of a trained model are mostly small (the loss's gradient
is spread over the B (T + 1) positions of a batch, then multiplied by weights of norm about 1),
so many of them round to zero or lose their significand bits in the backward's float16 outputs.
Scaling the loss's upstream gradient by S (a power of two) shifts every gradient of the backward
up by log2 S binades, where float16 resolves them; the float32 gradients are divided by S before
the optimiser sees them.  A power of two makes both multiplications exact: the scaled backward
rounds at the same relative positions as the unscaled one, only without underflow.

Three kinds:

* ``none``: S = 1.
* ``static``: a fixed S.  Nothing is checked: a gradient that overflows at that S reaches Adam as
  an infinity and the next step's loss is non-finite (the trainer stops and points to --debug).
* ``dynamic``: start at ``init``; a step whose gradients hold an infinity or a NaN is skipped (the
  optimiser does not run) and S is halved; after ``growth_interval`` finite steps in a row S is
  doubled, up to ``max_scale``.  The scale finds the largest value that does not overflow, and
  keeps probing upwards as the gradients shrink during training.

``max_scale``: the loss's upstream gradient S enters the backward in the compute format (the
kernels run their backward in the format of the gradient they receive), so S must be finite there:
2^15 in float16, whose largest number is 65504.  bfloat16 and float32 carry 2^127.

The state is a NamedTuple and ``update`` a pure function, so a checkpoint stores the state and a
resumed run scales exactly as an uninterrupted one.
"""
from __future__ import annotations

import math
from typing import NamedTuple

from kernels.backend import array_module
from kernels.precision import finfo

KINDS = ("none", "static", "dynamic")


class LossScalePolicy(NamedTuple):
    kind: str                    # none | static | dynamic
    init: float = 2.0 ** 15      # S at the start (static: always)
    growth_interval: int = 2000  # dynamic: finite steps in a row before S doubles
    max_scale: float = 2.0 ** 127  # the largest S the compute format can carry (float16: 2^15)


class LossScaleState(NamedTuple):
    scale: float   # S: multiplies the loss's upstream gradient; the gradients are divided by it
    good: int      # finite steps in a row at this scale (dynamic)
    skipped: int   # steps skipped so far, for a non-finite gradient (dynamic)


def largest_scale(dtype) -> float:
    """The largest power of two that is finite in dtype (float16: 2^15; bfloat16: 2^127)."""
    return math.ldexp(1.0, math.frexp(float(finfo(dtype).max))[1] - 1)  # max = m 2^e, m in [.5, 1)


def check_policy(policy: LossScalePolicy) -> None:
    """ValueError naming the field (the trainer's Config fields of the same names)."""
    if policy.kind not in KINDS:
        raise ValueError(f"loss_scale: expected one of {', '.join(KINDS)}, got {policy.kind!r}")
    init = policy.init
    if isinstance(init, bool) or not isinstance(init, (int, float)) or not math.isfinite(init) \
            or init <= 0:
        raise ValueError(f"loss_scale_init: expected a positive finite number, got {init!r}")
    if policy.kind != "none" and init > policy.max_scale:
        raise ValueError(f"loss_scale_init: expected at most {policy.max_scale:g} (the largest "
                         f"power of two the compute format holds), got {init:g}")
    interval = policy.growth_interval
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(f"loss_scale_growth_interval: expected a positive integer, got "
                         f"{interval!r}")


def init_state(policy: LossScalePolicy) -> LossScaleState:
    """S = 1 without scaling, else policy.init."""
    return LossScaleState(1.0 if policy.kind == "none" else float(policy.init), 0, 0)


def update(state: LossScaleState, finite: bool, policy: LossScalePolicy):
    """After a backward at state.scale whose gradients were all finite (or not): (the state for
    the next step, whether this step's update is applied).  Only ``dynamic`` looks at finite."""
    if policy.kind != "dynamic":
        return state, True
    if not finite:  # overflow at this scale: skip the step, halve S
        return LossScaleState(state.scale / 2, 0, state.skipped + 1), False
    good = state.good + 1
    if good >= policy.growth_interval:  # a long run without overflow: try a larger S
        return LossScaleState(min(state.scale * 2, policy.max_scale), 0, state.skipped), True
    return LossScaleState(state.scale, good, state.skipped), True


def all_finite(grads: dict) -> bool:
    """Every entry of every gradient finite (no infinity, no NaN)."""
    return all(bool(array_module(g).isfinite(g).all()) for g in grads.values())


def unscale(grads: dict, scale: float, dtype) -> dict:
    """The gradients in dtype (the optimiser's: float32 master weights), divided by S.  The
    division runs in dtype, after the upcast: a float16 gradient g S / S would flush to zero
    the small values the scaling saved."""
    out = {}
    for key, g in grads.items():
        g = g.astype(dtype, copy=False)
        out[key] = g if scale == 1 else g / g.dtype.type(scale)
    return out
