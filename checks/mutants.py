"""Mutants of a backward: the source of one function with one hand-derivation mistake in it.

A module's source is parsed with ``ast``; every function whose name contains ``backward`` is a
target.  Each operator below models a mistake made when a gradient is derived by hand, and
yields one mutant per place it applies to:

    drop term        a + b -> a, b;  a - b -> a, -b;  x += y dropped
    drop factor      a * b -> a, b;  a / b -> a;  a @ b -> a, b;  x *= y dropped
    flip sign        a + b <-> a - b;  -a -> a;  a * b, a @ b -> -(...);  x += y <-> x -= y
    swap operands    a - b, a / b, a @ b reversed; a @ b written transposed so that the shapes
                     fit, b^T @ a^T (dW = dout^T @ x for x^T @ dout: the product transposed);
                     two arguments of a call swapped
    swap cached      two fields of the cache swapped (cache.q <-> cache.k, or two names of
                     ``a, b, ... = cache``)
    wrong cached     one read of a cached tensor replaced by another field of the cache of the
                     same shape (cache.q for cache.k; the shapes come from running the original)
    wrong tensor     one use of a local tensor replaced by another local of the same shape
                     that exists at that line (dv from da, a softmax of the wrong cached
                     values); the shapes come from running the original (``local_shapes``)
    transpose        .T, .transpose(...), .swapaxes(...) dropped; an operand of @ transposed;
                     two axes of a permutation exchanged (heads and batch: (1, 0, 3, 2))
    reduction axis   axis= of sum/mean/max changed; keepdims=True dropped
    sum for mean     x.sum(...) <-> x.mean(...); row_sum(x) -> its mean (off by the row's length)
    drop reduction   x.sum(...), x.mean(...), row_sum(x), column_sum(x) -> x
    shift            an integer index or slice bound +-1, an index held in a name +-1 (the
                     next block's cache: blocks[i + 1]); arange(n) + 1; tri(n, k=+-1)
    constant         a number c -> 1/c and 1;  1 / e -> e and 1;  a scale by a size divided by
                     another size of the function (1 / sqrt(P) -> 1 / sqrt(D), / x.size ->
                     / x.shape[0], / y.shape[-1] -> / y.shape[0])

Pure shape arithmetic (B * T, H * P, names assigned from ``.shape``) and the arguments of
reshapes are left alone: a mutant there raises or changes nothing.  A mutant is compiled into a
fresh namespace, a copy of the module executed from the mutated source (``load``): the kernel's
own file and module are never written to.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import itertools
import math
import pathlib
import sys
import types
from typing import Callable, Iterator

OPERATORS = ("drop term", "drop factor", "flip sign", "swap operands", "swap cached",
             "wrong cached", "wrong tensor", "transpose", "reduction axis", "sum for mean",
             "drop reduction", "shift", "constant")
REDUCTIONS = {"sum", "mean", "max"}
ROW_REDUCTIONS = {"row_sum"}           # the lab's helper sums over the last axis
COLUMN_REDUCTIONS = {"column_sum"}     # and this one over the rows: (M, N) -> (N,)
TRANSPOSES = {"transpose", "swapaxes"}
SHAPE_CALLS = {"reshape", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "range",
               "len", "reversed", "isinstance", "prefixed", "tuple"}
SHAPE_ATTRS = {"shape", "size", "ndim", "dtype", "vocab"}


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One mutation of one function of a module's source."""
    source: str          # the module's name (kernels.attention) or a file path
    function: str        # the mutated function
    index: int           # its number among the function's mutants
    operator: str        # one of OPERATORS
    line: int            # the line of the module the mutation is on
    before: str          # the source of the mutated node
    after: str           # what replaces it
    column: int = -1     # where on the line the node starts (0-based; -1: the line as a whole)

    @property
    def label(self) -> str:
        return f"{self.function}#{self.index}"

    def describe(self) -> str:
        """One line; two mutants of one name on one line differ by their column."""
        at = f"line {self.line}" + (f", column {self.column + 1}" if self.column >= 0 else "")
        return f"{self.operator}: {at}: `{self.before}` -> `{self.after}`"


# --- what is data and what is shape ------------------------------------------------------------

def _shape_names(func: ast.FunctionDef) -> set:
    """Names the function assigns from shapes only (H, B, T, P = q.shape; D = H * P)."""
    names: set = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and _is_shape(node.value, names):
            for target in node.targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names.add(leaf.id)
    return names


