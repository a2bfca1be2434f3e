"""Path attribution: which uses of which values in the oracle's own program explain a wrong
gradient.

Backpropagation sums, into every gradient, one contribution per path through the program.  The
oracle is JAX, so its program (the jaxpr) lists every use of every value: ``sin`` reads ``x``
here, ``reduce_sum`` reads ``x ** 2`` there.  Give every use k a factor s_k on the cotangent that
flows back through it,

    x_used = stop_gradient(x) + s_k (x - stop_gradient(x))     (the same value; gradient x s_k)

and the trusted gradient G(s) is affine in each s_k (a path crosses one use at most once), so

    c_k = dG / ds_k at s = 1

is the contribution of the paths through use k: G(s_k = 0) = G - c_k is the gradient with that
use stopped.  All c_k come out of one forward-mode pass over the reverse pass (``jax.jvp`` of
``jax.vjp``, vmapped over the uses).  A hand gradient H then reads as a sparse combination:

    H - G = -c_k               missing the path through use k
    H - G = -2 c_k             that path with the wrong sign
    H - G = (a - 1) c_k        that path scaled by a
    H - G = v_k - c_k          a matrix product whose gradient takes the other operand
                               untransposed (v_k: the same path with that operand's axes swapped)
                               or takes another value of the program in its place, one computed
                               earlier with the same shape (a wrong cached activation)

Besides single uses, a value read several times gets one site for all its uses (its cotangent
scaled).  Each site names the equation and the oracle's source line (``eqn.source_info``), so the
explanation reads "missing the path through `integer_pow` at reference/gelu.py:12
(`x ** 3`)".  Nothing here knows any layer: it works on any traceable oracle.
"""
from __future__ import annotations

import collections
import hashlib
import itertools
import linecache
import math
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

CALLS = {"jit", "pjit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call"}
# plumbing: moves or copies values; a path through it is better named at a neighbour
PLUMBING = {"broadcast_in_dim", "reshape", "convert_element_type", "squeeze", "expand_dims",
            "transpose", "copy", "copy_p", "select_n", "concatenate", "slice", "pad", "gather",
            "dynamic_slice", "rev"}
MAX_EQUATIONS = 600          # larger programs (a whole model) are bisected, not attributed
MAX_COLUMN_ELEMENTS = 2e7    # sites x gradient elements held at once
MAX_TERMS = 3                # a sparse explanation has at most this many paths
MAX_OTHER_OPERANDS = 8       # the latest values a matrix product's operand may be mistaken for


class Site(NamedTuple):
    """One place in the oracle's program where a path's cotangent can be scaled."""
    kind: str        # "use": one operand of one equation; "value": every use of one value;
    #                  "untransposed": a matrix product's gradient taking the other operand as is;
    #                  "other operand": taking another value of the program in its place
    primitive: str
    operand: int     # the operand position (use, variants); -1 for a value
    where: str       # "reference/layers.py:31"
    text: str        # the source line
    order: int       # position in the program (forward order)
    base: int = -1   # untransposed, other operand: the index of the use site it replaces
    arity: int = 1   # the equation's number of operands
    alt: str = ""    # other operand: the value taken instead, "`x * s` at file:line"

    def describe(self) -> str:
        """'operand 1 of `mul` at reference/rope.py:20 (`x_o * sin`)'."""
        which = f"operand {self.operand} of " if self.kind != "value" and self.arity > 1 else ""
        what = "the result of " if self.kind == "value" else ""
        at = f" at {self.where}" if self.where else ""
        src = f" (`{self.text}`)" if self.text else ""
        return f"{what}{which}`{self.primitive}`{at}{src}"


def relative(path: str) -> str:
    """A source file as a diagnosis names it: relative to the working folder, or its base name
    where it lies outside."""
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return os.path.basename(path) if rel.startswith("..") else rel


