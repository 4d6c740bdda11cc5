"""One self-contained HTML file for a run folder or a sweep folder: the resolved scenario, the
tables and the figures (PNG inlined as data: URIs), readable offline, no script, no network.

Everything a page shows that comes from a run folder (names, labels, messages, manifest fields)
is text, escaped where it is inserted (_page, _table, _figure, _yaml_block take plain text):
a folder someone sent cannot put markup in the page. The page also forbids scripts, frames and
any request outside itself (Content-Security-Policy), so a value that slipped through would
still not run."""

from __future__ import annotations

import base64
import html
import json
import math
from datetime import UTC, datetime
from pathlib import Path

import yaml

from wirelessfl.results.compare import Comparison, comparison_cells
from wirelessfl.results.records import write_file

# The tables fit a 1,280 px window [D] (a laptop screen; checked with headless Chromium, the
# run summary's 20 columns at 1,230 px): a smaller font and padding, headers that wrap at
# their spaces, labels in the first column that wrap (a long label is one cell, not the
# table's width); numbers never wrap. A table wider still (a sweep over many keys) scrolls
# inside its own box, the page does not. A table of sentences (a reproduction's claims: the
# paper's statements run to 200 characters) is a prose table instead: as wide as the page and
# no wider (fixed layout), every cell wrapping, a long token (a metric's name) broken anywhere.
CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; margin: 0 auto;
       max-width: 1400px; padding: 1.5em 2em 4em; color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