def _is_shape(node, names) -> bool:
    """An expression made of constants, shapes, sizes and shape names only."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr in SHAPE_ATTRS
    if isinstance(node, ast.Subscript):
        return _is_shape(node.value, names)
    if isinstance(node, ast.BinOp):
        return _is_shape(node.left, names) and _is_shape(node.right, names)
    if isinstance(node, ast.UnaryOp):
        return _is_shape(node.operand, names)
    if isinstance(node, ast.Tuple):
        return all(_is_shape(e, names) for e in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "sqrt":
        return all(_is_shape(a, names) for a in node.args)
    return False


def _call_name(node) -> str:
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return ""


def _frozen(func: ast.FunctionDef) -> set:
    """ids of the nodes no operator touches: docstrings, decorators, default values, the
    arguments of shape calls, axis= keywords and subscript slices (their own operators handle
    those two), and everything inside them."""
    frozen = set()

    def freeze(node):
        frozen.update(id(n) for n in ast.walk(node))
    for deco in func.decorator_list:
        freeze(deco)
    freeze(func.args)
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        freeze(body[0])
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and _call_name(node) in SHAPE_CALLS | TRANSPOSES:
            for a in node.args:
                freeze(a)
            for k in node.keywords:
                freeze(k.value)
        if isinstance(node, ast.keyword) and node.arg in ("axis", "keepdims", "dtype", "minlength"):
            freeze(node.value)
        if isinstance(node, ast.Subscript):
            freeze(node.slice)
        if isinstance(node, ast.Attribute) and node.attr in SHAPE_ATTRS:
            freeze(node.value)  # q.shape: any tensor of q's shape has it
    return frozen


# --- the operators -----------------------------------------------------------------------------
# Each takes (node, ctx) and yields (operator, new node); a new node of None deletes a statement.

def _neg(node):
    return ast.UnaryOp(op=ast.USub(), operand=node)


def _binop(left, op, right):
    return ast.BinOp(left=left, op=op, right=right)


def _method(obj, name, *args, **kw):
    return ast.Call(func=ast.Attribute(value=obj, attr=name, ctx=ast.Load()),
                    args=[ast.Constant(a) if not isinstance(a, ast.AST) else a for a in args],
                    keywords=[ast.keyword(arg=k, value=ast.Constant(v)) for k, v in kw.items()])


def _ops_binop(node, ctx):
    if not isinstance(node, ast.BinOp):
        return
    if isinstance(node.op, ast.Div) and isinstance(node.left, ast.Constant) \
            and node.left.value == 1:  # 1 / e, a scale even when e is a size (1 / sqrt(P))
        yield "constant", node.right
        yield "constant", ast.Constant(1)
        for other in _other_sizes(node.right, ctx):
            yield "constant", _binop(node.left, ast.Div(), other)
        return
    if _is_shape(node, ctx.shape_names):
        return
    l, r, op = node.left, node.right, node.op
    if isinstance(op, ast.Add):
        yield "drop term", l
        yield "drop term", r
        yield "flip sign", _binop(l, ast.Sub(), r)
    elif isinstance(op, ast.Sub):
        yield "drop term", l
        yield "drop term", _neg(r)
        yield "flip sign", _binop(l, ast.Add(), r)
        yield "swap operands", _binop(r, ast.Sub(), l)
    elif isinstance(op, ast.Mult):
        yield "drop factor", l
        yield "drop factor", r
        yield "flip sign", _neg(node)
    elif isinstance(op, ast.Div):
        yield "drop factor", l
        yield "swap operands", _binop(r, ast.Div(), l)
        if _is_shape(r, ctx.shape_names):  # a mean over the wrong count
            for other in _other_sizes(r, ctx):
                yield "constant", _binop(l, ast.Div(), other)
    elif isinstance(op, ast.MatMult):
        yield "drop factor", l
        yield "drop factor", r
        yield "flip sign", _neg(node)
        yield "swap operands", _binop(r, ast.MatMult(), l)
        yield "swap operands", _binop(_transpose_of(r), ast.MatMult(), _transpose_of(l))
        for side in ("left", "right"):
            operand = getattr(node, side)
            if not _is_transposed(operand):
                new = copy.copy(node)
                setattr(new, side, _method(operand, "swapaxes", -1, -2))
                yield "transpose", new


def _transpose_of(node):
    """node with its last two axes swapped, written as a person would: x.T -> x, else
    x.swapaxes(-1, -2)."""
    if isinstance(node, ast.Attribute) and node.attr == "T":
        return node.value
    return _method(node, "swapaxes", -1, -2)


def _other_sizes(expr, ctx):
    """expr (a size: P, sqrt(P), x.size, y.shape[-1]) with one of its sizes replaced by another
    size of the function: each shape name by every other one, x.size by x.shape[0] and
    x.shape[-1], y.shape[i] by the first and the last two axes' sizes."""
    spots = [n for n in ast.walk(expr) if (isinstance(n, ast.Name) and n.id in ctx.shape_names)
             or (isinstance(n, ast.Attribute) and n.attr == "size")
             or (isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute)
                 and n.value.attr == "shape" and _int_of(n.slice) is not None)]
    for spot in spots:
        if isinstance(spot, ast.Name):
            subs = [ast.Name(id=m, ctx=ast.Load()) for m in sorted(ctx.sizes) if m != spot.id]
        else:
            obj = spot.value if isinstance(spot, ast.Attribute) else spot.value.value
            now = None if isinstance(spot, ast.Attribute) else _int_of(spot.slice)
            subs = [ast.Subscript(value=ast.Attribute(value=obj, attr="shape", ctx=ast.Load()),
                                  slice=ast.Constant(i) if i >= 0 else _neg(ast.Constant(-i)),
                                  ctx=ast.Load()) for i in (0, -2, -1) if i != now]
        for sub in subs:
            yield _replaced(expr, spot, sub)


