"""python -m experiments all [--jobs N]: run every study of the registry marked for ``all`` at its
defaults, on N processes at once (experiments.runner; --jobs 1: one after another in this
process), and write results/report.html.

A study that fails is reported (its traceback's last lines on the page, a line on stderr) and the
others still run; the exit status is then 1.  The page is self-contained: at the top, one sentence
per headline, grouped by kind (only the Reproduced kind is counted); then per study its protocol in prose,
its headline tests (kind, prediction ± its uncertainty, measurement ± SE, the rule), its per-size
tables and its charts (embedded PNG) with their captions.
"""
from __future__ import annotations

import base64
import html
import pathlib
import sys
import time

from experiments import common, runner

STYLE = """body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:1em 0;font-size:.85em}td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}.yes{color:#17702b;font-weight:bold}.no{color:#b00020;font-weight:bold}.shown{color:#555}
figure{margin:1.5em 0}img{max-width:100%}figcaption{font-size:.9em;color:#444;margin-top:.3em}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.8em}ul.summary li{margin:.2em 0}"""
CSS = {True: "yes", False: "no", None: "shown"}
# The summary's groups, in order: only the first is counted as the lab's results.
GROUPS = (("reproduced", "Results: published or derived numbers, two-sided tests (counted)"),
          ("consistent", "Bounds and inequalities: consistent, with their margins (not counted)"),
          ("identity", "Identities of the sampler or the algebra: checks, not results (not counted)"),
          ("shown", "Shown: measured, no quantitative prediction (not judged)"))


def run_all(entries, *, jobs=1, configs=None) -> int:
    """Run the studies (on `jobs` processes), print a line as each finishes and write the page,
    in the registry's order; exit status 1 when any study failed.  configs: {name: Config} for
    studies not to run at their defaults (the tests' tiny runs)."""
    outcomes, start = [], time.perf_counter()
    jobs = min(jobs, max(len(entries), 1))
    if jobs > 1:
        print(f"[all] {len(entries)} studies on {jobs} processes, longest first", flush=True)

    def on_start(entry):  # serial runs only: the study's own progress follows this line
        print(f"[all {len(outcomes) + 1}/{len(entries)}] {entry.name} ...", flush=True)

    def on_done(outcome):
        outcomes.append(outcome)
        print_outcome(outcome, len(outcomes), len(entries))

    try:
        runner.run(entries, jobs=jobs, configs=configs, on_start=on_start, on_done=on_done)
    finally:  # an interrupted run still leaves a page for what finished
        outcomes = in_order(outcomes, entries)
        path = write_report(outcomes, time.perf_counter() - start)
        failed = sum(o.error is not None for o in outcomes)
        print(f"[all] {len(outcomes)} studies in {time.perf_counter() - start:.1f} s, "
              f"{failed} failed; report: {path}", flush=True)
    return 1 if failed else 0


def in_order(outcomes, entries) -> list:
    """The outcomes in the order of entries (the registry's), whatever order they finished in."""
    rank = {e.name: i for i, e in enumerate(entries)}
    return sorted(outcomes, key=lambda o: rank[o.name])


def print_outcome(outcome, i, n) -> None:
    """The study's line (name, time, headlines reproduced), its summary indented below it, and
    its error on stderr."""
    print(f"[all {i}/{n}] {status_line(outcome)}", flush=True)
    if outcome.result is not None and outcome.result.summary:
        print("\n".join(f"    {line}" for line in outcome.result.summary.splitlines()), flush=True)
    if outcome.error:
        print(f"[all] {outcome.name} failed:\n{outcome.error}", file=sys.stderr, flush=True)


def counts(heads) -> str:
    """"R/N reproduced" (the Reproduced kind only, the one count of results), then the other
    kinds: consistent bounds, identities (not counted) and shown numbers, where there are any."""
    t = common.tally(heads)
    text = (f"{t['reproduced'][0]}/{t['reproduced'][1]} reproduced" if t["reproduced"][1]
            else "no result to reproduce")
    if t["consistent"][1]:
        text += f", {t['consistent'][0]}/{t['consistent'][1]} bounds consistent"
    if t["identity"][1]:
        text += f", {t['identity'][0]}/{t['identity'][1]} identities hold (not counted)"
    if t["shown"][1]:
        text += f", {t['shown'][1]} shown"
    return text


