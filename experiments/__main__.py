"""python -m experiments NAME [--option value ...] | all | list

Every module of this package that defines NAME, Config and run() is a study; its Config's
fields become command-line options.  Bad options end in one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import pkgutil
import sys
import time
import typing

import experiments

NOT_STUDIES = {"common", "__main__"}


def studies() -> dict:
    found = {}
    for info in pkgutil.iter_modules(experiments.__path__):
        if info.name in NOT_STUDIES or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"experiments.{info.name}")
        if all(hasattr(module, a) for a in ("NAME", "Config", "run")):
            found[module.NAME] = module
    return dict(sorted(found.items(), key=lambda kv: getattr(kv[1], "ORDER", 50)))


def _parse_value(kind, text):
    origin = typing.get_origin(kind)
    if kind is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected true or false, got {text!r}")
    if origin is tuple:
        inner = typing.get_args(kind)[0]
        return tuple(_parse_value(inner, part) for part in text.split(",") if part)
    if kind in (int, float, str):
        return kind(text)
    if origin is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return None if text.lower() == "none" else _parse_value(args[0], text)
    return text


def config_parser(module) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m experiments {module.NAME}",
                                     description=(module.__doc__ or "").strip().splitlines()[0])
    hints = typing.get_type_hints(module.Config)
    for field in dataclasses.fields(module.Config):
        kind = hints[field.name]
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        parser.add_argument("--" + field.name.replace("_", "-"), dest=field.name, default=default,
                            type=lambda text, kind=kind: _parse_value(kind, text),
                            help=f"default: {default}")
    return parser


def run_study(module, argv) -> object:
    args = config_parser(module).parse_args(argv)
    config = module.Config(**vars(args))
    start = time.perf_counter()
    result = module.run(config)
    print(f"[{module.NAME}] {getattr(result, 'summary', '')}".rstrip())
    print(f"[{module.NAME}] {time.perf_counter() - start:.1f} s, results in "
          f"{experiments.common.results_dir(module.NAME)}")
    return result


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    found = studies()
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(__doc__.strip())
        print("\nstudies: " + ", ".join(found) + ", all")
        return 0
    name, rest = argv[0], argv[1:]
    try:
        if name == "all":
            import experiments.report as report
            return report.run_all(found, rest)
        if name not in found:
            raise ValueError(f"unknown study {name!r}; choose from {', '.join(found)}, all")
        run_study(found[name], rest)
        return 0
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; results written so far are intact", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