def _replaced(tree, old, new):
    """A copy of tree with the node old replaced by new."""
    if tree is old:
        return new
    tree = copy.copy(tree)
    for field, value in ast.iter_fields(tree):
        if isinstance(value, list):
            setattr(tree, field, [_replaced(v, old, new) if isinstance(v, ast.AST) else v
                                  for v in value])
        elif isinstance(value, ast.AST):
            setattr(tree, field, _replaced(value, old, new))
    return tree


def _is_transposed(node):
    return (isinstance(node, ast.Attribute) and node.attr == "T") or _call_name(node) in TRANSPOSES


def _ops_attribute(node, ctx):
    if isinstance(node, ast.Attribute) and node.attr == "T":
        yield "transpose", node.value


def _ops_augassign(node, ctx):
    if not isinstance(node, ast.AugAssign):
        return
    if isinstance(node.op, (ast.Add, ast.Sub)):
        yield "drop term", None
        other = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
        yield "flip sign", ast.AugAssign(target=node.target, op=other, value=node.value)
    elif isinstance(node.op, (ast.Mult, ast.Div)):
        yield "drop factor", None


def _ops_unary(node, ctx):
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
            and not _is_shape(node, ctx.shape_names):
        yield "flip sign", node.operand


def _ops_call(node, ctx):
    if not isinstance(node, ast.Call):
        return
    name = _call_name(node)
    method = isinstance(node.func, ast.Attribute)
    if name in TRANSPOSES and method:
        yield "transpose", node.func.value
        perm = [_int_of(a) for a in node.args]
        if name == "transpose" and len(perm) >= 3 and None not in perm:
            for i, j in itertools.combinations(range(len(perm)), 2):  # two axes exchanged
                new_perm = list(perm)
                new_perm[i], new_perm[j] = perm[j], perm[i]
                if new_perm != sorted(perm):  # (no permutation at all: dropped, above)
                    yield "transpose", _method(node.func.value, "transpose", *new_perm)
    if name in REDUCTIONS and method:
        yield "drop reduction", node.func.value
        for k in node.keywords:
            if k.arg == "axis" and _int_of(k.value) is not None:
                for axis in (0, -1, -2):
                    if axis != _int_of(k.value):
                        yield "reduction axis", _with_keyword(node, "axis", ast.Constant(axis))
            if k.arg == "keepdims":
                yield "reduction axis", _with_keyword(node, "keepdims", None)
    if name in ("sum", "mean") and method:
        new = copy.copy(node)
        new.func = ast.Attribute(value=node.func.value, attr="mean" if name == "sum" else "sum",
                                 ctx=ast.Load())
        yield "sum for mean", new
    if name in COLUMN_REDUCTIONS and len(node.args) == 1:  # a bias gradient left unsummed
        yield "drop reduction", node.args[0]
        yield "sum for mean", _method(node.args[0], "mean", axis=0)
    if name in ROW_REDUCTIONS and len(node.args) == 1:
        yield "drop reduction", node.args[0]
        yield "sum for mean", _method(node.args[0], "mean", axis=-1, keepdims=True)
    if name == "arange":
        yield "shift", _binop(node, ast.Add(), ast.Constant(1))
    if name in ("tri", "tril", "triu"):
        for k in (1, -1):
            yield "shift", _with_keyword(node, "k", ast.Constant(k))
    if name not in SHAPE_CALLS | TRANSPOSES | REDUCTIONS and len(node.args) >= 2:
        data = [i for i, a in enumerate(node.args)
                if isinstance(a, (ast.Name, ast.Attribute)) and not _is_shape(a, ctx.shape_names)]
        for i, j in zip(data, data[1:]):  # neighbours: the arguments a slip exchanges
            new = copy.copy(node)
            new.args = list(node.args)
            new.args[i], new.args[j] = node.args[j], node.args[i]
            yield "swap operands", new


