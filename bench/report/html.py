"""REPORT.html: the Markdown report as one self-contained page that opens from disk in any browser.

The page is built from REPORT.md itself (one source for every table, note and section), through a converter for
the small subset of Markdown the report writes: headings, paragraphs, lists, block quotes, tables, code fences,
``<details>`` blocks and plot images. Each plot comes inline as the SVG the plotting code wrote beside its PNG
(an ``<img>`` with a data: URL, so the figures' element ids never clash). Every piece of text is escaped;
nothing is loaded from anywhere (a Content-Security-Policy meta tag forbids it), and there is no script.
"""
from __future__ import annotations

import base64
import html
import os
import re
from pathlib import Path
from urllib.parse import quote

LONG = 12  # tables with a row per run and more rows than this come folded
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2433; margin: 0;
       background: #f6f7f9; }
main { max-width: 1320px; margin: 0 auto; padding: 16px 28px 48px; background: #fff; }
h1 { font-size: 24px; margin: 8px 0 4px; } h2 { font-size: 19px; margin-top: 32px; border-bottom: 2px solid #dde2ea;
     padding-bottom: 4px; } h3 { font-size: 15px; margin: 22px 0 6px; }
code, pre { font: 12.5px/1.4 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; background: #f0f2f5;
            border-radius: 3px; } code { padding: 0 3px; } pre { padding: 8px; overflow-x: auto; }
.table { overflow-x: auto; margin: 6px 0 12px; }
table { border-collapse: collapse; font-size: 13px; } th, td { border: 1px solid #d5dae2; padding: 3px 7px; }
th { background: #eef1f5; text-align: left; } td.r, th.r { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #fafbfc; }
blockquote { margin: 8px 0; padding: 6px 12px; border-left: 4px solid #e0a800; background: #fff8e1; }
img.plot { display: block; max-width: 100%; height: auto; margin: 10px 0 18px; border: 1px solid #e3e6eb; }
#verdict { background: #eef7ee; border: 1px solid #b9dcb9; border-radius: 6px; padding: 4px 18px 10px; }
#verdict h2 { border: 0; margin-top: 12px; } #verdict h3 { margin-top: 16px; }
#verdict strong { color: #17561f; } #verdict ul { margin: 4px 0; }
#verdict .no-winner strong { color: #8a5a00; }
summary { cursor: pointer; color: #2456a6; margin: 6px 0; }
"""


# [text](target): a path relative to the page (a trace file); nothing with a scheme (https:, javascript:) becomes a
# link, so the page points at nothing outside the results
LINK = re.compile(r"\[([^\]]+)\]\(((?![\w+.-]*:)[^\s()\"'<>]+)\)")


def inline(text: str) -> str:
    """Escape, then the inline Markdown the report uses: `code`, **bold** (which may hold `code`, as a verdict's
    headline does), *emphasis*, [links](relative/path)."""
    parts = re.split(r"`([^`]*)`", text)
    bold = sum(part.count("**") for part in parts[::2]) % 2 == 0  # an unpaired ** stays as it is
    out, opened = [], False
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        part = html.escape(part, quote=False)
        if bold:
            pieces = part.split("**")
            part = pieces[0]
            for piece in pieces[1:]:
                opened = not opened
                part += ("<strong>" if opened else "</strong>") + piece
        part = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", part)
        out.append(LINK.sub(r'<a href="\2">\1</a>', part))
    return "".join(out)


def _cells(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [c.strip().replace("\\|", "|") for c in cells]


def table(lines: list[str]) -> str:
    head, rule, body = _cells(lines[0]), _cells(lines[1]), [_cells(x) for x in lines[2:]]
    cls = [' class="r"' if r.endswith(":") else "" for r in rule]
    th = "".join(f"<th{c}>{inline(h)}</th>" for h, c in zip(head, cls))
    rows = "".join("<tr>" + "".join(f"<td{c}>{inline(x)}</td>" for x, c in zip(r, cls)) + "</tr>" for r in body)
    div = f'<div class="table"><table><thead><tr>{th}</tr></thead><tbody>{rows}</tbody></table></div>'
    if "run" in head and len(body) > LONG:  # a row per run (the memory table): folded, so the page stays readable
        return f"<details><summary>{len(body)} runs: show the table</summary>{div}</details>"
    return div


def plot(alt: str, src: str, out: Path) -> str:
    """The SVG written beside the referenced PNG, inline as a data: URL; a missing file is said, not hidden."""
    svg = (out / src).with_suffix(".svg")
    try:
        data = base64.b64encode(svg.read_bytes()).decode()
    except OSError:
        return f"<p><em>plot {html.escape(src)} is missing</em></p>"
    return (f'<img class="plot" data-plot="{html.escape(alt)}" alt="{html.escape(alt)} plot" '
            f'src="data:image/svg+xml;base64,{data}">')


def anchor(heading: str, taken: set) -> str:
    """GitHub's anchor of a Markdown heading (lower case, punctuation dropped, spaces to hyphens; -1, -2 for repeats)."""
    base = re.sub(r"[^\w\- ]", "", re.sub(r"`|\*", "", heading).lower()).replace(" ", "-")
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}-{k}"
    taken.add(name)
    return name


def convert(md: str, out: Path) -> str:
    """The report's Markdown subset to HTML; each ``##`` section becomes a <section> with an id."""
    parts, lines, i = [], md.split("\n"), 0
    sections, ids = 0, set()
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif m := re.match(r"^(#{1,3}) (.*)$", line):
            level = len(m[1])
            if level == 2:
                parts.append("</section>" * bool(sections))
                sections += 1
                sid = "verdict" if m[2] == "Verdict" else "s-" + re.sub(r"[^a-z0-9]+", "-", m[2].lower()).strip("-")
                parts.append(f'<section id="{sid}">')
            # an h3 gets the id GitHub gives the heading in REPORT.md, so one link works in both
            hid = f' id="{anchor(m[2], ids)}"' if level == 3 else ""
            parts.append(f"<h{level}{hid}>{inline(m[2])}</h{level}>")
            i += 1
        elif line.startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            parts.append(table(lines[i:j]))
            i = j
        elif line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            parts.append(f"<pre>{html.escape(chr(10).join(lines[i + 1:j]))}</pre>")
            i = j + 1
        elif m := re.match(r"^<details><summary>(.*)</summary>$", line):
            parts.append(f"<details><summary>{html.escape(m[1])}</summary>")
            i += 1
        elif line == "</details>":
            parts.append("</details>")
            i += 1
        elif m := re.match(r"^!\[(.*?)\]\((.*?)\)$", line):
            parts.append(plot(m[1], m[2], out))
            i += 1
        elif line.startswith(("- ", "> ")):
            tag, j = ("ul", i) if line.startswith("- ") else ("blockquote", i)
            while j < len(lines) and lines[j].startswith(line[:2]):
                j += 1
            items = [inline(x[2:]) for x in lines[i:j]]
            parts.append("<ul>" + "".join(f"<li>{x}</li>" for x in items) + "</ul>" if tag == "ul"
                         else "<blockquote>" + "<br>".join(items) + "</blockquote>")
            i = j
        else:
            j = i
            while j < len(lines) and lines[j].strip() and not re.match(r"^(#|\||```|- |> |!\[|<)", lines[j]):
                j += 1
            j = max(j, i + 1)
            # a verdict's headline: a named winner, or none (marked, so it is never read as a recommendation)
            cls = (' class="winner"' if line.startswith("**Use ") else
                   ' class="no-winner"' if line.startswith(("**No winner", "**Fastest here")) else "")
            parts.append(f"<p{cls}>" + " ".join(inline(x) for x in lines[i:j]) + "</p>")
            i = j
    return "\n".join(parts + ["</section>"] * bool(sections))


def runs_section(rows: list[dict], src: Path, out: Path) -> str:
    """Every run with its status and a link to its log (``RESULTS/logs/RUN_ID.log``), relative to the page."""
    body = []
    recs = sorted((rec for r in rows for rec in r["_recs"]), key=lambda rec: (rec["status"] == "ok", str(rec["run_id"])))
    for rec in recs:
        log = src / "logs" / f"{rec['run_id']}.log"
        href = quote(Path(os.path.relpath(log.resolve(), out.resolve())).as_posix())
        link = (f'<a href="{html.escape(href)}">log</a>' if log.is_file() else
                "no log (not launched)" if rec["status"] == "skipped" else "no log file")
        status = rec["status"] + (f": {rec['reason']}" if rec.get("reason") else "")
        body.append(f"<tr><td><code>{html.escape(str(rec['run_id']))}</code></td><td>{html.escape(rec['backend'])}</td>"
                    f'<td class="r">{rec["world_size"]}</td><td>{html.escape(str(rec["precision"]))}</td>'
                    f"<td>{html.escape(status)}</td><td>{link}</td></tr>")
    bad = sum(rec["status"] != "ok" for rec in recs)
    fold = len(recs) > LONG
    return ('<section id="runs"><h2>Runs and their logs</h2>'
            + f"<p>{len(recs)} runs, {bad} not ok (listed first).</p>"
            + (f"<details><summary>{len(recs)} runs: show the table</summary>" if fold else "")
            + '<div class="table"><table><thead><tr><th>run</th><th>backend</th><th class="r">N</th><th>precision</th>'
            '<th>status</th><th>log</th></tr></thead><tbody>' + "".join(body) + "</tbody></table></div>"
            + ("</details>" if fold else "") + "</section>")


def page(md: str, rows: list[dict], src: Path, out: Path) -> str:
    body = convert(md, out)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            "<title>Parallel backend comparison</title>\n"
            f"<style>{CSS}</style></head>\n<body><main>\n{body}\n{runs_section(rows, src, out)}\n</main></body></html>\n")