def status_line(outcome) -> str:
    if outcome.error:
        return f"{outcome.name} FAILED after {outcome.seconds:.1f} s"
    return f"{outcome.name} done in {outcome.seconds:.1f} s ({counts(outcome.headlines)})"


# --- the page ----------------------------------------------------------------------------------

def _num(value, digits=5) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return html.escape(str(value))


def _pm(value, se) -> str:
    text = _num(value)
    if isinstance(se, float) and se == se and se > 0:
        text += f" ± {se:.2g}"
    return text


def headline_table(heads) -> str:
    if not heads:
        return "<p>No headline comparison.</p>"
    rows = []
    for h in heads:
        rows.append(f"<tr><td>{html.escape(common.KIND_NAMES[h.kind])}</td>"
                    f"<td>{html.escape(h.quantity)}</td><td>{_pm(h.predicted, h.predicted_se)}</td>"
                    f"<td>{_pm(h.measured, h.measured_se)}</td><td>{html.escape(h.rule)}</td>"
                    f"<td>{html.escape(h.source)}</td>"
                    f"<td class='{CSS[h.agrees]}'>{html.escape(h.label)}</td></tr>")
    return ("<table><tr><th>kind</th><th>quantity</th><th>predicted (± its uncertainty)</th>"
            "<th>measured ± SE</th><th>rule</th><th>source of the prediction</th><th>outcome</th></tr>"
            + "".join(rows) + "</table>")


def html_table(title, rows) -> str:
    """A list of dicts as an HTML table (columns: the union of the keys, first-seen order)."""
    if not rows:
        return ""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_num(row.get(c, ''))}</td>" for c in columns) + "</tr>"
                   for row in rows)
    return f"<h3>{html.escape(title)}</h3><table><tr>{head}</tr>{body}</table>"


