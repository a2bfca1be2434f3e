"""A second arrangement of the oracle's maths: its max reductions held constant.

A stable softmax written ``e = exp(x - max(x)); e / sum(e)`` has the derivative of softmax
whatever the shift: the path through ``max`` carries no gradient in exact arithmetic.  Autodiff
follows it all the same, and in floating point it is not nothing: at a peaked row's largest
element the oracle's VJP subtracts the whole row's sum of gradients there, which turns that
element's cancellation (y_k (dy_k - <dy, y>) with y_k near 1) into the sum of the row's small
terms.  That arrangement is far more accurate at that element (a 40-digit computation put
autodiff's error there at about 3 u and the textbook ``y (dy - <dy, y>)`` at about 160 u), and
the rounding model, which perturbs the oracle's own program, sizes the tolerance to it: a
correct kernel written the textbook way then fails.  ``jax.nn.softmax`` holds the max constant
(``stop_gradient``), and a kernel that follows it passes.

Both arrangements are correct ways to compute the same gradient, and a kernel may follow
either.  Where a check fails, an oracle whose program takes a max (or min) reduction is run
again with every such reduction held constant (``constant_shifts``); where its gradient agrees
with the oracle's within the two programs' tolerances at every element of a tensor (the same
maths: a max that carries real gradient, max pooling, makes the two differ far beyond them),
the tensor's elements are judged against either arrangement: the allowance at each element is
what judging against the other one adds, tol_v + |g_v - g| - tol where positive
(``LayerCheck._arrangement``).  A check that passes never builds it.
"""
from __future__ import annotations

import jax
from jax import lax
from jax.extend import core as jcore

SHIFTS = {"reduce_max", "reduce_min"}  # reductions a stable formula subtracts as a shift
CALLS = {"jit", "pjit", "closed_call", "core_call"}  # inlined: a shift inside a helper counts


def _sub_jaxpr(eqn):
    sub = eqn.params.get("jaxpr")
    if isinstance(sub, jcore.ClosedJaxpr):
        return sub.jaxpr, sub.consts
    if isinstance(sub, jcore.Jaxpr):
        return sub, ()
    return None


def _carried(jaxpr, carried_in) -> list:
    """Per output of a program, whether it depends on a max or min reduction's result by a
    path autodiff follows (not through ``stop_gradient``); carried_in: the same per input."""
    carried = {v for v, c in zip(jaxpr.invars, carried_in) if c}
    for eqn in jaxpr.eqns:
        ins = [not isinstance(v, jcore.Literal) and v in carried for v in eqn.invars]
        name = eqn.primitive.name
        sub = _sub_jaxpr(eqn) if name in CALLS else None
        if name == "stop_gradient":
            outs = [False] * len(eqn.outvars)
        elif name in SHIFTS:
            outs = [True] * len(eqn.outvars)
        elif sub is not None:
            outs = _carried(sub[0], ins)
        else:  # any other operation (a custom rule's call too) carries what it reads
            outs = [any(ins)] * len(eqn.outvars)
        carried.update(v for v, c in zip(eqn.outvars, outs) if c)
    return [not isinstance(v, jcore.Literal) and v in carried for v in jaxpr.outvars]


def has_shifts(jaxpr) -> bool:
    """Whether a program's output depends on a max or min reduction by a path autodiff
    differentiates: at its top level or inside the calls ``constant_shifts`` inlines (a
    custom rule's own program is its rule's business; ``jax.nn.softmax`` holds its max
    constant with ``stop_gradient``)."""
    return any(_carried(jaxpr, [False] * len(jaxpr.invars)))


def _evaluate(jaxpr, consts, args):
    """The program run as written, with every max or min reduction's result held constant."""
    env = {}

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for v, value in zip(jaxpr.constvars, consts):
        env[v] = value
    for v, value in zip(jaxpr.invars, args):
        env[v] = value
    for eqn in jaxpr.eqns:
        values = [read(v) for v in eqn.invars]
        sub = _sub_jaxpr(eqn) if eqn.primitive.name in CALLS else None
        if sub is not None:
            outs = _evaluate(sub[0], sub[1], values)
        else:
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(eqn.params))
            if not eqn.primitive.multiple_results:
                outs = [outs]
            if eqn.primitive.name in SHIFTS:
                outs = [lax.stop_gradient(o) for o in outs]
        for v, value in zip(eqn.outvars, outs):
            if not isinstance(v, jcore.DropVar):
                env[v] = value
    return [read(v) for v in jaxpr.outvars]


def constant_shifts(oracle):
    """oracle with its max and min reductions held constant: the same forward, and the
    derivative a stable formula with ``stop_gradient`` on its shift has."""
    def arranged(*args, **static):
        closed, shape = jax.make_jaxpr(lambda *a: oracle(*a, **static), return_shape=True)(*args)
        outs = _evaluate(closed.jaxpr, closed.consts, jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), outs)
    arranged.__name__ = f"{getattr(oracle, '__name__', 'oracle')}_constant_shifts"
    arranged.__qualname__ = arranged.__name__
    return arranged