def _frame(eqn):
    """(relative path:line, source text) of the user code that made the equation: the
    expression's own span of the line (``x2 * sin``) where the frame gives its columns."""
    try:
        from jax._src import source_info_util
        frame = source_info_util.user_frame(eqn.source_info.traceback)
    except Exception:  # pragma: no cover (an internal API; naming the line is a nicety)
        frame = None
    if frame is None:
        return "", ""
    path = frame.file_name
    rel = relative(path)
    line = linecache.getline(path, frame.start_line).rstrip("\n")
    text = line.strip()
    start, end = getattr(frame, "start_column", -1), getattr(frame, "end_column", -1)
    if frame.end_line == frame.start_line and start is not None and end is not None \
            and 0 <= start < end <= len(line):  # the expression itself, where Python says
        text = line[start:end].strip() or text  # which part of the line made the equation
    return f"{rel}:{frame.start_line}", text


def _placed(eqn, calls):
    """(where, text) of an equation: its own line and expression, or, for a step inside a
    library function the oracle calls (jax.nn.silu), the line of that call: "file:line, inside
    `jax.nn.silu(h)`" with no expression of its own."""
    where, text = _frame(eqn)
    if where:
        return where, text
    for call in reversed(calls):  # the innermost call a line of the oracle makes
        at, called = _frame(call)
        if at:
            return f"{at}, inside `{called}`", ""
    return "", ""


def _is_float(x):
    return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def _scale(x, s):
    """x with its cotangent multiplied by s (the value unchanged, exactly)."""
    stopped = jax.lax.stop_gradient(x)
    return stopped + s * (x - stopped)