def _with_keyword(call, arg, value):
    new = copy.copy(call)
    new.keywords = [k for k in call.keywords if k.arg != arg]
    if value is not None:
        new.keywords.append(ast.keyword(arg=arg, value=value))
    return new


def _int_of(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_of(node.operand)
        return None if inner is None else -inner
    return None


def _ops_subscript(node, ctx):
    """An integer index or a slice bound moved by one (a mask or window off by one)."""
    if not isinstance(node, ast.Subscript) or _is_shape(node, ctx.shape_names):
        return
    parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    for i, part in enumerate(parts):
        if isinstance(part, ast.Slice):
            for field in ("lower", "upper"):
                bound = getattr(part, field)
                if bound is None or isinstance(bound, ast.Constant):
                    continue  # open ends and None axes stay
                for d in (1, -1):
                    new_part = copy.copy(part)
                    setattr(new_part, field, _binop(bound, ast.Add() if d > 0 else ast.Sub(),
                                                    ast.Constant(1)))
                    yield "shift", _subscript_with(node, parts, i, new_part)
        elif _int_of(part) is not None:
            v = _int_of(part)
            for w in (v + 1, v - 1):
                yield "shift", _subscript_with(node, parts, i, ast.Constant(w) if w >= 0 else
                                               _neg(ast.Constant(-w)))
        elif isinstance(part, ast.Name) and part.id not in ctx.shape_names:
            for op in (ast.Add(), ast.Sub()):  # blocks[i]: the neighbouring block's
                yield "shift", _subscript_with(node, parts, i, _binop(part, op, ast.Constant(1)))


def _subscript_with(node, parts, i, new_part):
    parts = list(parts)
    parts[i] = new_part
    new = copy.copy(node)
    new.slice = ast.Tuple(elts=parts, ctx=ast.Load()) if len(parts) > 1 else parts[0]
    return new


def _ops_constant(node, ctx):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool) and node.value not in (0, 1, -1):
        yield "constant", ast.Constant(1 / node.value)
        yield "constant", ast.Constant(1)


def _ops_cached(node, ctx):
    """Two cached tensors swapped: a pair of fields read from the cache, or of names unpacked
    from it."""
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) \
            and node.value.id == ctx.cache and isinstance(node.targets[0], ast.Tuple):
        elts = node.targets[0].elts
        for i, j in itertools.combinations(range(len(elts)), 2):
            new = copy.deepcopy(node)
            new.targets[0].elts[i], new.targets[0].elts[j] = \
                new.targets[0].elts[j], new.targets[0].elts[i]
            yield "swap cached", new


SITE_OPERATORS = (_ops_binop, _ops_attribute, _ops_augassign, _ops_unary, _ops_call, _ops_subscript,
                  _ops_constant, _ops_cached)


class _Context:
    def __init__(self, func):
        self.shape_names = _shape_names(func)
        # the sizes a scale may be taken by mistake: names bound to one number from shapes
        self.sizes = {n for n in self.shape_names if n.isupper() and len(n) == 1}
        args = [a.arg for a in func.args.args]
        self.cache = args[1] if len(args) > 1 else "cache"