def prose(text) -> str:
    """A docstring as paragraphs (blank lines separate them; '*' or '-' lines become lists)."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = [line.strip() for line in block.strip().splitlines()]
        if lines and lines[0][:2] in ("* ", "- "):
            items, current = [], []
            for line in lines:
                if line[:2] in ("* ", "- ") and current:
                    items.append(" ".join(current))
                    current = []
                current.append(line[2:] if line[:2] in ("* ", "- ") else line)
            items.append(" ".join(current))
            out.append("<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>")
        else:
            out.append(f"<p>{html.escape(' '.join(lines))}</p>")
    return "\n".join(out)


def study_section(outcome) -> str:
    doc = (outcome.result.protocol if outcome.result is not None and outcome.result.protocol
           else outcome.doc)
    parts = [f"<h2 id='{outcome.name}'>{html.escape(outcome.name)}</h2>", prose(doc),
             f"<p>Command: <code>python -m experiments {html.escape(outcome.name)}</code> — "
             f"{outcome.seconds:.1f} s.</p>"]
    if outcome.error:
        parts.append(f"<p class='no'>This study failed.</p><pre>{html.escape(outcome.error)}</pre>")
        return "\n".join(parts)
    result = outcome.result
    parts.append(headline_table(result.headlines))
    parts += [html_table(title, rows) for title, rows in result.tables]
    if result.summary:
        parts.append(f"<pre>{html.escape(result.summary)}</pre>")
    for path, caption in result.figures:
        path = pathlib.Path(path)
        if path.exists():
            data = base64.b64encode(path.read_bytes()).decode()
            parts.append(f"<figure><img alt='{html.escape(path.name)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    return "\n".join(parts)


def summary_list(outcomes) -> str:
    """The headlines grouped by kind (GROUPS), one sentence each; failed studies first."""
    parts = [f"<p class='no'>{html.escape(o.name)}: the study failed (below).</p>"
             for o in outcomes if o.error]
    for kind, title in GROUPS:
        items = [f"<li><a href='#{o.name}'>{html.escape(o.name)}</a>: "
                 f"<span class='{CSS[h.agrees]}'>{html.escape(h.sentence())}</span></li>"
                 for o in outcomes for h in o.headlines if h.kind == kind]
        if items:
            parts.append(f"<h3>{html.escape(title)}</h3><ul class='summary'>{''.join(items)}</ul>")
    return "".join(parts)


def write_report(outcomes, seconds) -> pathlib.Path:
    heads = [h for o in outcomes for h in o.headlines]
    overview = "".join(
        f"<tr><td><a href='#{o.name}'>{html.escape(o.name)}</a></td><td>{o.seconds:.1f} s</td>"
        f"<td class='{'no' if o.error else 'yes'}'>{'failed' if o.error else 'ok'}</td>"
        f"<td>{'' if o.error else html.escape(counts(o.headlines))}</td></tr>" for o in outcomes)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>gradlab numerics report</title>"
            f"<style>{STYLE}</style></head><body><h1>gradlab: numerics studies</h1>"
            f"<p>Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by <code>python -m experiments all</code>"
            f" in {seconds:.1f} s: {html.escape(counts(heads))}. Only the Reproduced kind is counted as a "
            f"result: a published or derived number matched by a two-sided test that could fail. "
            f"Consistent: a bound or inequality held (its margin in the rule); Identity: a property of "
            f"the sampler or the algebra, true for correct code, kept as a check and not counted; "
            f"Shown: measured, not judged. Every headline states its prediction with its own "
            f"uncertainty, the measurement with its standard error and the rule (t-quantiles where "
            f"the SE rests on few trials). The published numbers compared with are in docs/article.md "
            f"and docs/studies.md.</p>"
            f"<h2>Summary: what was reproduced and what was not</h2>{summary_list(outcomes)}"
            f"<table><tr><th>study</th><th>time</th><th>status</th><th>headlines</th></tr>{overview}</table>"
            + "\n".join(study_section(o) for o in outcomes) + "</body></html>")
    path = common.RESULTS / "report.html"
    common.atomic_write_text(path, page)
    common.atomic_write_text(common.RESULTS / HEADLINES_MD, headlines_markdown(outcomes, seconds))
    return path


# --- the headline table for docs/studies.md ----------------------------------------------------

HEADLINES_MD = "headlines.md"   # written by `all` beside report.html; `docs` copies it into the docs
DOCS_SECTION = "headlines"


def _md(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def headlines_markdown(outcomes, seconds) -> str:
    """Every headline of the run as a markdown table (kind, quantity, prediction, measurement
    ± SE, outcome), after the run's count line: what `python -m experiments docs` puts into
    docs/studies.md."""
    heads = [h for o in outcomes for h in o.headlines]
    failed = [o.name for o in outcomes if o.error]
    lines = [f"`python -m experiments all`, {len(outcomes)} studies in {seconds:.1f} s"
             + (f" ({', '.join(failed)} failed)" if failed else "") + f": {counts(heads)}.", "",
             "| study | kind | quantity | predicted | measured ± SE | outcome |",
             "| --- | --- | --- | --- | --- | --- |"]
    for o in outcomes:
        for h in o.headlines:
            lines.append(f"| {o.name} | {common.KIND_NAMES[h.kind]} | {_md(h.quantity)} | "
                         f"{_md(_pm(h.predicted, h.predicted_se))} | {_md(_pm(h.measured, h.measured_se))} | "
                         f"{'**' + h.label + '**' if h.agrees is False else h.label} |")
    return "\n".join(lines) + "\n"


def update_docs(path="docs/studies.md") -> pathlib.Path:
    """Copy the last run's headline table (results/headlines.md) into the docs' headlines
    section."""
    from checks import docs
    source = common.RESULTS / HEADLINES_MD
    if not source.exists():
        raise FileNotFoundError(f"{source}: expected the table `python -m experiments all` writes; "
                                "run it first")
    docs.write_section(path, DOCS_SECTION, source.read_text())
    return pathlib.Path(path)
