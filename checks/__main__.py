"""python -m checks [table options] | calibrate | sensitivity | zoo | steps LAYER.

    python -m checks [--json] [--dtype float64|float32|float16|bfloat16] [--layer NAME ...] [--fd SCHEME]
                     [--sizes T=1,B=3] [--plot DIR]
    python -m checks calibrate [--seeds 200] [--workers 2 | --scheduler tcp://HOST:8786] [--layer NAME ...]
    python -m checks sensitivity [--layer NAME ...] [--dtype float32] [--large] [--workers 2]
    python -m checks zoo
    python -m checks steps LAYER [--out results/steps]
    python -m checks docs [--layer NAME]   # rewrite the example output in README.md and docs/
    python -m checks mutate [--kernel NAME ...] [--dtype float64 ...] [--limit N] [--module PATH]
    python -m checks grade [--layer NAME ...] [--dtype float32 ...] [--json] [--write-docs]

A usage error (an unknown layer, a bad option) is one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from checks.calibrate import EDGE_SEEDS, ILL_SEEDS, LARGE_SEEDS
from checks.legs import FD_SCHEMES
from checks.registry import BY_NAME, DEFAULT_SIZES, ROWS, run_row
from checks.report import format_table, reports_to_json
from kernels.precision import FORMATS

DEFAULT_FORMATS = ("float64", "float32")  # the formats checked when none is given

COMMANDS = ("calibrate", "sensitivity", "zoo", "steps", "docs", "mutate", "grade")


class UsageError(Exception):
    """A bad command line: reported in one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _layer(name):
    if name not in BY_NAME:
        raise argparse.ArgumentTypeError(f"unknown layer {name!r}; known: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _count(text):
    return 0 if text.strip() == "0" else _positive(text)


def _all_size_names() -> dict:
    """Every size name a row declares: DEFAULT_SIZES and the rows' own, in that order."""
    names = dict.fromkeys(DEFAULT_SIZES)
    for row in ROWS:
        names.update(dict.fromkeys(row.sizes))
    return names


def _sizes(text):
    """'T=1,B=3' -> {'T': 1, 'B': 3}: size names some row declares, positive integers."""
    sizes, known = {}, _all_size_names()
    for item in text.split(","):
        name, eq, value = item.strip().partition("=")
        if not eq or not name:
            raise argparse.ArgumentTypeError(f"expected NAME=INTEGER pairs separated by commas "
                                             f"(T=1,B=3), got {item.strip()!r}")
        if name not in known:
            raise argparse.ArgumentTypeError(f"unknown size {name!r}; the sizes are "
                                             f"{', '.join(known)}")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: expected an integer, got {value!r}")
        if sizes[name] < 1:
            raise argparse.ArgumentTypeError(f"{name}: expected a positive integer, got {value!r}")
    return sizes


def _shapes(row, sizes):
    inputs, params, _ = row.case(np.random.default_rng(0), np.float64, sizes)
    return [np.shape(x) for x in inputs] + [np.shape(v) for v in params.values()]


def _uses(row, name, sizes) -> bool:
    """Whether the row's case reads size `name`: its tensors' shapes change with it."""
    if name in row.fixed or name not in row.size_names():
        return False
    default = row.size_names()[name]
    if sizes[name] == default:
        return True            # nothing to tell apart; the value is honoured either way
    return _shapes(row, sizes) != _shapes(row, {**sizes, name: default})


def _used_names(row) -> list[str]:
    """The size names the row's case reads (each doubled from its default changes a shape, or
    is refused), for the message that lists what a row takes."""
    used = []
    for name, default in row.size_names().items():
        try:
            if name not in row.fixed and _uses(row, name, {name: 2 * default}):
                used.append(name)
        except (ValueError, TypeError, ZeroDivisionError):
            used.append(name)
    return used


def _check_sizes(sizes, rows, explicit=True):
    """Every size given is honoured or rejected in one line: a size that no selected row uses,
    one a chosen row sets itself (the model's D, H, F, V) or below a row's minimum; then each
    row's case is drawn and its forward run once, so a size the kernel rejects (D not divisible
    by H, an odd D for the positional code) is a usage error with the kernel's own message.
    When every row is checked (no --layer), the rows a size applies to are named on stderr."""
    ignored = {}
    for row in rows:
        s = {**row.size_names(), **sizes}
        for name, least in row.min_sizes.items():
            if s[name] < least:
                raise UsageError(f"--sizes: {row.name} needs {name} >= {least}, got "
                                 f"{name} = {s[name]}")
        try:
            used = {name: _uses(row, name, sizes) for name in sizes}
            inputs, params, static = row.case(np.random.default_rng(0), np.float64, sizes)
            row.forward(*inputs, params, **static)
        except (ValueError, TypeError, ZeroDivisionError) as exc:
            raise UsageError(f"--sizes: {row.name} rejects {sizes}: "
                             + str(exc).splitlines()[0])
        for name in sizes:
            if not used[name]:
                why = (f"sets {name} itself ({name} = {row.fixed[name]})" if name in row.fixed
                       else f"does not use {name}")
                ignored.setdefault(name, []).append(row.name)
                if explicit:
                    raise UsageError(f"--sizes: {row.name} {why}; it takes "
                                     + ", ".join(_used_names(row)))
    for name, names in ignored.items():
        if len(names) == len(rows):
            raise UsageError(f"--sizes: no row uses {name}")
        print(f"note: --sizes {name}={sizes[name]} applies to "
              f"{', '.join(r.name for r in rows if r.name not in names)}; the other rows do not "
              f"use it or set it themselves", file=sys.stderr)


def table(args) -> int:
    rows = args.layer or ROWS
    if args.sizes:
        _check_sizes(args.sizes, rows, explicit=bool(args.layer))
    dtypes = args.dtype or list(DEFAULT_FORMATS)
    if args.fd == "complex" and any(not row.analytic for row in rows):
        if args.layer:
            bad = ", ".join(row.name for row in rows if not row.analytic)
            raise UsageError(f"--fd complex: the complex step needs analytic layers; {bad} "
                             f"is not (it has a kink or compares its data)")
        rows = [row for row in rows if row.analytic]
        print("note: the complex step applies to analytic layers only; the others are skipped",
              file=sys.stderr)
    reports = [run_row(row, np.dtype(dt), seed=args.seed, fd=args.fd, sizes=args.sizes)
               for row in rows for dt in dtypes]
    print(reports_to_json(reports) if args.json else format_table(reports))
    if args.plot:
        paths = [path for r in reports for path in r.plot(args.plot)]
        print(f"\nwrote {len(paths)} heat map(s) of the failing tensors to {args.plot}",
              file=sys.stderr)
    if not args.json:
        bad = [f"{r.layer}-{r.dtype}" for r in reports if not r.ok]
        print(f"\n{len(reports) - len(bad)} of {len(reports)} layer checks agree"
              + (f"; failing: {', '.join(bad)}" if bad else ""))
    return 0 if all(r.ok for r in reports) else 1


def _cluster_options(p):
    p.add_argument("--workers", type=_count, default=0,
                   help="worker processes of a local Dask cluster (0: in this process)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="an existing Dask cluster, e.g. tcp://host:8786 (docs/cluster.md)")


def _on_cluster(args, run, *a, **kw):
    """run(*a, **kw, workers=..., scheduler=...) with the cluster options of the command line;
    a cluster that cannot start is a one-line usage error."""
    from checks.parallel import ClusterError
    if args.workers and args.scheduler:
        raise UsageError("--workers, --scheduler: give one (a local cluster or an existing one)")
    try:
        return run(*a, **kw, workers=args.workers, scheduler=args.scheduler)
    except ClusterError as exc:
        raise UsageError(str(exc)) from None


def _doc_section(name, dtypes):
    """(file, section) a run writes with --write-docs: float64 and float32 in
    docs/tolerances.md, float16 and bfloat16 in docs/half-precision.md, any other set of formats
    in a section of its own (whose markers must exist)."""
    from checks.docs import DOCS
    if list(dtypes) == list(DEFAULT_FORMATS):
        return DOCS / "tolerances.md", name
    if list(dtypes) == ["float16", "bfloat16"]:
        return DOCS / "half-precision.md", name
    return DOCS / "tolerances.md", "-".join([name, *dtypes])


def _write_run(args, path, name, body):
    """A --write-docs run into its section: the whole table, or with --layer its rows merged
    into the table already there (checks.docs.write_run)."""
    from checks.docs import write_run
    layers = [row.name for row in args.layer] if args.layer else None
    write_run(path, name, "python -m checks " + args.command_line, body, layers)
    print(f"wrote the {'rows of ' + ', '.join(layers) if layers else 'tables'} into {path}")


def calibrate(args) -> int:
    if args.wild:
        from checks.calibrate_wild import main
        return main(args, _on_cluster)
    from checks.calibrate import ALL_CASES, calibrate as run, format_cases, format_margins, summary
    args.seeds = args.seeds or 200
    rows = args.layer or ROWS
    dtypes = args.dtype or list(DEFAULT_FORMATS)
    margins = _on_cluster(args, run, rows, dtypes, args.seeds, fd=args.fd,
                          shape_seed=args.shape_seed, cases=ALL_CASES,
                          large_seeds=args.large_seeds, edge_seeds=args.edge_seeds,
                          ill_seeds=args.ill_seeds)
    print(format_margins([m for m in margins if m.case == "random shapes"]))
    print()
    print(format_cases(margins))
    alarms = [m for m in margins if m.false_alarms]
    for m in alarms:
        print(f"\nfalse alarm in {m.layer} {m.dtype} ({m.case}): {m.first_alarm}")
    print("\n" + summary(margins))
    if args.write_docs:
        path, name = _doc_section("calibration", dtypes)
        _write_run(args, path, name, "\n".join([
            format_margins([m for m in margins if m.case == "random shapes"]), "",
            format_cases(margins), "", summary(margins)]))
    return 1 if alarms else 0


def sensitivity(args) -> int:
    from checks.sensitivity import format_sensitivity, sensitivity as run, summary
    rows = args.layer or ROWS
    dtypes = args.dtype or list(DEFAULT_FORMATS)
    results = _on_cluster(args, run, rows, dtypes, large=args.large, seed=args.seed)
    print(format_sensitivity(results))
    print("\n" + summary(results))
    if args.write_docs:
        path, name = _doc_section("sensitivity", dtypes)
        _write_run(args, path, name, format_sensitivity(results) + "\n\n" + summary(results))
    return 0 if all(s.met is not False or s.known_gap for s in results) else 1


def zoo(args) -> int:
    from checks.zoo import format_zoo, run_zoo, sections
    missed = 0
    for title, bugs in sections():
        results = run_zoo(bugs=bugs)
        print(format_zoo(results, title) + "\n")
        missed += sum(not r.caught for r in results)
    return 0 if not missed else 1


def steps(args) -> int:
    from checks.steps import draw
    path = draw(args.layer_name, out_dir=args.out, seed=args.seed)
    print(f"wrote {path}")
    return 0


# the generated tables a row has an entry in: (formats, calibration options); `docs --layer`
# writes the row's entries into all of them, merged into the tables already there
DOC_TABLE_RUNS = ((("float64", "float32"), ("--seeds", "200")),
                  (("float16", "bfloat16"), ("--seeds", "50")))


def docs(args) -> int:
    """The example output in README.md and docs/; with --layer, the rows' entries in every
    generated table (calibration and sensitivity in the four formats) instead."""
    if not args.layer:
        from checks.examples import write_all
        write_all()
        return 0
    layers = [a for row in args.layer for a in ("--layer", row.name)]
    status = 0
    for formats, options in DOC_TABLE_RUNS:
        dtypes = [a for f in formats for a in ("--dtype", f)]
        for argv in (["calibrate", *layers, *dtypes, *options, "--large-seeds", "0"],
                     ["sensitivity", *layers, *dtypes]):
            print(f"$ python -m checks {' '.join(argv)} --write-docs", flush=True)
            status = max(status, main([*argv, "--write-docs"]))
    return status


def parser_for(command):
    if command == "docs":
        p = Parser(prog="python -m checks docs",
                   description="recompute the example output shown in README.md and docs/ and "
                               "write it there (make docs); with --layer, write those rows' "
                               "entries into every generated table (calibration, sensitivity)")
        p.add_argument("--layer", action="append", type=_layer,
                       help="a new or changed row whose generated entries to write (repeatable)")
        return p, docs
    if command == "calibrate":
        p = Parser(prog="python -m checks calibrate",
                   description="every layer x dtype over many seeds and random shapes: the worst "
                               "error as a fraction of its tolerance")
        p.add_argument("--seeds", type=_positive, default=None,
                       help="seeds per layer x dtype (default 200; with --wild, 9)")
        _cluster_options(p)
        p.add_argument("--wild", action="store_true",
                       help="user-style cases instead of the registry (checks.calibrate_wild)")
        p.add_argument("--layer", action="append", type=_layer, help="only this layer")
        p.add_argument("--dtype", choices=FORMATS, action="append",
                       help="a format to check (repeatable; default: float64 and float32)")
        p.add_argument("--fd", choices=FD_SCHEMES, default="central", help="FD scheme")
        p.add_argument("--shape-seed", type=int, default=0,
                       help="seed of the random shapes (8 drawn per run, the default one included)")
        p.add_argument("--large-seeds", type=_count, default=LARGE_SEEDS,
                       help="seeds at the bench's large size (a minute each; 0 skips that case)")
        p.add_argument("--edge-seeds", type=_count, default=EDGE_SEEDS,
                       help=f"seeds per row x dtype x edge shape (default {EDGE_SEEDS})")
        p.add_argument("--ill-seeds", type=_count, default=ILL_SEEDS,
                       help=f"seeds per row x dtype x ill-conditioned case (default {ILL_SEEDS})")
        p.add_argument("--write-docs", action="store_true",
                       help="write the tables into docs/tolerances.md")
        return p, calibrate
    if command == "sensitivity":
        p = Parser(prog="python -m checks sensitivity",
                   description="relative errors injected into correct hand gradients (a whole "
                               "tensor, one slice, one element): the smallest caught per layer, "
                               "dtype and pattern, against the goals")
        p.add_argument("--layer", action="append", type=_layer, help="only this layer")
        p.add_argument("--dtype", choices=FORMATS, action="append",
                       help="a format to check (repeatable; default: float64 and float32)")
        p.add_argument("--large", action="store_true",
                       help="also at the bench's large size (B 32, T 64, D 256, H 8, F 1024)")
        p.add_argument("--seed", type=int, default=0, help="seed of inputs and directions")
        _cluster_options(p)
        p.add_argument("--write-docs", action="store_true",
                       help="write the table into docs/tolerances.md")
        return p, sensitivity
    if command == "zoo":
        return Parser(prog="python -m checks zoo",
                      description="the bug zoo: classic backprop bugs, caught and diagnosed"), zoo
    if command in ("mutate", "grade"):  # each module builds its own parser and command
        import importlib
        return importlib.import_module(f"checks.{command}").cli(Parser)
    if command == "steps":
        p = Parser(prog="python -m checks steps",
                   description="finite-difference error against step size for one layer")
        p.add_argument("layer_name", metavar="LAYER", choices=sorted(BY_NAME),
                       help="a registry row: " + ", ".join(BY_NAME))
        p.add_argument("--out", default="results/steps", help="folder for the PNG")
        p.add_argument("--seed", type=int, default=0)
        return p, steps
    p = Parser(prog="python -m checks", description="Hand gradients against JAX autodiff and "
               "finite differences, layer by layer.  Subcommands: " + ", ".join(COMMANDS))
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.add_argument("--dtype", choices=FORMATS, action="append",
                       help="a format to check (repeatable; default: float64 and float32)")
    p.add_argument("--layer", action="append", type=_layer,
                   help="check only this layer (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed of inputs and directions")
    p.add_argument("--fd", choices=FD_SCHEMES, default="central",
                   help="finite differences: central (default), richardson, complex, none "
                        "(hand against autodiff only)")
    p.add_argument("--sizes", type=_sizes, default=None,
                   help="other sizes for the rows, e.g. T=1,B=3 (names: "
                        + ", ".join(_all_size_names()) + "; a row may declare its own)")
    p.add_argument("--plot", metavar="DIR",
                   help="write a heat map (PNG) of hand minus trusted for each failing tensor")
    return p, table


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    parser, run = parser_for(command)
    try:
        args = parser.parse_args(argv[1:] if command else argv)
        args.command_line = " ".join(argv)
        return run(args)
    except UsageError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the output's reader stopped early (| head): no traceback
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