# --- enumeration and application ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Site:
    node_index: int        # the node's position in ast.walk(function)
    variant: int           # which of that node's mutations
    operator: str


def _function(tree, name) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ValueError(f"function: no top-level function {name!r} in the module")


def _fields_swaps(func, ctx):
    """Pairs of cache fields read as cache.NAME in the function: (field, field)."""
    fields = sorted({n.attr for n in ast.walk(func) if isinstance(n, ast.Attribute)
                     and isinstance(n.value, ast.Name) and n.value.id == ctx.cache})
    return list(itertools.combinations(fields, 2))


def _wrong_tensors(func, shapes) -> list:
    """(node index, other name): each use of a local tensor, and every other local of the same
    shape (in some row's case) already assigned above that line (or a parameter)."""
    if not shapes:
        return []
    frozen, ctx = _frozen(func), _Context(func)
    first = {a.arg: 0 for a in func.args.args}
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            first[node.id] = min(first.get(node.id, node.lineno), node.lineno)
    out = []
    for i, node in enumerate(ast.walk(func)):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load) \
                or id(node) in frozen or node.id in ctx.shape_names or node.id not in shapes:
            continue
        for other in sorted(k for k in shapes if "." not in k):  # locals, not cache fields
            if other != node.id and shapes[other] & shapes[node.id] \
                    and first.get(other, math.inf) < node.lineno:
                out.append((i, other))
    return out


def _wrong_cached(func, shapes) -> list:
    """(node index, other field): each read cache.a of a cached tensor, and every other field
    of the cache with the same shape (in some row's case; recorded as 'cache.NAME')."""
    ctx = _Context(func)
    fields = {k.split(".", 1)[1]: v for k, v in shapes.items() if k.startswith(ctx.cache + ".")}
    out = []
    for i, node in enumerate(ast.walk(func)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) \
                and isinstance(node.value, ast.Name) and node.value.id == ctx.cache \
                and node.attr in fields:
            out += [(i, other) for other in sorted(fields)
                    if other != node.attr and fields[other] & fields[node.attr]]
    return out


def _sites(func) -> list:
    ctx = _Context(func)
    frozen = _frozen(func)
    sites = []
    for i, node in enumerate(ast.walk(func)):
        if id(node) in frozen or node is func:
            continue
        variant = 0
        for op in SITE_OPERATORS:
            for operator, _ in op(node, ctx):
                sites.append(_Site(i, variant, operator))
                variant += 1
    return sites, _fields_swaps(func, ctx)


def _replacement(node, variant, ctx):
    k = 0
    for op in SITE_OPERATORS:
        for _, new in op(node, ctx):
            if k == variant:
                return new
            k += 1
    raise IndexError(variant)


def _parents(func):
    return {id(child): parent for parent in ast.walk(func) for child in ast.iter_child_nodes(parent)}


def _replace_child(parent, old, new):
    for field, value in ast.iter_fields(parent):
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is old:
                    value[i] = new if new is not None else ast.Pass()
                    return
        elif value is old:
            setattr(parent, field, new)
            return
    raise LookupError("node not found under its parent")


class _SwapFields(ast.NodeTransformer):
    def __init__(self, cache, a, b):
        self.cache, self.swap = cache, {a: b, b: a}

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == self.cache \
                and node.attr in self.swap:
            return ast.Attribute(value=node.value, attr=self.swap[node.attr], ctx=node.ctx)
        return node


