"""Substitutions: a hand gradient that took one tensor in place of another, named from the
oracle's own program.

A hand-derived backward is a chain of vector-Jacobian products, each reading tensors: the
upstream gradient of the step (a cotangent) and the forward values its local derivative needs.
Reading the wrong one of two tensors of the same shape (``dheads`` for ``v``, ``da`` for
``dlogits``, ``cache.k`` for ``cache.q``) is the commonest slip of a hand derivation, and its
error has an exact form.  The oracle is JAX, so its program lists every value y with its
cotangent dy for the check's dout; for an equation y = f(x_0, x_1, ...) and one operand x_p,

    cotangent substituted   the path through x_p receives X instead of dy:
                            error = J_p^T (X - dy), J_p the Jacobian of the inputs' path into
                            x_p (everything upstream of the step stays right)
    value substituted       the gradient arriving at y (all its uses) is X instead of dy
    operand substituted     the derivative of a two-operand step (``mul``, ``div``,
                            ``dot_general`` ...) into x_p reads X as the other operand:
                            error = J_p^T (d f(x_p, X) - d f(x_p, x_other)); X = 1: a factor
                            of a product left out
    step skipped            the upstream gradient of y passed to x_p unchanged (same shape up
                            to an order of axes): its local derivative left out

with X any other value, constant or cotangent of the program, an input, an input's gradient,
dout, 1, or a field of the hand forward's own cache (``cached``: a kernel that writes the
derivative in another form than the oracle keeps values the oracle never forms, the normalised
x of a layer norm), with the shape required, its axes in any order (the case's other tensors of that
shape are the candidates).  Each such error is the inputs' gradient when one slot of the
program (y, y_p with the other operands held, or f(x_p, X) - f(x_p, x_other)) receives an extra
cotangent (X - dy, or dy), so all of them come out of one vjp of the slots, vmapped.  A hand error H - G
that equals one such column (or the sum of up to four: two constants swapped in two products
each) with coefficient 1 is named by the two source expressions; a hand gradient that is one
of those tensors whole (``equal_to``) is named as that tensor.  Nothing here knows any layer.
"""
from __future__ import annotations

import collections
import itertools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from checks.attribution import (CALLS, MAX_EQUATIONS, PLUMBING, _case_key, _is_float, _placed,
                                arrays_digest,
                                _ranked,
                                built_once, greedy, oracle_program, per_name)
from kernels.backend import to_numpy

PRODUCTS = {"mul", "div", "dot_general", "pow", "max", "min", "atan2"}  # two operands,
#                                 each in the derivative into the other
MAX_PERMUTATIONS = 3         # axis orders tried per tensor besides its own
MAX_CANDIDATES = 64          # per site: the latest values and cotangents of the right shape
MAX_COLUMN_ELEMENTS = 2e7    # columns x gradient elements
MAX_COTANGENT_WORK = 2e8     # substitutions x their cotangents' elements: the backward passes
#                              ``columns`` runs, seconds at most on two cores
CHUNK_ELEMENTS = 2 ** 22     # cotangent elements held at once (32 MiB in float64)
MAX_TERMS = 4                # substitutions combined at most (two constants swapped in two
#                              products each: four)
CACHED_SAME = 1e-12          # a cached field within this of a program value (relative to its
#                              largest element) is that value: float64 rounding, not a tensor
PAIRS, TRIPLES = 48, 20      # the columns most correlated with the error tried in pairs, triples


class Record(NamedTuple):
    """One computing equation of the oracle's program at the check's point."""
    eqn: object
    order: int
    where: str
    text: str
    v: np.ndarray          # its result
    c: np.ndarray          # the result's cotangent for the check's dout
    ins: list              # its operands
    flags: list            # which operands carry a gradient


# a step of the oracle's program that no line of the oracle's own source holds or calls (a step
# inside a library function is placed at the line that calls it: ``_placed``)
UNPLACED = " (inside a function the oracle calls: no line of its own)"


