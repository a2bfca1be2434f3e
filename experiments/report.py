"""python -m experiments all: run every study at its defaults and write results/report.html.

A study takes part unless its module sets ``IN_ALL = False``.  A study that fails is reported
(its traceback's last lines on the page, a line on stderr) and the others still run; the exit
status is then 1.  The page is self-contained: the charts are embedded as base64 PNG, each with
its caption, followed by the study's headline table (measured vs published or expected).
"""
from __future__ import annotations

import base64
import html
import pathlib
import sys
import time
import traceback

from experiments import common

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f3f3f3}.yes{color:#17702b;font-weight:bold}.no{color:#b00020;font-weight:bold}
figure{margin:1.5em 0}img{max-width:100%}figcaption{font-size:.9em;color:#444;margin-top:.3em}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.8em}"""


class Outcome:
    """What one study's run left behind: its result or its error, and its run time."""

    def __init__(self, module, result=None, error=None, seconds=0.0):
        self.module, self.result, self.error, self.seconds = module, result, error, seconds

    @property
    def name(self):
        return self.module.NAME


def selected(found: dict) -> list:
    """The studies that take part in `all`, in discovery order."""
    return [module for module in found.values() if getattr(module, "IN_ALL", True)]


def run_one(module) -> Outcome:
    start = time.perf_counter()
    try:
        result = module.run(module.Config())
    except Exception:  # noqa: BLE001 - any study failure is reported, the others still run
        lines = traceback.format_exc().strip().splitlines()
        return Outcome(module, error="\n".join(lines[-12:]), seconds=time.perf_counter() - start)
    return Outcome(module, result=result, seconds=time.perf_counter() - start)


def run_all(found: dict, argv) -> int:
    if argv:
        raise ValueError(f"all: expected no options (each study runs at its defaults), got {' '.join(argv)}")
    modules = selected(found)
    outcomes, start = [], time.perf_counter()
    try:
        for i, module in enumerate(modules, 1):
            print(f"[all {i}/{len(modules)}] {module.NAME} ...", flush=True)
            outcome = run_one(module)
            outcomes.append(outcome)
            print(f"[all {i}/{len(modules)}] {status_line(outcome)}", flush=True)
            summary = str(getattr(outcome.result, "summary", "") or "")
            if summary:
                print("\n".join(f"    {line}" for line in summary.splitlines()), flush=True)
            if outcome.error:
                print(f"[all] {module.NAME} failed:\n{outcome.error}", file=sys.stderr, flush=True)
    finally:  # an interrupted run still leaves a page for what finished
        path = write_report(outcomes, time.perf_counter() - start)
        print(f"[all] {len(outcomes)} studies in {time.perf_counter() - start:.1f} s, "
              f"{sum(o.error is not None for o in outcomes)} failed; report: {path}", flush=True)
    return 1 if any(o.error for o in outcomes) else 0


def status_line(outcome) -> str:
    if outcome.error:
        return f"{outcome.name} FAILED after {outcome.seconds:.1f} s"
    heads = list(getattr(outcome.result, "headlines", []) or [])
    agree = sum(bool(field(h, "agrees")) for h in heads)
    return f"{outcome.name} done in {outcome.seconds:.1f} s ({agree}/{len(heads)} headlines agree)"


# --- the page ----------------------------------------------------------------------------------

def figures_of(outcome) -> list:
    """[(path, caption)]: what the study returned, else every PNG in its results folder."""
    figures = getattr(outcome.result, "figures", None)
    if figures:  # (path, caption) pairs, or bare paths captioned by their names
        pairs = [f if isinstance(f, (tuple, list)) else (f, pathlib.Path(f).stem.replace("_", " "))
                 for f in figures]
        return [(pathlib.Path(path), str(caption)) for path, caption in pairs]
    folder = common.RESULTS / outcome.name
    return [(path, path.stem.replace("_", " ")) for path in sorted(folder.glob("*.png"))]


def _number(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return html.escape(str(value))


def field(headline, key):
    """A headline's field, whether it is a common.Headline or a plain dict."""
    return headline.get(key, "") if isinstance(headline, dict) else getattr(headline, key, "")


def headline_table(heads) -> str:
    if not heads:
        return "<p>No headline comparison.</p>"
    rows = "".join(
        f"<tr><td>{html.escape(str(field(h, 'quantity')))}</td><td>{_number(field(h, 'measured'))}</td>"
        f"<td>{_number(field(h, 'expected'))}</td><td>{html.escape(str(field(h, 'source')))}</td>"
        f"<td class='{'yes' if field(h, 'agrees') else 'no'}'>{'yes' if field(h, 'agrees') else 'no'}</td></tr>"
        for h in heads)
    return ("<table><tr><th>quantity</th><th>measured</th><th>published / expected</th>"
            f"<th>source</th><th>agrees</th></tr>{rows}</table>")


def study_section(outcome) -> str:
    module = outcome.module
    doc = html.escape((module.__doc__ or "").strip())
    parts = [f"<h2 id='{outcome.name}'>{html.escape(outcome.name)}</h2>", f"<pre>{doc}</pre>",
             f"<p>Command: <code>python -m experiments {html.escape(outcome.name)}</code> — "
             f"{outcome.seconds:.1f} s.</p>"]
    if outcome.error:
        parts.append(f"<p class='no'>This study failed.</p><pre>{html.escape(outcome.error)}</pre>")
        return "\n".join(parts)
    parts.append(headline_table(list(getattr(outcome.result, "headlines", []) or [])))
    summary = getattr(outcome.result, "summary", "")
    if summary:
        parts.append(f"<pre>{html.escape(str(summary))}</pre>")
    for path, caption in figures_of(outcome):
        if path.exists():
            data = base64.b64encode(path.read_bytes()).decode()
            parts.append(f"<figure><img alt='{html.escape(path.name)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    return "\n".join(parts)


def write_report(outcomes, seconds) -> pathlib.Path:
    summary_rows = "".join(
        f"<tr><td><a href='#{o.name}'>{html.escape(o.name)}</a></td><td>{o.seconds:.1f} s</td>"
        f"<td class='{'no' if o.error else 'yes'}'>{'failed' if o.error else 'ok'}</td>"
        f"<td>{html.escape(status_line(o).split('(', 1)[-1].rstrip(')') if not o.error else '')}</td></tr>"
        for o in outcomes)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>gradlab numerics report</title>"
            f"<style>{STYLE}</style></head><body><h1>gradlab: numerics studies</h1>"
            f"<p>Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by <code>python -m experiments all</code>"
            f" in {seconds:.1f} s. Each study: its headline comparison, then its charts.</p>"
            f"<table><tr><th>study</th><th>time</th><th>status</th><th>headlines</th></tr>{summary_rows}</table>"
            + "\n".join(study_section(o) for o in outcomes) + "</body></html>")
    path = common.RESULTS / "report.html"
    common.atomic_write_text(path, page)
    return path