class Source:
    """A module's source, its backward functions, and their mutants."""

    def __init__(self, name: str, text: str, filename: str):
        self.name, self.text, self.filename = name, text, filename
        self.tree = ast.parse(text, filename=filename)
        self.shapes = {}  # function -> {local name: shapes it takes}, for 'wrong tensor'

    @classmethod
    def of_module(cls, module) -> "Source":
        path = pathlib.Path(module.__file__)
        return cls(module.__name__, path.read_text(), str(path))

    @classmethod
    def of_file(cls, path) -> "Source":
        path = pathlib.Path(path)
        return cls(str(path), path.read_text(), str(path))

    def backwards(self) -> list:
        """The names of the module's top-level functions with 'backward' in their name."""
        return [n.name for n in self.tree.body
                if isinstance(n, ast.FunctionDef) and "backward" in n.name]

    def local_shapes(self, function, shapes):
        """Give the shapes of the function's locals ({name: set of shapes}, from running it on
        the rows' cases) and of its cache's fields ('cache.NAME'): the 'wrong tensor' operator
        replaces a local by another of the same shape, 'wrong cached' a field by another."""
        self.shapes[function] = {k: frozenset(v) for k, v in shapes.items()}

    def mutants(self, function: str) -> list:
        """Every mutant of one function, numbered in source order."""
        return [m for m, _ in self._mutated(function)]

    def _mutated(self, function) -> Iterator:
        func = _function(self.tree, function)
        sites, swaps = _sites(func)
        index = 0
        for site in sites:
            tree = copy.deepcopy(self.tree)
            f = _function(tree, function)
            node = list(ast.walk(f))[site.node_index]
            new = _replacement(node, site.variant, _Context(f))
            _replace_child(_parents(f)[id(node)], node, new)
            after = "(deleted)" if new is None else ast.unparse(new)
            yield Mutant(self.name, function, index, site.operator, node.lineno,
                         ast.unparse(node), after, node.col_offset), tree
            index += 1
        for a, b in swaps:
            tree = copy.deepcopy(self.tree)
            f = _function(tree, function)
            cache = _Context(f).cache
            lines = sorted({n.lineno for n in ast.walk(f) if isinstance(n, ast.Attribute)
                            and isinstance(n.value, ast.Name) and n.value.id == cache
                            and n.attr in (a, b)})
            _SwapFields(cache, a, b).visit(f)
            yield Mutant(self.name, function, index, "swap cached", lines[0],
                         f"{cache}.{a}, {cache}.{b}", f"{cache}.{b}, {cache}.{a}"), tree
            index += 1
        for node_index, other in _wrong_cached(func, self.shapes.get(function, {})):
            tree = copy.deepcopy(self.tree)
            f = _function(tree, function)
            node = list(ast.walk(f))[node_index]
            before = ast.unparse(node)
            node.attr = other
            yield Mutant(self.name, function, index, "wrong cached", node.lineno, before,
                         ast.unparse(node), node.col_offset), tree
            index += 1
        for node_index, other in _wrong_tensors(func, self.shapes.get(function, {})):
            tree = copy.deepcopy(self.tree)
            f = _function(tree, function)
            node = list(ast.walk(f))[node_index]
            before = node.id
            node.id = other
            yield Mutant(self.name, function, index, "wrong tensor", node.lineno, before,
                         other, node.col_offset), tree
            index += 1

    def tree_of(self, mutant: Mutant) -> ast.Module:
        for m, tree in self._mutated(mutant.function):
            if m.index == mutant.index:
                return tree
        raise LookupError(mutant.label)

    def load(self, mutant: Mutant | None = None) -> dict:
        """A fresh namespace holding the module executed from its source, with the mutant's
        function mutated (the original without one)."""
        tree = self.tree if mutant is None else ast.fix_missing_locations(self.tree_of(mutant))
        module = types.ModuleType(_mutant_module_name(self.name))
        module.__file__ = self.filename
        # listed while it runs: a dataclass being defined looks its module up there
        sys.modules[module.__name__] = module
        try:
            exec(compile(tree, f"<mutant of {self.filename}>", "exec"), module.__dict__)
        finally:
            del sys.modules[module.__name__]
        return module.__dict__

    def diff(self, mutant: Mutant) -> str:
        """The mutant's function, as a unified diff against the original."""
        before = ast.unparse(_function(self.tree, mutant.function)).splitlines()
        after = ast.unparse(_function(self.tree_of(mutant), mutant.function)).splitlines()
        return "\n".join(difflib.unified_diff(before, after, "original", mutant.label,
                                              lineterm="", n=1))


def _mutant_module_name(name):
    """A module name of its own for the namespace (a dotted kernels module keeps its package,
    so relative imports would resolve; the lab's kernels use absolute imports)."""
    return name.replace("/", ".").removesuffix(".py") + "__mutant"


def generate(source: Source, functions=None, operators=None) -> list:
    """The mutants of every backward of a source (or of the given functions), optionally only of
    some operators."""
    out = []
    for function in functions or source.backwards():
        out += [m for m in source.mutants(function)
                if operators is None or m.operator in operators]
    return out


def backward_of(namespace: dict, function: Callable) -> Callable:
    """The function of the same name in a mutant's namespace."""
    return namespace[getattr(function, "__name__")]