def _dot_variants(eqn, position):
    """Axis swaps of the other operand of a dot_general that keep the shapes: (axis, axis)."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    other = 1 - position
    shape = eqn.invars[other].aval.shape
    contract = (lc, rc)[other]
    batch = (lb, rb)[other]
    free = [a for a in range(len(shape)) if a not in contract and a not in batch]
    return [(f, c) for f in free for c in contract if shape[f] == shape[c]]


class _Walker:
    """Evaluates a jaxpr with every site's factor applied; the first run records the sites."""

    def __init__(self, factors=None, variants=None):
        self.factors, self.variants = factors, variants
        self.sites: list[Site] = []   # uses and values, index = their factor's
        self.variant_sites: list[Site] = []
        self.computed = []            # (value, where, text) of every computing equation so far
        self.count = 0
        self.vcount = 0
        self.order = 0

    def _site(self, site, value):
        k = self.count
        self.count += 1
        if self.factors is None:
            self.sites.append(site)
            return value
        return _scale(value, self.factors[k])

    def eval(self, jaxpr, consts, args, active_in, calls=()):
        """calls: the call equations this program is inside (a library function's steps are
        placed at the oracle's line that calls it, ``_placed``)."""
        env, active = {}, {}
        uses = {}
        for eqn in jaxpr.eqns:
            for v in eqn.invars:
                if not isinstance(v, jcore.Literal):
                    uses[v] = uses.get(v, 0) + 1

        def read(v):
            return v.val if isinstance(v, jcore.Literal) else env[v]

        def is_active(v):
            return not isinstance(v, jcore.Literal) and active.get(v, False)

        for var, value in zip(jaxpr.constvars, consts):
            env[var], active[var] = value, False
        for var, value, a in zip(jaxpr.invars, args, active_in):
            env[var], active[var] = value, a
        for eqn in jaxpr.eqns:
            self.order += 1
            ins = [read(v) for v in eqn.invars]
            flags = [is_active(v) for v in eqn.invars]
            name = eqn.primitive.name
            if name in CALLS:
                sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
                inner = sub.jaxpr if hasattr(sub, "consts") else sub
                outs = self.eval(inner, getattr(sub, "consts", []), ins, flags, calls + (eqn,))
                out_active = any(flags)
            else:
                where, text = _placed(eqn, calls) if self.factors is None else ("", "")
                scaled, index = list(ins), {}
                for i, (v, x, a) in enumerate(zip(eqn.invars, ins, flags)):
                    if a and _is_float(x):
                        index[i] = self.count
                        scaled[i] = self._site(Site("use", name, i, where, text, self.order,
                                                    arity=len(eqn.invars)), x)
                params = eqn.params
                out = eqn.primitive.bind(*scaled, **params)
                if name == "dot_general":
                    out = self._untransposed(eqn, scaled, index, out, params, where, text)
                    out = self._other_operand(eqn, scaled, index, out, params, where, text)
                outs = list(out) if eqn.primitive.multiple_results else [out]
                if name not in PLUMBING and not eqn.primitive.multiple_results and _is_float(out):
                    self.computed.append((out, where, text))
                out_active = any(flags)
                for j, (var, o) in enumerate(zip(eqn.outvars, outs)):
                    if out_active and uses.get(var, 0) >= 2 and _is_float(o):
                        outs[j] = self._site(Site("value", name, -1, where, text, self.order), o)
            for var, value in zip(eqn.outvars, outs):
                env[var], active[var] = value, out_active
        return [read(v) for v in jaxpr.outvars]

    def _variant(self, site, eqn, ins, position, other, out, params):
        """out plus the variant's factor times the same product with the other operand
        replaced (its value kept out of the gradient): a path that can be switched on."""
        k = self.vcount
        self.vcount += 1
        if self.variants is None:
            self.variant_sites.append(site)
            return out
        pair = [None, None]
        pair[position], pair[1 - position] = ins[position], jax.lax.stop_gradient(other)
        alt = eqn.primitive.bind(*pair, **params)
        return out + self.variants[k] * (alt - jax.lax.stop_gradient(alt))

    def _other_operand(self, eqn, ins, index, out, params, where, text):
        """A matrix product whose gradient takes another value of the program (of the same
        shape, computed earlier) as its other operand: a wrong cached activation."""
        for position in (0, 1):
            if position not in index:
                continue
            mine = ins[1 - position]
            same = [(v, w, t) for v, w, t in self.computed if v is not mine
                    and v.shape == mine.shape and v.dtype == mine.dtype][-MAX_OTHER_OPERANDS:]
            for value, w, t in same:
                site = Site("other operand", "dot_general", position, where, text, self.order,
                            base=index[position], arity=2,
                            alt=f"`{t}` at {w}" if t else "another value")
                out = self._variant(site, eqn, ins, position, value, out, params)
        return out

    def _untransposed(self, eqn, ins, index, out, params, where, text):
        for position in (0, 1):
            if position not in index:
                continue
            for f, c in _dot_variants(eqn, position):
                site = Site("untransposed", "dot_general", position, where, text, self.order,
                            base=index[position], arity=2)
                other = jnp.swapaxes(ins[1 - position], f, c)
                out = self._variant(site, eqn, ins, position, other, out, params)
        return out