class Tensor(NamedTuple):
    """A value of the oracle's program or its cotangent: a candidate for a substitution."""
    kind: str       # "value", "cotangent", "input", "input gradient", "dout", "one" or
    #                 "cached" (a field of the hand forward's cache)
    primitive: str
    where: str
    text: str
    order: int
    perm: tuple = ()  # its axes reordered to fit the shape (the oracle's layout is its own)

    def describe(self) -> str:
        return self._what() + (f" (its axes in the order {self.perm})"
                               if self.perm and list(self.perm) != sorted(self.perm) else "")

    def _what(self) -> str:
        at = f" at {self.where}" if self.where else ""
        src = f"`{self.text}`" if self.text else \
            f"the result of a `{self.primitive}`" + ("" if self.where else UNPLACED)
        if self.kind == "one":
            return "1 (a factor left out)"
        if self.kind == "dout":
            return "the upstream gradient dout of the layer"
        if self.kind == "cached":
            return f"the hand's cached `{self.text}` (a field of its forward's cache)"
        if self.kind == "input":
            return f"the input {self.text}"
        if self.kind == "input gradient":
            return f"the gradient of the input {self.text}"
        if self.kind == "value":
            return f"the forward value {src}{at}" if self.text else \
                f"the forward value of a `{self.primitive}`{at or UNPLACED}"
        if self.kind == "constant":
            return f"the constant that {src}{at} reads"
        return f"the gradient of {src}{at} (its cotangent)"


class Sub(NamedTuple):
    """One substitution: at an equation's use (or value), what is taken instead."""
    kind: str        # "cotangent", "value", "operand" or "skipped"
    primitive: str
    operand: int
    arity: int
    where: str
    text: str
    order: int
    alt: Tensor
    reads: str = ""  # the source of the operand the path goes into, where it is known

    def describe(self) -> str:
        at = f" at {self.where}" if self.where else UNPLACED
        src = f" (`{self.text}`)" if self.text else ""
        reads = f" (`{self.reads}`)" if self.reads and self.reads != self.text else ""
        which = f"operand {self.operand}{reads} of " if self.arity > 1 else ""
        step = f"{which}`{self.primitive}`{at}{src}"
        if self.kind == "skipped":
            perm = self.alt.perm
            moved = f" (its axes in the order {perm})" if list(perm) != sorted(perm) else ""
            return (f"the gradient skips the step {step}: the upstream gradient of that step "
                    f"is passed to operand {self.operand} unchanged{moved}, its local "
                    f"derivative (a factor of the product) left out")
        if self.kind == "value":
            return (f"the gradient arriving at the result of `{self.primitive}`{at}{src} is "
                    f"replaced by {self.alt.describe()}")
        if self.kind == "cotangent":
            return (f"the gradient through {step} reads {self.alt.describe()} in place of "
                    f"the upstream gradient of that step")
        return (f"the gradient through {step} reads {self.alt.describe()} in place of the "
                f"other operand")


def _interpret(jaxpr, consts, args, active_in, hook, order=None, calls=()):
    """Evaluate a jaxpr; hook(eqn, ins, flags, outs, order) -> outs for each primitive
    equation (calls are entered).  order: [count, {order: the call equations it is inside}]."""
    order = order if order is not None else [0, {}]
    env, active = {}, {}

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    for var, value in zip(jaxpr.constvars, consts):
        env[var], active[var] = value, False
    for var, value, a in zip(jaxpr.invars, args, active_in):
        env[var], active[var] = value, a
    for eqn in jaxpr.eqns:
        order[0] += 1
        ins = [read(v) for v in eqn.invars]
        flags = [not isinstance(v, jcore.Literal) and active.get(v, False) for v in eqn.invars]
        if eqn.primitive.name in CALLS:
            sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            inner = sub.jaxpr if hasattr(sub, "consts") else sub
            outs = _interpret(inner, getattr(sub, "consts", []), ins, flags, hook, order,
                              calls + (eqn,))
        else:
            out = eqn.primitive.bind(*ins, **eqn.params)
            outs = list(out) if eqn.primitive.multiple_results else [out]
            if calls:
                order[1][order[0]] = calls
            outs = hook(eqn, ins, flags, outs, order[0])
        for var, value in zip(eqn.outvars, outs):
            env[var], active[var] = value, any(flags)
    return [read(v) for v in jaxpr.outvars]


