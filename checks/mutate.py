"""Mutation testing of the backward kernels: does the check catch, blame and explain every
hand-derivation mistake ``checks.mutants`` can make in them?

For each mutant of each backward (of kernels/, or of a user's module with ``--module``):

1. equivalence: the mutant's gradients against the original's in float64 on EQUIVALENCE_SEEDS
   random cases of every row whose backward lives in the mutated module.  Equal to
   EQUIVALENT_TOL (normwise; reassociating a sum of k terms moves float64 results by about
   k x 1e-16, far below it) on every row: the mutant is equivalent, the same maths written
   differently, and left out.  Raising on every row where it is not equivalent: left out too
   (a mistake the first run shows).  Both are counted.
2. the check: ``run_row`` (``check_layer`` on the row's case, at the zoo's sizes where every
   scale factor is unambiguous) with the mutant's backward, on every row where it differs, in
   each dtype asked for.  Caught: some row's report fails.  Blamed on the hand: every failing
   tensor of every row that caught it blames the hand leg (hand wrong, misshapen, missing ...).
   Explained: every failing tensor's diagnosis names a pattern (``checks.diagnosis``), which
   ``pattern_of`` names.

A survivor (live, not caught) is a mistake the check's inputs cannot see: its diff is printed.

    python -m checks mutate [--kernel NAME ...] [--operator NAME ...] [--dtype float64 ...]
                            [--limit N] [--module path/to/my_layers.py] [--workers N]
                            [--write-docs]

A user's module names its rows in ``ROWS``: ``checks.registry.Row`` objects whose forward and
backward are the module's own functions (``examples/my_layers.py``).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import itertools
import os
import pathlib
import sys

import numpy as np

from checks.mutants import OPERATORS, Mutant, Source, backward_of
from checks.verdict import Kind

EQUIVALENCE_SEEDS = (0, 1, 2)
EQUIVALENT_TOL = 1e-13
CHECK_SEED = 0
HAND_KINDS = {Kind.HAND_WRONG, Kind.NO_GRADIENT, Kind.MISSHAPEN, Kind.NOT_FLOAT,
              Kind.EXTRA_GRADIENT, Kind.NON_FINITE}
# The diagnosis' phrases (checks.diagnosis, checks.localise) and the pattern each names,
# most specific first.
WRONG_SHAPE = "the wrong shape: "
PATTERNS = (
    (WRONG_SHAPE, "wrong shape"),
    ("in each other's place: called with the two", "cache exchanged"),
    ("in each other's place: with the two exchanged in that call", "arguments exchanged"),
    ("in place of the upstream gradient", "substituted gradient"),
    ("in place of the other operand", "substituted operand"),
    ("the gradient arriving at the result of", "substituted gradient"),
    ("another tensor returned in place of", "another tensor returned"),
    ("a factor of a product taken once too often", "tensor factor"),
    ("a factor of a product left out", "tensor factor"),
    ("the gradient skips the step", "step skipped"),
    ("identically zero", "zero"),
    ("wrong sign: the gradient is -1", "sign"),
    ("scaled by a constant", "constant"),
    ("shape is the transpose", "transposed"),
    ("transposed", "transposed"),
    ("are swapped", "swapped"),
    ("repeated ids", "repeated ids"),
    ("missing a sum", "missing sum"),
    ("extra leading axis", "missing sum"),
    ("skip connection", "skip dropped"),
    ("ignores a static argument", "static ignored"),
    ("missing the path through", "path missing"),
    ("is off by a factor per", "path off per slice"),
    ("has the wrong sign", "path sign"),
    ("is scaled by", "path scaled"),
    ("other operand", "wrong operand"),
    ("untransposed", "untransposed"),
    ("upstream gradient is missing as a factor", "dout factor missing"),
    ("local derivative is missing", "derivative missing"),
    ("sign error inside the local derivative", "derivative sign"),
    ("a factor is missing or extra", "factor missing"),
    ("wrong only where", "masked"),
    ("wrong only in", "located"),
    ("exact at", "located"),
    ("triangle", "located"),
    # a composition's failure bisected (checks.bisection), when nothing above names it
    ("'s backward is wrong, the stages after it agree", "wrong stage"),
    ("the glue between", "wrong glue"),
)


def pattern_of(diagnosis: str) -> str:
    """The pattern a diagnosis names, or '' for none ('no common bug pattern fits', 'a small
    error ... that no bug shape explains', nothing)."""
    for phrase, pattern in PATTERNS:
        if phrase in diagnosis:
            return pattern
    return ""


# --- what is mutated and how it is checked ----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Target:
    """A module's source and the rows whose backward it defines."""
    source: Source
    rows: tuple

    def backwards(self):
        return self.source.backwards()


def _unwrapped_module(fn):
    return inspect.unwrap(fn).__module__


@functools.lru_cache(maxsize=None)
def lab_targets() -> tuple:
    """The kernels modules that define a registry row's backward, each with its rows."""
    from checks.registry import ROWS
    by_module = collections.defaultdict(list)
    for row in ROWS:
        by_module[_unwrapped_module(row.backward)].append(row)
    return tuple(Target(Source.of_module(sys.modules[m]), tuple(rows))
                 for m, rows in by_module.items())


@functools.lru_cache(maxsize=None)
def module_targets(path: str) -> tuple:
    """A user's module: its source and its ROWS."""
    file = pathlib.Path(path)
    if not file.is_file():
        raise ValueError(f"--module: no such file {path!r}")
    name = "user_layers_" + file.stem
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ValueError(f"--module: {path} is not a Python module (a .py file is expected)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001  (the user's module: said in one line)
        sys.modules.pop(name, None)
        raise ValueError(f"--module: {path} could not be imported: "
                         f"{type(exc).__name__}: {exc}") from None
    rows = getattr(module, "ROWS", None)
    if not rows:
        raise ValueError(f"--module: {path} defines no ROWS (a list of checks.registry.Row of "
                         f"its own forward/backward pairs)")
    return (Target(Source.of_file(file), tuple(rows)),)


def targets(module=None) -> tuple:
    return module_targets(str(module)) if module else lab_targets()


def prepare(target: Target, function: str, sizes: dict) -> None:
    """Record the shapes of the function's locals and of its cache's fields on every row's
    float64 case (seed 0), run under a profiler, for the 'wrong tensor' and 'wrong cached'
    operators (once per function)."""
    if function in target.source.shapes:
        return
    shapes = collections.defaultdict(set)
    filename = os.path.abspath(target.source.filename)

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "return" and code.co_name == function \
                and os.path.abspath(code.co_filename) == filename:
            names = frame.f_locals
            cache = names.get(code.co_varnames[1]) if code.co_argcount > 1 else None
            fields = {f"{code.co_varnames[1]}.{f}": getattr(cache, f)
                      for f in getattr(cache, "_fields", ())}  # a NamedTuple cache's fields
            for name, value in [*names.items(), *fields.items()]:
                if _is_array(value):
                    shapes[name].add(tuple(value.shape))
    for row in target.rows:
        sys.setprofile(profile)
        try:
            _gradients(row, row.backward, 0, sizes)
        except Exception as exc:  # noqa: BLE001  (the unmutated kernel: said in one line)
            raise ValueError(f"{row.name}: its forward or backward raises before any mutation "
                             f"({type(exc).__name__}: {exc}); mutants of a kernel that does "
                             f"not run say nothing") from None
        finally:
            sys.setprofile(None)
    target.source.local_shapes(function, shapes)


def originals_pass(chosen, dtypes, sizes) -> None:
    """Every row whose backward is mutated passes its own check, unmutated, in every format:
    a mutant of a backward that fails already is 'caught' whatever it changes, so its scores
    would say nothing (a ValueError naming the row and its failing tensors)."""
    functions = {(id(target), m.function): target for target, m in chosen}
    for (_, function), target in functions.items():
        for row in target.rows:
            if getattr(inspect.unwrap(row.backward), "__name__", None) != function:
                continue
            for dtype in dtypes:
                check = _row_check(row, dtype, row.backward, sizes)
                if check.caught:
                    failing = ", ".join(check.diagnoses) or "its forward"
                    raise ValueError(
                        f"{function}: the unmutated backward fails its own check (row "
                        f"{row.name}, {check.dtype}, failing: {failing}), so every mutant of "
                        f"it would count as caught; fix it first (the row's check_layer "
                        f"report says what is wrong)")


def _is_array(value) -> bool:
    return isinstance(getattr(value, "shape", None), tuple) and hasattr(value, "dtype")


# --- equivalence ----------------------------------------------------------------------------

def _flat(grads):
    dinputs, dparams = grads
    dinputs = dinputs if isinstance(dinputs, (tuple, list)) else (dinputs,)
    return [None if d is None else np.asarray(d) for d in dinputs] + \
        [(k, np.asarray(v)) for k, v in sorted(dparams.items())]


_CASES, _ORIGINALS = {}, {}  # (id of the row, seed, sizes) -> its float64 case, its gradients


def _case(row, seed, sizes_key):
    key = (id(row), seed, sizes_key)
    if key not in _CASES:
        _CASES[key] = row.case(np.random.default_rng(seed), np.float64, dict(sizes_key))
    return _CASES[key]


def _gradients(row, backward, seed, sizes):
    """The gradients of one float64 case (forward run afresh: a mutant may write into its
    cache)."""
    inputs, params, static = _case(row, seed, tuple(sorted(sizes.items())))
    out, cache = row.forward(*[np.copy(x) for x in inputs],
                             {k: np.copy(v) for k, v in params.items()}, **static)
    dout = np.random.default_rng([seed, 1]).standard_normal(np.shape(out))
    return _flat(backward(dout, cache))


def _original(row, seed, sizes_key):
    key = (id(row), seed, sizes_key)
    if key not in _ORIGINALS:
        _ORIGINALS[key] = _gradients(row, row.backward, seed, dict(sizes_key))
    return _ORIGINALS[key]


def _same(a, b) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(y, tuple):
            if not isinstance(x, tuple) or x[0] != y[0]:
                return False
            x, y = x[1], y[1]
        if x is None or y is None:
            if x is not y:
                return False
            continue
        if x.shape != y.shape or not np.all(np.isfinite(x)):
            return False
        scale = float(np.max(np.abs(y))) if y.size else 0.0
        if y.size and float(np.max(np.abs(x - y))) > EQUIVALENT_TOL * max(scale, 1e-300):
            return False
    return True


def row_effect(row, backward, sizes) -> str:
    """'same', 'differs' or 'raises': a mutant's backward on one row's float64 cases."""
    for seed in EQUIVALENCE_SEEDS:
        try:
            got = _gradients(row, backward, seed, sizes)
        except Exception:
            return "raises"
        if not _same(got, _original(row, seed, tuple(sorted(sizes.items())))):
            return "differs"
    return "same"


# --- one mutant ---------------------------------------------------------------------------------

@dataclasses.dataclass
class RowCheck:
    row: str
    dtype: str
    caught: bool
    blamed: bool           # every failing tensor blames the hand
    patterns: dict         # failing tensor -> pattern ('' none)
    diagnoses: dict        # failing tensor -> diagnosis text

    @property
    def explained(self) -> bool:
        return self.caught and bool(self.patterns) and all(self.patterns.values())


@dataclasses.dataclass
class Outcome:
    mutant: Mutant
    status: str            # 'live', 'equivalent' or 'raises'
    rows: tuple = ()       # the rows where it differs
    checks: list = dataclasses.field(default_factory=list)   # RowCheck per row x dtype

    def _of(self, dtype):
        return [c for c in self.checks if c.dtype == dtype]

    def caught(self, dtype) -> bool:
        return any(c.caught for c in self._of(dtype))

    def blamed(self, dtype) -> bool:
        got = [c for c in self._of(dtype) if c.caught]
        return bool(got) and all(c.blamed for c in got)

    def explained(self, dtype) -> bool:
        got = [c for c in self._of(dtype) if c.caught]
        return bool(got) and all(c.explained for c in got)

    def patterns(self, dtype) -> list:
        return sorted({p for c in self._of(dtype) if c.caught for p in c.patterns.values()})


def _row_check(row, dtype, backward, sizes) -> RowCheck:
    from checks.registry import run_row
    report = run_row(row, dtype, seed=CHECK_SEED, sizes=sizes, backward=backward)
    failing = [t for t in report.tensors if not t.ok]
    blamed = (not report.error or report.error_in == "backward") and \
        all(t.verdict is not None and t.verdict.kind in HAND_KINDS
            and (t.verdict.kind is not Kind.NON_FINITE or "hand" in t.verdict.detail)
            for t in failing)
    # a misshapen gradient's verdict names both shapes: that is its explanation
    diagnoses = {t.name: t.diagnosis or (WRONG_SHAPE + str(t.verdict.detail)
                                         if t.verdict and t.verdict.kind is Kind.MISSHAPEN
                                         else "") for t in failing}
    if report.error:
        diagnoses = {"(run)": report.error.splitlines()[0]}
    return RowCheck(row.name, str(np.dtype(dtype)), not report.ok, blamed,
                    {k: pattern_of(v) for k, v in diagnoses.items()}, diagnoses)


def evaluate(target: Target, mutant: Mutant, dtypes, sizes) -> Outcome:
    """Equivalence, then the check on every row where the mutant differs."""
    namespace = target.source.load(mutant)
    effects = {}
    for row in target.rows:
        try:
            backward = backward_of(namespace, row.backward)
        except KeyError:
            continue
        effects[row.name] = (row, backward, row_effect(row, backward, sizes))
    differs = [(row, bw) for row, bw, e in effects.values() if e == "differs"]
    if not differs:
        raises = any(e == "raises" for *_, e in effects.values())
        return Outcome(mutant, "raises" if raises else "equivalent")
    checks = [_row_check(row, dtype, bw, sizes) for dtype in dtypes for row, bw in differs]
    return Outcome(mutant, "live", tuple(row.name for row, _ in differs), checks)


def _task(task):
    """map_tasks' unit: (module path or None, function, index, dtypes, sizes items)."""
    module, function, index, dtypes, sizes = task
    target = next(t for t in targets(module) if function in t.backwards())
    prepare(target, function, dict(sizes))
    mutant = next(m for m in target.source.mutants(function) if m.index == index)
    return evaluate(target, mutant, dtypes, dict(sizes))


def select(module=None, kernels=None, operators=None, limit=None, sizes=None) -> list:
    """(target, mutant) pairs: every backward of the targets, or those named by ``kernels``
    (a function or a module's last name: 'linear_backward', 'attention'), of the given
    operators, at most ``limit`` per function (spread over its operators)."""
    chosen = []
    known = set()
    for target in targets(module):
        name = target.source.name  # a module (kernels.attention) or a file (my_layers.py)
        short = pathlib.Path(name).stem if name.endswith(".py") else name.rsplit(".", 1)[-1]
        for function in target.backwards():
            known |= {function, short}
            if kernels and function not in kernels and short not in kernels:
                continue
            prepare(target, function, sizes or _zoo_sizes())
            mutants = [m for m in target.source.mutants(function)
                       if not operators or m.operator in operators]
            chosen += [(target, m) for m in _spread(mutants, limit)]
    unknown = sorted(set(kernels or ()) - known)
    if unknown:
        raise ValueError(f"--kernel: no backward named {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(known))}")
    return chosen


def _zoo_sizes():
    """The zoo's sizes, where every scale factor the diagnosis names is unambiguous."""
    from checks.zoo import ZOO_SIZES
    return dict(ZOO_SIZES)


def _spread(mutants, limit):
    """At most limit mutants, taken round-robin over the operators (in source order)."""
    if limit is None or len(mutants) <= limit:
        return mutants
    by_op = collections.defaultdict(list)
    for m in mutants:
        by_op[m.operator].append(m)
    out = []
    for group in itertools.zip_longest(*by_op.values()):
        out += [m for m in group if m is not None]
    return sorted(out[:limit], key=lambda m: m.index)


def run(module=None, kernels=None, operators=None, dtypes=("float64", "float32"), limit=None,
        sizes=None, workers=0, progress=True) -> list:
    """The outcome of every selected mutant."""
    from checks.parallel import map_tasks
    sizes = dict(_zoo_sizes() if sizes is None else sizes)
    chosen = select(module, kernels, operators, limit, sizes)
    originals_pass(chosen, dtypes, sizes)
    tasks = [(str(module) if module else None, m.function, m.index, tuple(dtypes),
              tuple(sorted(sizes.items()))) for _, m in chosen]
    return map_tasks(_task, tasks, workers=workers, desc="mutants", progress=progress)


# --- scores and tables ----------------------------------------------------------------------------

@dataclasses.dataclass
class Score:
    name: str
    mutants: int = 0
    equivalent: int = 0
    raises: int = 0
    live: int = 0
    caught: dict = dataclasses.field(default_factory=dict)     # dtype -> count
    blamed: dict = dataclasses.field(default_factory=dict)
    explained: dict = dataclasses.field(default_factory=dict)

    def add(self, outcome: Outcome, dtypes):
        self.mutants += 1
        if outcome.status != "live":
            setattr(self, outcome.status, getattr(self, outcome.status) + 1)
            return
        self.live += 1
        for d in dtypes:
            for field in ("caught", "blamed", "explained"):
                counts = getattr(self, field)
                counts[d] = counts.get(d, 0) + bool(getattr(outcome, field)(d))


def scores(outcomes, key, dtypes) -> list:
    """One Score per value of key(outcome), in first-seen order, and the total last."""
    groups, total = {}, Score("all")
    for o in outcomes:
        groups.setdefault(key(o), Score(key(o))).add(o, dtypes)
        total.add(o, dtypes)
    return list(groups.values()) + [total]


def _pct(n, d):
    return f"{n}/{d} ({100 * n / d:.0f} %)" if d else "-"


def format_scores(rows, dtypes, title) -> str:
    first = dtypes[0]
    head = [title, "mutants", "equivalent", "raise", "live"] \
        + [f"caught {d}" for d in dtypes] + [f"blamed {first}", f"explained {first}"]
    body = [[s.name, str(s.mutants), str(s.equivalent), str(s.raises), str(s.live)]
            + [_pct(s.caught.get(d, 0), s.live) for d in dtypes]
            + [_pct(s.blamed.get(first, 0), s.caught.get(first, 0)),
               _pct(s.explained.get(first, 0), s.caught.get(first, 0))] for s in rows]
    return _markdown(head, body)


def _markdown(head, body) -> str:
    widths = [max(len(r[i]) for r in body + [head]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    return "\n".join([line(head), "| " + " | ".join("-" * w for w in widths) + " |"]
                     + [line(r) for r in body])


def format_patterns(outcomes, dtype) -> str:
    """How the caught mutants were explained: pattern -> count, per operator."""
    table = collections.defaultdict(collections.Counter)
    for o in outcomes:
        if o.status == "live" and o.caught(dtype):
            for p in o.patterns(dtype) or [""]:
                table[o.mutant.operator][p or "none"] += 1
    body = [[op, ", ".join(f"{p} {n}" for p, n in table[op].most_common())]
            for op in OPERATORS if op in table]
    return _markdown(["operator", f"patterns named ({dtype}, caught mutants)"], body)


def survivors(outcomes, dtypes) -> list:
    return [o for o in outcomes if o.status == "live" and not all(o.caught(d) for d in dtypes)]


def format_survivors(outcomes, dtypes, module=None) -> str:
    lines = []
    for o in survivors(outcomes, dtypes):
        target = next(t for t in targets(module) if o.mutant.function in t.backwards())
        missed = [d for d in dtypes if not o.caught(d)]
        lines += [f"survivor {o.mutant.label} ({o.mutant.describe()}), rows "
                  f"{', '.join(o.rows)}, not caught in {', '.join(missed)}:",
                  target.source.diff(o.mutant), ""]
    return "\n".join(lines) if lines else "no survivors"


def format_unexplained(outcomes, dtype, limit=20) -> str:
    lines = []
    for o in outcomes:
        if o.status == "live" and o.caught(dtype) and not o.explained(dtype):
            c = next(c for c in o.checks if c.dtype == dtype and c.caught and not c.explained)
            text = "; ".join(f"{k}: {v[:120]}" for k, v in c.diagnoses.items() if not c.patterns[k])
            lines.append(f"{o.mutant.label} {o.mutant.describe()} [{c.row}] {text}")
    more = f"\n... and {len(lines) - limit} more" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more if lines else "every caught mutant explained"


def summary(outcomes, dtypes) -> str:
    total = scores(outcomes, lambda o: "all", dtypes)[-1]
    parts = [f"{total.mutants} mutants: {total.equivalent} equivalent and {total.raises} raising "
             f"(left out), {total.live} live"]
    for d in dtypes:
        parts.append(f"{d}: caught {_pct(total.caught.get(d, 0), total.live)}, blamed on the "
                     f"hand {_pct(total.blamed.get(d, 0), total.caught.get(d, 0))}, explained "
                     f"{_pct(total.explained.get(d, 0), total.caught.get(d, 0))}")
    return "\n".join(parts)


# --- the command ------------------------------------------------------------------------------

DOCS_SECTION = "mutate"


def cli(parser_class):
    """(parser, run) of ``python -m checks mutate`` for checks/__main__.py."""
    from kernels.precision import FORMATS
    p = parser_class(prog="python -m checks mutate",
                     description="mutation testing: hand-derivation mistakes generated from each "
                                 "backward's source, each checked; scores per kernel and "
                                 "operator, and the survivors with their diff")
    p.add_argument("--kernel", action="append",
                   help="only this backward (a function, or a module: attention) (repeatable)")
    p.add_argument("--operator", action="append", choices=OPERATORS,
                   help="only this operator (repeatable)")
    p.add_argument("--dtype", action="append", choices=FORMATS,
                   help="a format to check (repeatable; default float64 then float32)")
    p.add_argument("--limit", type=int, default=None,
                   help="at most N mutants per backward (spread over its operators)")
    p.add_argument("--module", metavar="PATH",
                   help="a user's module of layers (with ROWS) instead of kernels/")
    p.add_argument("--workers", type=int, default=0,
                   help="worker processes of a local Dask cluster (0: in this process)")
    p.add_argument("--write-docs", action="store_true",
                   help="write the per-kernel and per-operator tables into docs/zoo.md")
    return p, command


def command(args) -> int:
    dtypes = tuple(args.dtype or ("float64", "float32"))
    if args.limit is not None and args.limit < 1:
        return _usage(f"--limit: expected a positive integer, got {args.limit}")
    if args.workers < 0:
        return _usage(f"--workers: expected an integer >= 0, got {args.workers}")
    try:
        outcomes = run(args.module, args.kernel, args.operator, dtypes, args.limit,
                       workers=args.workers)
    except ValueError as exc:
        return _usage(str(exc))
    by_kernel = format_scores(scores(outcomes, lambda o: o.mutant.function, dtypes), dtypes,
                              "kernel")
    by_operator = format_scores(scores(outcomes, lambda o: o.mutant.operator, dtypes), dtypes,
                                "operator")
    patterns = format_patterns(outcomes, dtypes[0])
    print("\n\n".join([by_kernel, by_operator, patterns, summary(outcomes, dtypes)]))
    print("\nunexplained (caught, no pattern named):\n" + format_unexplained(outcomes, dtypes[0]))
    print("\n" + format_survivors(outcomes, dtypes, args.module))
    if args.write_docs:
        from checks.docs import DOCS, write_section
        write_section(DOCS / "zoo.md", DOCS_SECTION, "\n".join([
            f"`$ python -m checks {args.command_line}`", "", by_operator, "", by_kernel, "",
            patterns, "", "```", summary(outcomes, dtypes), "```"]))
        print(f"wrote the tables into {DOCS / 'zoo.md'}")
    return 0 if not survivors(outcomes, dtypes) else 1


def _usage(message) -> int:
    print(f"python -m checks mutate: error: {message}", file=sys.stderr)
    return 2