class Attribution:
    """The path contributions of one oracle at one point, for one upstream gradient."""

    def __init__(self, fn, diff_values, params, dout):
        """fn(diff_values, params) -> out in jax.numpy; diff_values a list of arrays."""
        self.diff_values = [jnp.asarray(v) for v in diff_values]
        self.params = {k: jnp.asarray(v) for k, v in params.items()}
        self.dout = jnp.asarray(dout)
        args = (self.diff_values, self.params)
        closed = jax.make_jaxpr(fn)(*args)
        self.closed, self.treedef = closed, jax.tree_util.tree_structure(args)
        self.n_equations = _count(closed.jaxpr)
        walker = _Walker()
        flat = jax.tree_util.tree_leaves(args)
        active = [_is_float(x) for x in flat]
        # shapes only: recording the sites needs no arithmetic
        jax.eval_shape(lambda *f: walker.eval(closed.jaxpr, closed.consts, list(f), active), *flat)
        self.sites = walker.sites + walker.variant_sites
        self.n_uses = walker.count
        self._columns = None

    def _gradient(self, factors, variants):
        flat_active = [_is_float(x) for x in jax.tree_util.tree_leaves(
            (self.diff_values, self.params))]

        def loss(diff_values, params):
            flat = jax.tree_util.tree_leaves((diff_values, params))
            walker = _Walker(factors, variants)
            out, = walker.eval(self.closed.jaxpr, self.closed.consts, flat, flat_active)
            return jnp.sum(out * self.dout.astype(out.dtype))
        return jax.grad(loss, argnums=(0, 1))(self.diff_values, self.params)

    def columns(self):
        """(G at s = 1, columns): every gradient's contributions, (sites,) + its shape, in the
        order of ``sites``; untransposed sites hold v_k - c_base."""
        if self._columns is None:
            n_var = len(self.sites) - self.n_uses
            ones, zeros = jnp.ones(self.n_uses), jnp.zeros(n_var)

            @jax.jit
            def run(ones, zeros):
                base = self._gradient(ones, zeros)
                tangent = lambda ds, dv: jax.jvp(self._gradient, (ones, zeros), (ds, dv))[1]
                eye_s = jnp.eye(self.n_uses + n_var)[:, :self.n_uses]
                eye_v = jnp.eye(self.n_uses + n_var)[:, self.n_uses:]
                return base, jax.vmap(tangent)(eye_s, eye_v)
            base, cols = run(ones, zeros)
            grads = lambda tree: ({i: np.array(g) for i, g in enumerate(tree[0])},
                                  {k: np.array(g) for k, g in tree[1].items()})
            base, (cin, cpar) = grads(base), grads(cols)
            bases = [s.base for s in self.sites[self.n_uses:]]
            for tree in (cin, cpar):
                for key, c in tree.items():
                    if bases:  # an untransposed path replaces its use's own contribution
                        c[self.n_uses:] -= c[bases]
            self._columns = base, (cin, cpar)
        return self._columns


def _count(jaxpr):
    n = 0
    for eqn in jaxpr.eqns:
        sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
        if eqn.primitive.name in CALLS and sub is not None:
            n += _count(sub.jaxpr if hasattr(sub, "consts") else sub)
        else:
            n += 1
    return n


def _ranked(e, columns, n, g):
    """(max |G|, the n columns flattened, their norms, the nonzero ones, those ranked by their
    correlation with e), or None when there is nothing to explain or nothing to explain it."""
    scale = float(np.max(np.abs(g))) if g.size else 0.0
    if scale == 0.0 or not np.any(e):
        return None
    C = columns.reshape(n, -1)
    norms = np.linalg.norm(C, axis=1)
    ev = e.reshape(-1)
    # a column is numerically zero against the error it should explain, not against the
    # largest column: one absurd column (a derivative dividing by a cotangent that rounding
    # left at 1e-17 instead of 0) would otherwise silence every other
    live = np.flatnonzero(norms > 1e-12 * float(np.linalg.norm(ev)))
    if not live.size:
        return None
    corr = np.abs(C[live] @ ev) / (norms[live] * np.linalg.norm(ev))
    return scale, C, norms, live, live[np.argsort(-corr)]


class Explained(NamedTuple):
    terms: list      # [(Site, coefficient)]
    residual: float  # normwise residual of the fit


def fit_paths(e, columns, sites, g, fit, max_terms=MAX_TERMS) -> Explained | None:
    """The sparsest combination of site columns that explains e = H - G to ``fit`` (normwise,
    relative to max |G|), by single fits and then greedy orthogonal matching pursuit."""
    found = _ranked(e, columns, len(sites), g)
    if found is None:
        return None
    scale, C, norms, live, ranked = found
    ev = e.reshape(-1)
    good = lambda r: float(np.max(np.abs(r))) <= fit * scale
    for k in ranked[:64]:  # one path
        a = float(C[k] @ ev) / float(C[k] @ C[k])
        r = ev - a * C[k]
        if good(r):
            return Explained([(k, a)], float(np.max(np.abs(r))) / scale)
    got = greedy(C, ev, norms, live, max_terms, good)
    if got is None:
        return None
    chosen, coef, r = got
    return Explained([(k, float(a)) for k, a in zip(chosen, coef)],
                     float(np.max(np.abs(r))) / scale)


