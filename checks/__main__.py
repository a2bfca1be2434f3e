"""python -m checks [--json] [--dtype float64|float32] [--layer NAME ...]: the check table."""
from __future__ import annotations

import argparse
import sys

import numpy as np

from checks.engine import format_table, reports_to_json
from checks.registry import BY_NAME, ROWS, run_row


def table(args) -> int:
    rows = [BY_NAME[name] for name in args.layer] if args.layer else ROWS
    dtypes = [args.dtype] if args.dtype else ["float64", "float32"]
    reports = [run_row(row, np.dtype(dt), seed=args.seed) for row in rows for dt in dtypes]
    print(reports_to_json(reports) if args.json else format_table(reports))
    if not args.json:
        bad = [f"{r.layer}-{r.dtype}" for r in reports if not r.ok]
        print(f"\n{len(reports) - len(bad)} of {len(reports)} layer checks agree"
              + (f"; failing: {', '.join(bad)}" if bad else ""))
    return 0 if all(r.ok for r in reports) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checks",
                                     description="Hand gradients against JAX autodiff and "
                                                 "finite differences, layer by layer.")
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument("--dtype", choices=["float64", "float32"], help="one dtype only")
    parser.add_argument("--layer", action="append", choices=sorted(BY_NAME),
                        help="check only this layer (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seed of inputs and directions")
    args = parser.parse_args(argv)
    return table(args)


if __name__ == "__main__":
    sys.exit(main())