.meta { color: #555; font-size: 0.92em; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.6em 0; }
th, td { border: 1px solid #d5d5d5; padding: 0.22em 0.4em; text-align: right; white-space: nowrap; }
th { background: #f3f3f5; white-space: normal; vertical-align: bottom; }
td:first-child, th:first-child { text-align: left; }
td:first-child { white-space: normal; overflow-wrap: anywhere; min-width: 6em; max-width: 16em; }
tr:nth-child(even) td { background: #fafafa; }
tr.failed td { background: #fde8e8; } .message { text-align: left; white-space: normal;
  min-width: 24em; }
table.prose { table-layout: fixed; width: 100%; }
table.prose th, table.prose td { text-align: left; white-space: normal; overflow-wrap: anywhere;
  min-width: 0; max-width: none; }
table.prose td { vertical-align: top; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
details { margin: 0.6em 0; } summary { cursor: pointer; font-weight: 600; }
pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; font-size: 0.82em; }
"""


# Nothing but the page's own style and its inlined images: no script, no request elsewhere.
POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _text(value) -> str:
    """``value`` as escaped HTML text (quotes included: safe inside attributes too)."""
    return html.escape(str(value), quote=True)


# A prose table's columns share the page's width in proportion to their longest cell, counted
# up to PROSE_CAP characters (a long statement wraps instead of starving the other columns),
# and never less than PROSE_WORD times its longest word (a character is wider than a share of the
# width counted in characters, so a word like "inconclusive" was broken inside), plus PROSE_PAD
# for a cell's padding [D].
PROSE_CAP = 60
PROSE_WORD = 1.4
PROSE_PAD = 4


def _table(cells: list[list[str]], classes: list[str] | None = None,
           message_col: int | None = None, prose: bool = False) -> str:
    """``cells`` (header first) as a table; ``classes``: one class per body row; the column
    ``message_col`` is left-aligned text that wraps; ``prose``: every column wraps and the
    table is as wide as the page (module comment above CSS)."""

    def row(tag: str, values: list[str]) -> str:
        return "".join(f'<{tag} class="message">{_text(c)}</{tag}>' if j == message_col
                       else f"<{tag}>{_text(c)}</{tag}>" for j, c in enumerate(values))

    body = []
    for i, values in enumerate(cells[1:]):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>{row('td', values)}</tr>")
    table = f'<thead><tr>{row("th", cells[0])}</tr></thead><tbody>{"".join(body)}</tbody>'
    if not prose:
        return f'<div class="scroll"><table>{table}</table></div>'
    weights = [max(min(max(len(r[i]) for r in cells), PROSE_CAP),
                   PROSE_WORD * max(len(w) for r in cells for w in (r[i].split() or [""])))
               + PROSE_PAD for i in range(len(cells[0]))]
    cols = "".join(f'<col style="width: {100 * w / sum(weights):.1f}%">' for w in weights)
    return f'<table class="prose"><colgroup>{cols}</colgroup>{table}</table>'


def _figure(path: Path, caption: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return (f'<figure><img alt="{_text(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_text(caption)}</figcaption></figure>")


def _yaml_block(title: str, doc: dict, open_: bool = False) -> str:
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)
    return (f"<details{' open' if open_ else ''}><summary>{_text(title)}</summary>"
            f"<pre>{_text(text)}</pre></details>")


def _page(title: str, meta: str, sections: list[str]) -> str:
    """The page: ``title`` and ``meta`` are plain text; ``sections`` HTML built from escaped
    text."""
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_text(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{_text(title)}</h1><p class=\"meta\">{_text(meta)} &middot; report written "
            f"{stamp} by wirelessfl</p>{''.join(sections)}</body></html>\n")


CAPTIONS = {
    "compare_accuracy_vs_energy.png": "Test accuracy against cumulative energy: mean over seeds, "
                                      "band = 95 % confidence interval (t) of the accuracy.",
    "compare_accuracy_vs_time.png": "Test accuracy against simulated time, mean and 95 % band.",
    "compare_energy_to_target.png": "Energy to the target accuracy against each swept parameter.",
    "compare_pareto.png": "Energy of the whole run against final accuracy per configuration; "
                          "the Pareto front: those no other configuration beats beyond the 95 % "
                          "intervals; joined only where the intervals tell them apart.",
}


def sweep_html(sweep_dir: Path, comp: Comparison, figure_paths: list[Path], out: Path) -> Path:
    """The report of a sweep folder: definition, base scenario, runs, comparison, figures."""
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    runs = manifest.get("runs", [])
    keys = manifest.get("keys", [])
    cells = [["run", "status", "seed", *keys, "attempts", "host time [s]", "message"]]
    classes = []
    for r in runs:
        wall = r.get("wall_s")
        shown = isinstance(wall, int | float) and math.isfinite(wall)
        cells.append([str(r.get("run")), str(r.get("status")), str(r.get("seed")),
                      *(str(r.get(k)) for k in keys),
                      str(r.get("attempts", "")),
                      f"{wall:.1f}" if shown else "",
                      r.get("message") or ""])
        classes.append("failed" if r.get("status") == "failed" else "")
    statuses = [str(r.get("status")) for r in runs]
    counts = {s: statuses.count(s) for s in dict.fromkeys(statuses)}
    first = comp.records[0].manifest.get("scenario", {})
    figures = [_figure(p, CAPTIONS.get(p.name, p.name)) for p in figure_paths]
    reached_note = ("Energy and time to target are averaged over the seeds that reached the "
                    "target only; the 'reached target' column says how many did.")
    sections = [
        "<h2>Comparison over seeds</h2>",
        (f"<p>Mean ± half-width of the 95 % confidence interval (Student t, over seeds). "
         f"{reached_note}</p>"), _table(comparison_cells(comp)),
        "<h2>Figures</h2>", *figures,
        "<h2>Sweep</h2>",
        (f"<p>Base scenario <code>{_text(manifest.get('base_scenario'))}</code>; "
         f"swept keys: {', '.join(f'<code>{_text(k)}</code>' for k in keys)}; seeds "
         f"{_text(manifest.get('seeds'))}.</p>"),
        _yaml_block("the sweep file", manifest.get("sweep", {}), open_=True),
        _yaml_block("the resolved scenario of the first finished run (the others differ only in "
                    "the swept keys and the seed)", first),
        "<h2>Runs</h2>", _table(cells, classes, message_col=len(cells[0]) - 1),
    ]
    status = ", ".join(f"{n} {s}" for s, n in counts.items())
    page = _page(f"Sweep {manifest.get('name', sweep_dir.name)}",
                 f"{len(runs)} runs ({status}) in {sweep_dir}", sections)
    return write_file(out, page)


def run_html(record, table_cells: list[list[str]], figures: list[Path], out: Path,
             table=None) -> Path:
    """The report of one run folder: summary table, health (from ``table``, the summary
    DataFrame, when given), figures, resolved scenario."""
    scenario = record.manifest.get("scenario", {})
    health = []
    if table is not None:
        cells = [["algorithm", "healthy", "health"]]
        cells += [[str(r.algorithm), "yes" if r.healthy else "NO", str(r.health)]
                  for r in table.itertuples()]
        health = ["<h2>Health</h2>",
                  _table(cells, ["" if r.healthy else "failed" for r in table.itertuples()],
                         message_col=2)]
    notes = record.manifest.get("notes") or []
    noted = ["<h2>Notes</h2>", "<ul>" + "".join(f"<li>{_text(str(n))}</li>" for n in notes)
             + "</ul>"] if notes else []
    sections = ["<h2>Summary</h2>", _table(table_cells), *health, *noted, "<h2>Figures</h2>",
                *(_figure(p, p.stem.replace("_", " ")) for p in figures),
                "<h2>Scenario</h2>", _yaml_block("the resolved scenario", scenario, open_=True),
                _yaml_block("versions", record.manifest.get("versions", {}))]
    meta = (f"seed {record.manifest.get('seed')}, status {record.manifest.get('status')}, "
            f"{record.path}")
    return write_file(out, _page(f"Run {scenario.get('name', record.path.name)}", meta,
                                 sections))