def _near(a, b) -> bool:
    """A hand's cached field that is a program value up to the hand's float64 rounding is that
    value (named by its source expression, as where it is equal)."""
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return bool(np.all(np.abs(a - b) <= CACHED_SAME * scale))


def _fits(have, want, most=MAX_PERMUTATIONS):
    """Permutations perm (identity first) with have[perm] == want, at most ``most``."""
    if tuple(have) == tuple(want):
        yield tuple(range(len(have)))
    found = 0
    for perm in itertools.permutations(range(len(have))):
        if found >= most:
            return
        if list(perm) != sorted(perm) and tuple(have[i] for i in perm) == tuple(want):
            found += 1
            yield perm


class Substitutions:
    """The substitution columns of one oracle at one point, for one upstream gradient."""

    def __init__(self, fn, diff_values, params, dout, labels=(), cached=()):
        """labels: the names of the diff values, in order (x, z ...).  cached: (name, array)
        of the hand forward's cache, candidates beside the program's own tensors."""
        self.cached = [(name, np.asarray(a, np.float64)) for name, a in cached]
        self.labels = list(labels) + [f"input {i}" for i in range(len(labels),
                                                                   len(diff_values))]
        self.args = ([jnp.asarray(v) for v in diff_values],
                     {k: jnp.asarray(v) for k, v in params.items()})
        self.dout = jnp.asarray(dout)
        self.closed = jax.make_jaxpr(fn)(*self.args)
        self.flat = jax.tree_util.tree_leaves(self.args)
        self.active = [_is_float(x) for x in self.flat]
        self.records = self._probe()
        self.others = {}
        self.subs, self.plan = self._plan()

    # pass 1: every value of the program, its cotangent and its equation's operands
    def _probe(self):
        closed, active = self.closed, self.active
        shapes, eqns = [], []

        def shape_hook(eqn, ins, flags, outs, order):
            if any(flags) and not eqn.primitive.multiple_results and _is_float(outs[0]):
                shapes.append(jax.ShapeDtypeStruct(outs[0].shape, outs[0].dtype))
                eqns.append((eqn, order))
            return outs
        counted = [0, {}]  # the order of each equation, and the calls it is inside
        jax.eval_shape(lambda *f: _interpret(closed.jaxpr, closed.consts, list(f), active,
                                             shape_hook, counted), *self.flat)

        def loss(probes, flat):
            seen, k = [], [0]

            def hook(eqn, ins, flags, outs, order):
                if any(flags) and not eqn.primitive.multiple_results and _is_float(outs[0]):
                    seen.append((outs[0], list(ins), list(flags)))
                    outs = [outs[0] + probes[k[0]]]
                    k[0] += 1
                return outs
            out, = _interpret(closed.jaxpr, closed.consts, flat, active, hook)
            return jnp.sum(out * self.dout.astype(out.dtype)), seen
        zeros = [jnp.zeros(s.shape, s.dtype) for s in shapes]
        (cts, grads), seen = jax.grad(loss, argnums=(0, 1), has_aux=True)(zeros, self.flat)
        names = self.labels + sorted(self.args[1])  # tree_leaves: the list, then sorted keys
        self.inputs = [(n, np.asarray(x), np.asarray(g))
                       for n, x, g, a in zip(names, self.flat, grads, self.active) if a]
        records = []
        for (eqn, order), (v, ins, flags), c in zip(eqns, seen, cts):
            where, text = _placed(eqn, counted[1].get(order, ()))
            records.append(Record(eqn, order, where, text, np.asarray(v), np.asarray(c),
                                  [np.asarray(x) for x in ins], flags))
        return records

    def _source_of(self, x, before):
        """The source text of the value x of an equation's operand: the input it is, or the
        latest computing equation before `before` whose result it equals; '' if none."""
        for label, value, _ in self.inputs:
            if value.shape == x.shape and np.array_equal(value, x):
                return label
        for r in sorted(self.records, key=lambda r: -r.order):
            if r.order < before and r.v.shape == x.shape and r.text \
                    and np.array_equal(r.v, x):
                return r.text
        return ""

    def tensors(self):
        """Every tensor a hand backward can read by mistake, (Tensor, array): dout, the
        inputs and their gradients, every value of the program and its cotangent, and the
        fields of the hand forward's cache."""
        out = [(Tensor("dout", "", "", "", 0), np.asarray(self.dout))]
        for label, x, g in self.inputs:
            out += [(Tensor("input", "", "", label, 0), x),
                    (Tensor("input gradient", "", "", label, 0), g)]
        for r in self.records:
            name = r.eqn.primitive.name
            out += [(Tensor("cotangent", name, r.where, r.text, r.order), r.c),
                    (Tensor("value", name, r.where, r.text, r.order), r.v)]
            out += [(Tensor("constant", name, r.where, r.text, r.order), x)
                    for x, active in zip(r.ins, r.flags)
                    if not active and x.ndim and _is_float(x)]  # a table, a mask
        # last: a field equal to one of the program's tensors is named as that tensor
        out += [(Tensor("cached", "", "", name, 0), a) for name, a in self.cached]
        return out

    def _candidates(self, shape, near, exclude):
        """Distinct tensors of this shape (``tensors``: a backward has every cached value at
        hand, computed before or after the step), those of the program nearest the step
        `near` first, computing equations before plumbing, at most MAX_CANDIDATES, none equal
        to an excluded one.  A tensor whose axes are the shape's in another order counts too,
        permuted to fit: the oracle lays its values out in its own order (an einsum's
        (B, H, P, T) is a hand's (H, B, T, P)), so a hand's tensor is an oracle value up to a
        permutation of axes."""
        shape = tuple(shape)
        # 1: a factor of a product, or the upstream gradient of a step, left out
        found, arrays = [(Tensor("one", "", "", "", 0), np.ones(shape))], \
            [np.asarray(x) for x in exclude] + [np.ones(shape)]
        # the hand's cache last: it only adds to the program's own, within MAX_CANDIDATES
        rank = lambda t: (t[0].kind == "cached", t[0].primitive in PLUMBING,
                          abs(t[0].order - near) if t[0].order else -1)
        for tensor, array in sorted(self.tensors(), key=rank):
            if sorted(array.shape) != sorted(shape) or not np.any(array) \
                    or not np.all(np.isfinite(array)):
                continue
            same = _near if tensor.kind == "cached" else np.array_equal
            for perm in _fits(array.shape, shape):
                a = np.transpose(array, perm)
                if any(x.shape == a.shape and same(a, x) for x in arrays):
                    continue
                arrays.append(a)
                found.append((tensor._replace(perm=tuple(perm)), a))
        return found[:MAX_CANDIDATES]

    def _plan(self):
        """The substitutions, each as the cotangent D that one slot of the program receives
        in addition (a slot: a value y = f(x_0, x_1 ...) of an equation, or y_p, the same
        equation with only operand p carrying a gradient, or f(x_p, X) - f(x_p, x_other)):
        value      D = X - dy at y;
        cotangent  D = X - dy at y_p (the step's own local derivative applied to X);
        operand    D = dy at f(x_p, X) - f(x_p, x_other)."""
        subs, plan = [], collections.defaultdict(list)  # slot -> [(sub index, D)]
        for r in self.records:
            name = r.eqn.primitive.name
            if name in PLUMBING:
                continue
            arity = len(r.eqn.invars)
            found = self._candidates(r.v.shape, r.order, [r.c])
            for p, (x, active) in enumerate(zip(r.ins, r.flags)):
                if not active or not _is_float(x):
                    continue
                reads = self._source_of(x, r.order)
                for alt, X in found if arity > 1 else ():  # one operand: the value's
                    plan[(r.order, p, None)].append((len(subs), X - r.c))
                    subs.append(Sub("cotangent", name, p, arity, r.where, r.text, r.order, alt,
                                    reads))
                if sorted(x.shape) == sorted(r.v.shape) and x.size > 1:
                    for perm in _fits(r.v.shape, x.shape):  # the step skipped
                        plan[(r.order, p, "in")].append((len(subs), np.transpose(r.c, perm)))
                        plan[(r.order, p, None)].append((len(subs), -r.c))
                        subs.append(Sub("skipped", name, p, arity, r.where, r.text, r.order,
                                        Tensor("cotangent", name, r.where, r.text, r.order,
                                               tuple(perm)), reads))
                other = r.ins[1 - p] if arity == 2 else None
                if name not in PRODUCTS or other is None or not other.ndim:
                    continue
                for j, (alt, X) in enumerate(self._candidates(other.shape, r.order, [other])):
                    X = X.astype(other.dtype)
                    swapped = list(r.ins)
                    swapped[1 - p] = X
                    if not np.all(np.isfinite(r.eqn.primitive.bind(*swapped, **r.eqn.params))):
                        continue  # a zero read as a denominator: no derivative there
                    self.others[(r.order, p, j)] = X
                    plan[(r.order, p, j)].append((len(subs), r.c))
                    subs.append(Sub("operand", name, p, arity, r.where, r.text, r.order, alt,
                                    reads))
            # the gradient arriving at the whole value (after the one-operand paths: the
            # narrower statement first where both fit)
            for alt, X in found:
                plan[(r.order, -1, None)].append((len(subs), X - r.c))
                subs.append(Sub("value", name, -1, arity, r.where, r.text, r.order, alt))
        return subs, plan

    def cotangent_elements(self):
        """Elements of one substitution's cotangents (every slot): with the number of
        substitutions, the work of ``columns`` (one backward pass each)."""
        return sum(int(np.prod(np.shape(items[0][1]))) for items in self.plan.values())

    def columns(self):
        """(inputs' columns {index: (n, ...)}, params' columns {name: (n, ...)}) of every
        substitution, in the order of ``subs``: the inputs' gradients when its slot receives
        its D and nothing else does (one vjp of all slots, vmapped over the substitutions)."""
        closed, active = self.closed, self.active
        n, slots = len(self.subs), sorted(self.plan, key=lambda s: (s[0], s[1], str(s[2])))
        if not n:
            return None
        by_order = collections.defaultdict(list)
        for j, slot in enumerate(slots):
            by_order[slot[0]].append((j, slot))
        others = {k: jnp.asarray(v) for k, v in self.others.items()}

        def values(diff_values, params):
            flat = jax.tree_util.tree_leaves((diff_values, params))
            got = [None] * len(slots)

            def hook(eqn, ins, flags, outs, order):
                for j, (_, p, alt) in by_order.get(order, ()):
                    if p < 0 or alt == "in":
                        got[j] = outs[0] if p < 0 else ins[p]
                        continue
                    pinned = [x if i == p else jax.lax.stop_gradient(x)
                              for i, x in enumerate(ins)]
                    y = eqn.primitive.bind(*pinned, **eqn.params)
                    if alt is not None:
                        swapped = list(pinned)
                        swapped[1 - p] = others[(order, p, alt)]
                        y = eqn.primitive.bind(*swapped, **eqn.params) - y
                    got[j] = y
                return outs
            _interpret(closed.jaxpr, closed.consts, flat, active, hook)
            return got
        shapes = [np.shape(self.plan[slot][0][1]) for slot in slots]
        # a chunk of substitutions at a time: each one's cotangents fill every slot (zeros but
        # its own), so the chunk is sized by the slots' elements, one compiled program for all
        size = self.cotangent_elements()
        chunk = int(min(n, max(1, CHUNK_ELEMENTS // max(size, 1))))

        def run(args, stacked):
            _, back = jax.vjp(values, *args)
            return jax.vmap(back)(stacked)
        run = jax.jit(run)
        by_chunk = collections.defaultdict(list)  # chunk -> (slot, row in the chunk, cotangent)
        for j, slot in enumerate(slots):
            for k, d in self.plan[slot]:
                by_chunk[k // chunk].append((j, k % chunk, d))
        parts = []
        for c in range(-(-n // chunk)):
            stacked = [np.zeros((chunk,) + shape) for shape in shapes]  # the last one padded
            for j, row, d in by_chunk[c]:
                stacked[j][row] = d
            parts.append(jax.tree_util.tree_map(np.asarray, run(self.args, stacked)))
        cin, cpar = jax.tree_util.tree_map(lambda *c: np.concatenate(c)[:n], *parts)
        cin = dict(enumerate(cin))
        cpar = dict(cpar)
        # a substitution whose derivative is not finite there (a division by a zero of the
        # tensor read in place of a denominator) explains nothing: its column is zero
        finite = np.ones(n, bool)
        for c in [*cin.values(), *cpar.values()]:
            finite &= np.all(np.isfinite(c.reshape(n, -1)), axis=1)
        for c in [*cin.values(), *cpar.values()]:
            c[~finite] = 0.0
        return cin, cpar


class Catalogue(NamedTuple):
    """What one case's substitutions are made of."""
    subs: list       # [Sub], in the order of the columns
    tensors: list    # [(Tensor, array)]: every tensor of the program (``Substitutions.tensors``)


MAX_AXES = 5  # the axis orders of tensors up to this rank are all tried by ``equal_to``


def equal_to(g, ref, tensors, fit_tol):
    """The Tensor the hand gradient g is, whole (its axes reordered and reshaped to fit, as
    a backward merges heads), where it is no right gradient: a forward value, an input, or
    the gradient of another value returned in place of this one.  None when none is."""
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    if scale == 0.0:
        return None
    close = lambda a: float(np.max(np.abs(a - g))) <= fit_tol * scale
    for tensor, array in tensors:
        if array.size != g.size or array.ndim > MAX_AXES or close(ref):
            continue
        for perm in itertools.permutations(range(array.ndim)):
            a = np.transpose(array, perm).reshape(g.shape)
            if close(a):
                moved = tuple(perm) != tuple(range(array.ndim)) or array.shape != g.shape
                return tensor._replace(perm=()), moved
    return None


def times(g, ref, tensors, fit_tol):
    """(Tensor, extra) where the hand gradient g is the right one times a tensor of the case
    element-wise (extra True: g = ref T, a factor of a product taken once too often) or divided
    by it (extra False: g T = ref, a factor left out), T of g's shape and not constant (a
    constant is a scale, named before); None when none is."""
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    if scale == 0.0 or float(np.max(np.abs(g - ref))) <= fit_tol * scale:
        return None
    for tensor, array in tensors:
        if array.shape != g.shape or not np.all(np.isfinite(array)) \
                or np.ptp(array) <= fit_tol * float(np.max(np.abs(array))):
            continue
        if float(np.max(np.abs(g - ref * array))) <= fit_tol * scale:
            return tensor, True
        if float(np.max(np.abs(g * array - ref))) <= fit_tol * scale:
            return tensor, False
    return None


class Found(NamedTuple):
    subs: list       # [Sub]
    residual: float


def fit(e, columns, subs, g, fit_tol, max_terms=MAX_TERMS) -> Found | None:
    """The fewest substitutions (coefficient 1 each, within the fit) whose columns sum to
    e = H - G, to ``fit_tol`` normwise relative to max |G|; None when none does."""
    found = _ranked(e, columns, len(subs), g) if columns is not None else None
    if found is None:
        return None
    scale, C, norms, live, ranked = found
    ev = e.reshape(-1)
    good = lambda r: float(np.max(np.abs(r))) <= fit_tol * scale
    unit = lambda coef: all(abs(a - 1) <= max(fit_tol, 1e-6) * 10 for a in coef)
    got = None
    # a product's operand read wrong first (a cached value mistaken: the commonest slip and
    # the plainest statement), then every kind of substitution
    operands = np.array([k for k in live if subs[k].kind == "operand"], dtype=int)
    for pool in ([operands] if operands.size else []) + [live]:
        got = greedy(C, ev, norms, pool, max_terms, good)
        if got is not None and unit(got[1]):
            break
        got = None
    if got is None:
        got = _combinations(C, ev, ranked, good, unit)
    if got is None:
        return None
    chosen, _, r = got
    return Found([subs[k] for k in chosen], float(np.max(np.abs(r))) / scale)


def _combinations(C, ev, ranked, good, unit):
    """Every pair among the PAIRS and every triple among the TRIPLES columns most correlated
    with e (two cached tensors swapped read two wrong tensors in two steps; greedy pursuit
    can take a third column for the first): (chosen, coefficients, residual) or None."""
    for size, top in ((2, PAIRS), (3, TRIPLES)):
        for chosen in itertools.combinations(ranked[:top], size):
            A = C[list(chosen)].T
            coef = np.linalg.lstsq(A, ev, rcond=None)[0]
            r = ev - A @ coef
            if good(r) and unit(coef):
                return list(chosen), coef, r
    return None


def for_oracle(oracle, dout, names, cached=()):
    """name -> (columns, subs) for every checked tensor of a ``checks.legs.Oracle``, built on
    first use (None where the oracle cannot be traced or is too large).  cached: (name, array)
    of the hand forward's cache (``cached_arrays``), candidates too, or a function that returns
    them (called on first use: a check that never reaches the substitutions copies nothing)."""
    return per_name(lambda: _build(oracle, dout, names,
                                   tuple(cached() if callable(cached) else cached)), names)


def cached_arrays(cache) -> list:
    """(name, float64 array) of the floating arrays at the top of a hand forward's cache (a
    NamedTuple's fields by name, a tuple's items as cache[i], a dict's entries): what its
    backward reads besides the upstream gradient.  Nested caches are left out."""
    from checks.replay import fields
    named = hasattr(cache, "_fields")  # a field by its name; an item as cache[i]
    out = []
    for key, text, x in fields(cache):
        name = key if named else "cache" + text
        if getattr(x, "dtype", None) is None or getattr(x, "ndim", 0) == 0:
            continue
        host = np.asarray(to_numpy(x))  # CuPy: to the host
        if _is_float(host):
            out.append((name, host.astype(np.float64)))
    return out


def _cached_key(cached):
    return arrays_digest([a for _, a in cached], [name for name, _ in cached])


_BUILT = collections.OrderedDict()
KEEP_BUILT = 8


def _build(oracle, dout, names, cached=()):
    return built_once(_BUILT, lambda: (_case_key(oracle, dout), tuple(sorted(names.items())),
                                       _cached_key(cached)),
                      lambda: _build_now(oracle, dout, names, cached),
                      lambda: len(_BUILT) > KEEP_BUILT)


def _build_now(oracle, dout, names, cached=()):
    try:
        program = oracle_program(oracle)
        if program is None:
            return None
        fn, diff_values, size = program
        diff_idx = oracle.diff_idx
        s = Substitutions(fn, diff_values, oracle.params, dout,
                          [names.get(i, f"input {i}") for i in diff_idx], cached)
        if (len(s.records) > MAX_EQUATIONS or len(s.subs) * size > MAX_COLUMN_ELEMENTS
                or len(s.subs) * s.cotangent_elements() > MAX_COTANGENT_WORK):
            return None
        got = s.columns()
        if got is None:
            return None
        cin, cpar = got
        return ({i: cin[n] for n, i in enumerate(diff_idx)}, cpar), Catalogue(s.subs,
                                                                               s.tensors())
    except Exception:  # an explanation, never a reason for a check to fail
        if os.environ.get("GRADLAB_DEBUG"):
            raise
        return None
