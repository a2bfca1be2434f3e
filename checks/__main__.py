"""python -m checks [table options] | calibrate | sensitivity | zoo | steps LAYER.

    python -m checks [--json] [--dtype float64|float32|float16|bfloat16] [--layer NAME ...] [--fd SCHEME]
                     [--sizes T=1,B=3] [--plot DIR]
    python -m checks calibrate [--seeds 200] [--workers 2 | --scheduler tcp://HOST:8786] [--layer NAME ...]
    python -m checks sensitivity [--layer NAME ...] [--dtype float32] [--large] [--workers 2]
    python -m checks zoo
    python -m checks steps LAYER [--out results/steps]

A usage error (an unknown layer, a bad option) is one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from checks.calibrate import LARGE_SEEDS
from checks.legs import FD_SCHEMES
from checks.registry import BY_NAME, DEFAULT_SIZES, ROWS, run_row
from checks.report import format_table, reports_to_json
from kernels.precision import FORMATS

DEFAULT_FORMATS = ("float64", "float32")  # the formats checked when none is given

COMMANDS = ("calibrate", "sensitivity", "zoo", "steps")


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


def _sizes(text):
    """'T=1,B=3' -> {'T': 1, 'B': 3}: known size names, positive integers."""
    sizes = {}
    for item in text.split(","):
        name, eq, value = item.strip().partition("=")
        if not eq or not name:
            raise argparse.ArgumentTypeError(f"expected NAME=INTEGER pairs separated by commas "
                                             f"(T=1,B=3), got {item.strip()!r}")
        if name not in DEFAULT_SIZES:
            raise argparse.ArgumentTypeError(f"unknown size {name!r}; the sizes are "
                                             f"{', '.join(DEFAULT_SIZES)}")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: expected an integer, got {value!r}")
        if sizes[name] < 1:
            raise argparse.ArgumentTypeError(f"{name}: expected a positive integer, got {value!r}")
    return sizes


def _check_sizes(sizes, rows):
    """Each row's minimum sizes; then each row's case is drawn and its forward run once, so a
    size the kernel rejects (D not divisible by H, an odd D for the positional code) is a usage
    error with the kernel's own message."""
    s = {**DEFAULT_SIZES, **sizes}
    for row in rows:
        for name, least in row.min_sizes.items():
            if s[name] < least:
                raise UsageError(f"--sizes: {row.name} needs {name} >= {least}, got "
                                 f"{name} = {s[name]}")
        try:
            inputs, params, static = row.case(np.random.default_rng(0), np.float64, sizes)
            row.forward(*inputs, params, **static)
        except (ValueError, TypeError, ZeroDivisionError) as exc:
            raise UsageError(f"--sizes: {row.name} rejects {sizes}: "
                             + str(exc).splitlines()[0])


def table(args) -> int:
    rows = args.layer or ROWS
    if args.sizes:
        _check_sizes(args.sizes, rows)
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
                          large_seeds=args.large_seeds)
    print(format_margins([m for m in margins if m.case == "random shapes"]))
    print()
    print(format_cases(margins))
    alarms = [m for m in margins if m.false_alarms]
    for m in alarms:
        print(f"\nfalse alarm in {m.layer} {m.dtype} ({m.case}): {m.first_alarm}")
    print("\n" + summary(margins))
    if args.write_docs:
        from checks.docs import write_section
        command = "python -m checks " + args.command_line
        path, name = _doc_section("calibration", dtypes)
        write_section(path, name, "\n".join([
            "```", f"$ {command}", format_margins(
                [m for m in margins if m.case == "random shapes"]), "",
            format_cases(margins), "", summary(margins), "```"]))
        print(f"wrote the tables into {path}")
    return 1 if alarms else 0


def sensitivity(args) -> int:
    from checks.sensitivity import format_sensitivity, sensitivity as run, summary
    rows = args.layer or ROWS
    dtypes = args.dtype or list(DEFAULT_FORMATS)
    results = _on_cluster(args, run, rows, dtypes, large=args.large, seed=args.seed)
    print(format_sensitivity(results))
    print("\n" + summary(results))
    if args.write_docs:
        from checks.docs import write_section
        command = "python -m checks " + args.command_line
        path, name = _doc_section("sensitivity", dtypes)
        write_section(path, name, "\n".join([
            "```", f"$ {command}", format_sensitivity(results), "", summary(results),
            "```"]))
        print(f"wrote the table into {path}")
    return 0 if all(s.met is not False for s in results) else 1


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


def parser_for(command):
    if command == "calibrate":
        p = Parser(prog="python -m checks calibrate",
                   description="every layer x dtype over many seeds and random shapes: the worst "
                               "error as a fraction of its tolerance")
        p.add_argument("--seeds", type=_positive, default=None,
                       help="seeds per layer x dtype (default 200; with --wild, 17)")
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
                   help="finite differences: central (default), richardson, complex")
    p.add_argument("--sizes", type=_sizes, default=None,
                   help="other sizes for the rows, e.g. T=1,B=3 (names: "
                        + ", ".join(DEFAULT_SIZES) + ")")
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
    sys.exit(main())
