"""python -m experiments NAME [--option value ...] | all [--jobs N] | docs [PATH] | list

Every run of experiments.registry is a command; the fields of its Config are its options, with
the field's documentation as help, the enumerations' choices, --x / --no-x for switches and the
default shown.  ``python -m experiments NAME --help`` lists them.  Bad options end in one line on
stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import sys
import textwrap
import time
import tokenize
import typing

from experiments import common, registry


class UsageError(ValueError):
    """A bad command line: reported in one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr instead of argparse's usage block
        raise UsageError(f"{self.prog}: {message} (see --help)")


def field_docs(cls) -> dict:
    """{field: documentation} of a dataclass and its bases: the attribute docstring under the
    field, else the comment at the end of its line."""
    docs = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        comments = {t.start[0]: t.string.lstrip("#").strip()
                    for t in tokenize.generate_tokens(io.StringIO(source).readline)
                    if t.type == tokenize.COMMENT}                 # line -> comment text
        body = ast.parse(source).body[0].body
        for i, node in enumerate(body):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            after = body[i + 1] if i + 1 < len(body) else None
            if isinstance(after, ast.Expr) and isinstance(getattr(after, "value", None), ast.Constant) \
                    and isinstance(after.value.value, str):
                docs[node.target.id] = " ".join(after.value.value.split())
                continue
            if node.end_lineno in comments:
                docs[node.target.id] = comments[node.end_lineno]
    return docs


def choices_of(config_cls, name, kind) -> tuple | None:
    """The allowed values of an enumeration: a Literal type, or Config.CHOICES[name] (a tuple
    or a function returning one, for registries that grow at run time, like the tasks)."""
    if typing.get_origin(kind) is typing.Literal:
        return typing.get_args(kind)
    table = getattr(config_cls, "CHOICES", {}) or {}
    if name in table:
        values = table[name]
        return tuple(values() if callable(values) else values)
    return None


def _converter(kind):
    """Text -> value for a field's type; named, so that argparse's message says what it expected."""
    origin = typing.get_origin(kind)
    if origin is tuple:
        inner = _converter(typing.get_args(kind)[0])

        def convert(text):
            return tuple(inner(part) for part in text.split(",") if part.strip())
        convert.__name__ = f"comma-separated {inner.__name__}s"
        return convert
    if origin is typing.Union:  # Optional[X]
        inner = _converter([a for a in typing.get_args(kind) if a is not type(None)][0])

        def convert(text):
            return None if text.lower() == "none" else inner(text)
        convert.__name__ = inner.__name__
        return convert
    if origin is typing.Literal:
        return str
    table = {int: "integer", float: "number", str: "text"}
    if kind in table:
        def convert(text, kind=kind):
            return kind(text)
        convert.__name__ = table[kind]
        return convert
    return str


def _show(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or '""'
    if value == "":
        return '""'
    return str(value)


def config_parser(name, config_cls, description="") -> Parser:
    parser = Parser(prog=f"python -m experiments {name}", description=description)
    hints = typing.get_type_hints(config_cls)
    docs = field_docs(config_cls)
    for field in dataclasses.fields(config_cls):
        kind = hints[field.name]
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        flag = "--" + field.name.replace("_", "-")
        doc = docs.get(field.name, "").replace("%", "%%")  # argparse formats help with %
        if kind is bool:
            parser.add_argument(flag, dest=field.name, default=default,
                                action=argparse.BooleanOptionalAction,
                                help=f"{doc} (default: {'on' if default else 'off'})")
            continue
        choices = choices_of(config_cls, field.name, kind)
        parser.add_argument(flag, dest=field.name, default=default, type=_converter(kind),
                            choices=choices, metavar=None if choices else field.name.upper(),
                            help=f"{doc} (default: {_show(default)})")
    return parser


def positive_int(text) -> int:
    """An integer >= 1 (argparse names the type in its message: 'invalid positive_int value')."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def all_parser() -> Parser:
    """The options of `all`: every study runs at its defaults, so only how many at once."""
    from experiments import runner
    parser = Parser(prog="python -m experiments all",
                    description="Run every study marked for all at its defaults and write "
                                "results/report.html.")
    jobs = runner.default_jobs()
    parser.add_argument("--jobs", type=positive_int, default=jobs, metavar="N",
                        help="studies run at once, each in a process of its own with one BLAS "
                             "thread; 1 runs them one after another in this process "
                             f"(default: {jobs}, the cores this machine gives the run)")
    return parser


def run_study(entry, argv):
    module = registry.load(entry)
    description = (module.__doc__ or "").strip().splitlines()[0]
    args = config_parser(entry.name, module.Config, description).parse_args(argv)
    config = module.Config(**vars(args))
    start = time.perf_counter()
    result = module.run(config)
    print(f"[{entry.name}] {result.summary}".rstrip())
    print(f"[{entry.name}] {time.perf_counter() - start:.1f} s, results in "
          f"{common.results_dir(entry.name)}")
    return result


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(__doc__.strip())
        print("\nruns: " + ", ".join(e.name + ("" if e.in_all else " (not in all)")
                                    for e in registry.ENTRIES) + ", all")
        return 0
    name, rest = argv[0], argv[1:]
    try:
        if name == "all":
            from experiments import report
            return report.run_all(registry.in_all(), jobs=all_parser().parse_args(rest).jobs)
        if name == "docs":   # the last `all`'s headline table into docs/studies.md
            from experiments import report
            print(f"wrote the headlines section of {report.update_docs(*rest[:1])}")
            return 0
        run_study(registry.get(name), rest)
        return 0
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; results written so far are intact", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