def greedy(C, ev, norms, live, max_terms, good):
    """Orthogonal matching pursuit: (the chosen rows of C, their least-squares coefficients,
    the residual) of the first set of at most max_terms rows whose residual is good(r), or
    None."""
    chosen, r = [], ev
    for _ in range(max_terms):
        scores = np.abs(C[live] @ r) / norms[live]
        scores[np.isin(live, chosen)] = -1
        chosen.append(int(live[int(np.argmax(scores))]))
        A = C[chosen].T
        coef = np.linalg.lstsq(A, ev, rcond=None)[0]
        r = ev - A @ coef
        if good(r):
            return chosen, coef, r
    return None


def fit_path_per_slice(e, columns, sites, g, fit, top=64):
    """(site, axes) where e = H - G is one path's contribution c_k times a factor f constant
    along those axes and varying along the others (e = f c_k: a wrong operand or a factor
    missing inside that path, per row or per head), or None.  The most axes that fit are
    chosen; they must hold at least 3 elements per slice (with fewer, a factor per slice
    fits anything) and f must vary (a constant f is a path scaled: ``fit_paths``)."""
    found = _ranked(e, columns, len(sites), g) if e.ndim >= 2 else None
    if found is None:
        return None
    scale, C, _, _, ranked = found
    ranked = ranked[:top]
    Ck = C[ranked].reshape((len(ranked),) + e.shape)
    for r in range(e.ndim - 1, 0, -1):
        for along in itertools.combinations(range(e.ndim), r):
            if int(np.prod([e.shape[a] for a in along])) < 3:
                continue
            axes = tuple(a + 1 for a in along)
            den = np.sum(Ck * Ck, axis=axes, keepdims=True)
            f = np.sum(Ck * e, axis=axes, keepdims=True) / np.where(den > 0, den, 1.0)
            resid = np.max(np.abs(e - f * Ck).reshape(len(ranked), -1), axis=1)
            for j in np.flatnonzero(resid <= fit * scale):
                fj = f[j][den[j] > 0]
                if fj.size and np.ptp(fj) > fit * max(float(np.max(np.abs(fj))), 1e-300):
                    return int(ranked[j]), along
    return None


def representative(k, columns, sites, fit):
    """Among the sites whose column equals site k's, the one that names the path best: a use
    before a whole value, a computing equation before plumbing, the earliest in the program."""
    C = columns.reshape(len(sites), -1)
    ref = C[k]
    scale = float(np.max(np.abs(ref)))
    same = [j for j in range(len(sites)) if sites[j].kind == sites[k].kind
            and float(np.max(np.abs(C[j] - ref))) <= fit * scale] or [k]
    return min(same, key=lambda j: (sites[j].primitive in PLUMBING, sites[j].kind != "use",
                                    sites[j].order))


def for_oracle(oracle, dout, names, cached=()):
    """name -> (columns, sites) for every checked tensor of a ``checks.legs.Oracle``, built on
    first use (None where the oracle cannot be traced or is too large to attribute).
    names: input index -> tensor name.  Its ``substitutions`` attribute is the same for
    ``checks.substitution`` (the last tier of the diagnosis), whose candidates include the
    hand forward's cached arrays ``cached`` ((name, array), or a function that returns them)."""
    from checks.substitution import for_oracle as substitutions
    paths = per_name(lambda: _build(oracle, dout), names)
    paths.substitutions = substitutions(oracle, dout, names, cached)
    return paths


