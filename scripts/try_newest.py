"""Try the newest releases of the lab's dependencies and say what changed.

    python scripts/try_newest.py [--write-docs] [--no-tests] [--keep]    (make deps-newest)

In a scratch virtual environment it installs the lab without its version ranges and every
dependency at its newest release (upper bounds and constraints.txt lifted), lists each version
against the tested one (constraints.txt), and runs the fast suite with them.  --write-docs puts
the result into docs/dependencies.md.  Exit status: the suite's (0 when it passes), 0 with
--no-tests.
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS_PAGE = ROOT / "docs" / "dependencies.md"


def requirements() -> list[str]:
    """Every dependency named in pyproject.toml (the core and the dev extra), with its extras
    and without its version range: dask[distributed], jax, ..."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["dev"]
    return sorted({re.split(r"[<>=!~;\s]", r, maxsplit=1)[0] for r in reqs}, key=str.lower)


def requirement_names() -> list[str]:
    return sorted({r.split("[")[0] for r in requirements()}, key=str.lower)


def tested_versions() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, eq, version = line.partition("==")
        if eq and not line.startswith("#"):
            pins[_norm(name)] = version.strip()
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _run(cmd, **kw):
    print("$ " + " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kw)


def install_newest(venv: pathlib.Path) -> pathlib.Path:
    _run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)])
    _run([py, "-m", "pip", "install", "-q", "--upgrade", *requirements()])
    return py


def installed_versions(py) -> dict[str, str]:
    out = subprocess.run([py, "-m", "pip", "list", "--format", "json"], check=True,
                         capture_output=True, text=True).stdout
    return {_norm(p["name"]): p["version"] for p in json.loads(out)}


def version_table(tested: dict, newest: dict) -> tuple[str, list[str]]:
    """The direct dependencies always, any other package where its version moved."""
    lines = ["| package | tested (constraints.txt) | newest | changed |", "| --- | --- | --- | --- |"]
    changed = []
    direct = [_norm(n) for n in requirement_names()]
    others = sorted(k for k in set(tested) | set(newest) if k not in direct and k != "gradlab"
                    and k in newest and k in tested and tested[k] != newest[k])
    for name in direct + others:
        key = _norm(name)
        old, new = tested.get(key, "–"), newest.get(key, "–")
        moved = old != new
        changed += [f"{name} {old} -> {new}"] if moved else []
        lines.append(f"| {name} | {old} | {new} | {'yes' if moved else 'no'} |")
    return "\n".join(lines), changed


def run_suite(py) -> tuple[int, str]:
    proc = subprocess.run([py, "-m", "pytest", "-q", "-n", "2", "-m", "not slow",
                           "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True)
    tail = [ln for ln in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED")]
    return proc.returncode, "\n".join(failed + tail[-1:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/try_newest.py", description=__doc__.split(
        "\n\n")[1].strip())
    p.add_argument("--write-docs", action="store_true", help="write the result into "
                   "docs/dependencies.md")
    p.add_argument("--no-tests", action="store_true", help="only install and compare versions")
    p.add_argument("--keep", action="store_true", help="keep the scratch venv (its path is printed)")
    args = p.parse_args(argv)
    venv = pathlib.Path(tempfile.mkdtemp(prefix="gradlab-newest-")) / "venv"
    try:
        py = install_newest(venv)
        table, changed = version_table(tested_versions(), installed_versions(py))
        status, summary = (0, "not run (--no-tests)") if args.no_tests else run_suite(py)
    finally:
        if not args.keep:
            shutil.rmtree(venv.parent, ignore_errors=True)
        else:
            print(f"kept {venv}", file=sys.stderr)
    verdict = ("the fast suite passes with the newest releases" if status == 0 and not
               args.no_tests else "the suite was not run" if args.no_tests else
               "the fast suite FAILS with the newest releases")
    report = "\n".join([
        f"Run on {datetime.date.today().isoformat()}, Python {sys.version.split()[0]}: "
        + (f"{len(changed)} of the dependencies have a newer release than the tested one "
           f"({'; '.join(changed)})" if changed else "every dependency's newest release is the "
           "tested one") + f"; {verdict}.", "", table, "", "```", summary or "(no summary line)",
        "```"])
    print(report)
    if args.write_docs:
        sys.path.insert(0, str(ROOT))
        from checks.docs import write_section
        write_section(DOCS_PAGE, "newest", report)
        print(f"wrote the result into {DOCS_PAGE.relative_to(ROOT)}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
