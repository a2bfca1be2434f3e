"""Tables that commands write into the lab's documentation, between marker comments:

    <!-- begin: NAME -->
    ...written by the command...
    <!-- end: NAME -->

so the numbers in docs/ are the command's output, never typed by hand.
"""
from __future__ import annotations

import os
import pathlib
import re
import tempfile

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
README = DOCS.parent / "README.md"


def section(path, name) -> str:
    """The text between a section's markers (ValueError when the markers are missing)."""
    text = pathlib.Path(path).read_text()
    match = re.search(_pattern(name), text, re.S)
    if match is None:
        raise ValueError(f"{path}: no section '{name}' (expected <!-- begin: {name} --> ... "
                         f"<!-- end: {name} -->)")
    return match.group(2).strip("\n")


def write_section(path, name, body: str) -> None:
    """Replace a section's text; written to a temporary file, then renamed (atomic)."""
    path = pathlib.Path(path)
    section(path, name)  # the markers must exist
    text = re.sub(_pattern(name), lambda m: m.group(1) + "\n" + body.strip("\n") + "\n"
                  + m.group(3), path.read_text(), flags=re.S)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode_of(path))
    os.replace(tmp, path)


def mode_of(path) -> int:
    """The permission bits the rewritten file keeps: the file's own (the rewrite changes its text,
    not who may read it); mkstemp's 0600 would otherwise replace them."""
    return path.stat().st_mode & 0o7777


def _pattern(name):
    name = re.escape(name)
    return rf"(<!-- begin: {name} -->)\n?(.*?)(<!-- end: {name} -->)"


def write_run(path, name, command: str, body: str, layers=None) -> None:
    """Write one command's output into a generated section, as ``$ COMMAND`` then its output.

    A run over every row (``layers`` None) replaces the section.  A run over some rows (``--layer
    NAME``) is merged in, so the registry can grow one row at a time: the lines of those rows
    leave the earlier runs' tables (a row's line is one starting with its name and ``|``), an
    earlier run over exactly these rows is dropped, and this run is appended below the others.
    Each run keeps its own summary lines, which describe the rows that run checked."""
    run = [f"$ {command}", body.strip("\n")]
    if layers is None:
        runs = [run]
    else:
        layers = set(layers)
        runs = []
        for old_cmd, old_body in _runs(section(path, name)):
            if _layers_of(old_body) <= layers:
                continue                                 # every row it checked is checked anew
            kept = [ln for ln in old_body.splitlines() if _row_name(ln) not in layers]
            runs.append([old_cmd, "\n".join(kept)])
        runs.append(run)
    text = "\n\n".join("\n".join(r) for r in runs)
    write_section(path, name, "```\n" + text + "\n```")


def _runs(text: str) -> list[tuple[str, str]]:
    """The (command line, output) runs of a generated section."""
    lines = text.strip().strip("`").strip("\n").splitlines()
    runs = []
    for line in lines:
        if line.startswith("$ "):
            runs.append([line, []])
        elif runs:
            runs[-1][1].append(line)
    return [(cmd, "\n".join(body).strip("\n")) for cmd, body in runs]


def _row_name(line: str):
    match = re.match(r"^(\S+)\s+\|", line)
    return match.group(1) if match else None


def _layers_of(body: str) -> set:
    """The rows a run's output has lines for (table headers aside)."""
    names = {_row_name(ln) for ln in body.splitlines()} - {None, "layer", "case"}
    return names


def rows_in_section(path, name) -> set:
    """(row, dtype) pairs that have a line in a generated section's tables."""
    found = set()
    for line in section(path, name).splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 2 and _row_name(line):
            found.add((cells[0], cells[1]))
    return found