def per_name(build, names):
    """name -> (the tensor's columns, the sites) of what build() returns, ((inputs' columns by
    index, params' columns by name), sites), built on first use; None where it gives None."""
    state = {}

    def columns(name):
        if "built" not in state:
            state["built"] = build()
        built = state["built"]
        if built is None:
            return None
        (cin, cpar), sites = built
        key = next((i for i, n in names.items() if n == name), name)
        column = cin.get(key) if isinstance(key, int) else cpar.get(key)
        return None if column is None else (column, sites)
    return columns


_BUILT = collections.OrderedDict()  # the last few cases' attributions, by their exact data
KEEP_BUILT = 8                      # cases at most, and MAX_COLUMN_ELEMENTS elements in all


def arrays_digest(arrays, names=()) -> str:
    """A digest of the exact bytes, dtypes and shapes of arrays (and of their names, if given)."""
    digest = hashlib.sha1()
    for name, a in itertools.zip_longest(names, arrays, fillvalue=""):
        a = np.ascontiguousarray(np.asarray(a))
        digest.update(f"{name}{a.dtype}{a.shape}".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def _case_key(oracle, dout):
    """The oracle, its static arguments and the exact bytes of every array it sees."""
    arrays = list(oracle.inputs) + [oracle.params[k] for k in sorted(oracle.params)] \
        + [oracle.arrays[k] for k in sorted(oracle.arrays)] + [dout]
    return oracle.oracle, oracle.static_items, oracle.diff_idx, tuple(sorted(oracle.params)), \
        arrays_digest(arrays)


def _build(oracle, dout):
    """The columns and sites of one case, built once: checks of several hand backwards on the
    same case (the zoo's bugs of one layer) share them."""
    return built_once(_BUILT, lambda: _case_key(oracle, dout), lambda: _build_now(oracle, dout),
                      lambda: len(_BUILT) > KEEP_BUILT
                      or sum(map(_elements, _BUILT.values())) > MAX_COLUMN_ELEMENTS)


def built_once(store, key, make, too_many):
    """make() once per key() in the ordered dict store (the oldest dropped while too_many()
    holds, the newest always kept); each time for a key that cannot be hashed."""
    try:
        k = key()
        hash(k)
    except Exception:  # an unhashable static argument: built each time
        return make()
    if k not in store:
        store[k] = make()
        while len(store) > 1 and too_many():
            store.popitem(last=False)
    store.move_to_end(k)
    return store[k]


def _elements(built):
    if built is None:
        return 0
    (cin, cpar), _ = built
    return sum(int(np.size(c)) for tree in (cin, cpar) for c in tree.values())


def oracle_program(oracle):
    """(fn(diff_values, params) -> out in jax.numpy, the diff values, the number of elements
    of every differentiated input and parameter) of a traceable ``checks.legs.Oracle``, or
    None."""
    if not oracle.traceable or oracle.static_items is None:
        return None
    static = dict(oracle.static_items)
    others, arrays, diff_idx = oracle.others, oracle.arrays, oracle.diff_idx

    def fn(diff_values, params):
        full = list(others)
        for i, value in zip(diff_idx, diff_values):
            full[i] = value
        return oracle.oracle(*full, params, **static, **arrays)
    size = sum(int(np.size(oracle.inputs[i])) for i in diff_idx) + \
        sum(int(np.size(v)) for v in oracle.params.values())
    return fn, [oracle.inputs[i] for i in diff_idx], size


def _build_now(oracle, dout):
    try:
        program = oracle_program(oracle)
        if program is None:
            return None
        fn, diff_values, size = program
        a = Attribution(fn, diff_values, oracle.params, dout)
        if a.n_equations > MAX_EQUATIONS or len(a.sites) * size > MAX_COLUMN_ELEMENTS:
            return None
        _, (cin, cpar) = a.columns()
        cin = {i: cin[n] for n, i in enumerate(oracle.diff_idx)}
        return (cin, cpar), a.sites
    except Exception:  # attribution is an explanation, never a reason for a check to fail
        return None
