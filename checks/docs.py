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
