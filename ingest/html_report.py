"""The run's report as one HTML page for a person, beside the JSON one (`ingest.outputs.html_path`): the summary, the
stages' timeline (how busy each was over the run: the bottleneck at a glance), files by format, the
slowest files and where their time went, and the files that failed, were empty or skipped, with why.

The page is self-contained (inline CSS and SVG, a few lines of script, nothing fetched) and every name
and message in it is escaped. `Digest` gathers what it shows of the files as they settle (ingest/report.py
NOTE), in bounded memory whatever their number: counters per format, a heap of the TOP_N slowest, and
the first LISTED files of each list (the rest counted: "and N more"). The script marks the body
data-rendered="yes" once the page is drawn, and shows any script error on the page.
"""
from __future__ import annotations

import heapq
import os
from collections import Counter
from html import escape
from pathlib import Path
from typing import Any

from ingest.files import STAGES
from ingest.outputs import tmp_path

TOP_N = 10
LISTED = 100
LISTS = ("failed", "empty", "skipped")
CPU = (("cpu_s", "s"), ("cpu_per_file_ms", "ms a file"), ("cpu_per_pdf_page_ms", "ms a PDF page"))   # totals, units
COLORS = {"load": "#4e79a7", "ocr": "#f28e2b", "chunk": "#59a14f", "encode": "#e15759", "write": "#9c6ade"}
STATUS_COLORS = {"ingested": "#2e7d32", "empty": "#757575", "unchanged": "#4e79a7", "skipped": "#b7791f",
                 "failed": "#c62828"}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
main{max-width:1180px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:0 0 10px}
section{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:16px 18px;margin:16px 0}
.meta{color:#57606a}.meta b{color:#1f2328;font-weight:600}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #d0d7de;border-radius:6px;padding:8px 12px;min-width:110px}
.card .v{font-size:20px;font-weight:600}.card .k{color:#57606a;font-size:12px}
.chip{display:inline-block;border-radius:10px;padding:1px 8px;margin:2px 4px 2px 0;color:#fff;font-size:12px}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eaeef2;
vertical-align:top}th{color:#57606a;font-weight:600;font-size:12px}td.n{text-align:right;font-variant-numeric:tabular-nums}
td.path{word-break:break-all}.err{color:#8b1a1a;word-break:break-word}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:10px;height:10px;
margin-right:4px;border-radius:2px}.more{color:#57606a;font-style:italic}.bad{color:#c62828;font-weight:600}
table.list{table-layout:fixed}table.list col.f{width:12%}table.list col.p{width:44%}
#problems h2{margin-top:14px}#problems h2:first-child{margin-top:0}.small{color:#57606a;font-size:12px}
.js-error{background:#c62828;color:#fff;padding:8px 12px;border-radius:6px;margin:8px 0}
"""

SCRIPT = """
(function(){
  function shout(msg){var d=document.createElement('div');d.id='js-error';d.className='js-error';
    d.textContent='script error: '+msg;document.body.insertBefore(d,document.body.firstChild);}
  window.onerror=function(m){shout(m);};
  var ce=console.error;console.error=function(){shout([].join.call(arguments,' '));ce.apply(console,arguments);};
  var missing=['summary','timeline','formats','slowest','problems'].filter(function(id){
    return !document.getElementById(id);});
  if(missing.length){shout('sections missing: '+missing.join(', '));return;}
  document.body.setAttribute('data-rendered','yes');
})();
"""


class Digest:
    """What the page shows of the files (module docstring), fed each report line as it is spooled."""

    def __init__(self) -> None:
        self.formats: dict[str, Counter] = {}
        self.slowest: list[tuple[float, int, dict[str, Any]]] = []     # a min-heap of the TOP_N slowest
        self.lists: dict[str, list[dict[str, Any]]] = {k: [] for k in LISTS}
        self.counts: Counter[str] = Counter()
        self._seen = 0

    def add(self, entry: dict[str, Any]) -> None:
        status, stages = entry["status"], entry.get("stages", {})
        c = self.formats.setdefault(entry["format"] or "unknown", Counter())      # every file: counts in place
        c["files"] += 1
        c["chunks"] += entry["chunks"]
        c["seconds"] += entry["seconds"]
        c[status] += 1
        for stage, seconds in stages.items():
            c[stage] += seconds
        self.counts[status] += 1
        if status in self.lists and len(self.lists[status]) < LISTED:
            self.lists[status].append({k: entry.get(k) for k in ("path", "format", "error")})
        if entry["seconds"] > 0:
            self._seen += 1
            if len(self.slowest) == TOP_N and (entry["seconds"], self._seen) < self.slowest[0][:2]:
                return                              # not among the slowest: no item made
            item = (entry["seconds"], self._seen, {k: entry.get(k) for k in ("path", "format", "status", "chunks")}
                    | {"stages": stages})
            if len(self.slowest) < TOP_N:
                heapq.heappush(self.slowest, item)
            else:
                heapq.heappushpop(self.slowest, item)


def write(path: Path, totals: dict[str, Any], digest: Digest) -> None:
    """The page, written atomically."""
    tmp = tmp_path(path)
    tmp.write_text(render(totals, digest), encoding="utf-8")
    os.replace(tmp, path)


def render(t: dict[str, Any], d: Digest) -> str:
    body = "".join((_summary(t), _timeline(t.get("timeline")), _formats(d), _slowest(d), _problems(d)))
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>ingest report: '
            f'{escape(str(t.get("store", "")))}</title>\n<meta name="viewport" content="width=device-width">'
            f"<style>{CSS}</style></head>\n<body><main>{body}</main>\n<script>{SCRIPT}</script></body></html>\n")


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}" if v < 10 else f"{v:.1f}"


def _chips(by_status: dict[str, int]) -> str:
    return "".join(f'<span class="chip" style="background:{STATUS_COLORS.get(s, "#555")}">{n:,} {escape(s)}</span>'
                   for s, n in sorted(by_status.items()))


def _summary(t: dict[str, Any]) -> str:
    stop = t.get("stopped_by") or (f"interrupted by {t['signal']}" if t.get("signal") else None)
    meta = " · ".join(f"{k} <b>{escape(str(t[k]))}</b>" for k in ("store", "collection", "model", "backend", "engine")
                      if t.get(k))
    cards = [("files", f"{t.get('files', 0):,}"), ("chunks", f"{t.get('chunks', 0):,}"),
             *((f"chunks {k}", f"{t[f'{k}_chunks']:,}") for k in ("encoded", "reused") if f"{k}_chunks" in t),
             ("seconds", _num(t.get("seconds", 0))), ("exit code", str(t.get("exit_code", "")))]
    cards += [(f"{k} chunks/s", _num(v)) for k, v in t.get("chunks_per_s", {}).items()]
    cards += [(f"CPU {unit}", _num(t[k])) for k, unit in CPU if t.get(k) is not None]
    rows = "".join(f'<div class="card"><div class="v">{escape(v)}</div><div class="k">{escape(k)}</div></div>'
                   for k, v in cards)
    notes = [f'<p class="bad">stopped: {escape(str(stop))}</p>' if stop else "<p>The run finished.</p>"]
    if t.get("not_started"):
        notes.append(f"<p>{t['not_started']:,} files found were not started.</p>")
    notes += [f'<p class="err">warning: {escape(str(w))}</p>' for w in t.get("warnings") or ()]
    if bound := t.get("store_bound"):          # the store held the run back
        notes.append(f'<p class="err" id="store-bound">{escape(str(bound["line"]))}</p>')
    return (f'<section id="summary"><h1>ingest run report</h1><p class="meta">{meta}</p>'
            f'<p>{_chips(t.get("by_status", {}))}</p><div class="cards">{rows}</div>{"".join(notes)}</section>')


def _legend() -> str:
    return '<p class="legend">' + "".join(f'<span><i style="background:{c}"></i>{s}</span>'
                                          for s, c in COLORS.items()) + "</p>"


def _timeline(tl: dict[str, Any] | None) -> str:
    head = '<section id="timeline"><h2>Stages over the run</h2>'
    if not tl or not tl.get("measured"):
        why = tl.get("why") if tl else "the run did not start: nothing was measured"
        return f'{head}<p class="meta">No timeline: {escape(str(why))}.</p></section>'
    width, label, right, lane, gap = 1000, 64, 210, 30, 8
    plot, w = width - label - right, tl["bucket_s"]
    seconds, began = max(tl["seconds"], 1e-9), tl["began_s"]
    scale, axis_y = plot / seconds, 22 + len(STAGES) * (lane + gap)
    parts, use = [], {}
    for row, stage in enumerate(STAGES):
        y = 22 + row * (lane + gap)
        slots = max(1, tl["slots"].get(stage, 1))
        use[stage] = tl["busy_s"][stage] / (max(seconds - began, 1e-9) * slots)
        parts.append(f'<text x="0" y="{y + lane * 0.65:.0f}" font-size="13">{stage}</text>'
                     f'<rect x="{label}" y="{y}" width="{plot}" height="{lane}" fill="#f0f2f4"/>')
        for i, busy in enumerate(tl["stages"][stage]):
            span = min(w, seconds - i * w)
            if busy <= 0 or span <= 0:
                continue
            frac = min(1.0, busy / (span * slots))
            h = max(1.0, frac * lane)
            parts.append(f'<rect x="{label + i * w * scale:.1f}" y="{y + lane - h:.1f}" width="{max(span * scale, 1):.1f}" '
                         f'height="{h:.1f}" fill="{COLORS[stage]}"><title>{stage} {i * w:.1f}-{i * w + span:.1f} s: '
                         f'{frac:.0%} of {slots} busy</title></rect>')
        parts.append(f'<text x="{width - right + 8}" y="{y + lane * 0.65:.0f}" font-size="12">'
                     f'{_num(tl["busy_s"][stage])} s busy · {use[stage]:.0%} of {slots}</text>')
    if began > 0:                              # nothing ran yet: the store, the model, the backend were being opened
        parts.append(f'<rect x="{label}" y="16" width="{began * scale:.1f}" height="{axis_y - gap - 16}" '
                     f'fill="#c9d1d9" fill-opacity="0.45"><title>start-up: {began:.3g} s (config, store, model)'
                     f'</title></rect><text x="{label + 6}" y="{axis_y - gap - 6}" font-size="11" fill="#57606a">'
                     f"start-up</text>")
    for k in range(5):
        x = label + plot * k / 4
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="16" y2="{axis_y - gap}" stroke="#d0d7de"/>'
                     f'<text x="{x:.1f}" y="{axis_y + 8}" font-size="11" text-anchor="middle">'
                     f'{seconds * k / 4:.3g} s</text>')
    busiest = max(use, key=use.get)
    verdict = (f"Busiest: <b>{busiest}</b>, {use[busiest]:.0%} of its capacity while ingesting (after the "
               f"{began:.3g} s start-up)."
               if use[busiest] else "No stage was busy.")
    svg = (f'<svg viewBox="0 0 {width} {axis_y + 14}" width="100%" role="img" '
           f'aria-label="busy fraction of each stage over the run">{"".join(parts)}</svg>')
    return (f'{head}<p class="meta">Each lane: how busy the stage\'s processes were in each {w:g} s of the run '
            f"(bar height: share of its processes busy; the right column: of the ingesting time). {verdict}</p>"
            f"{svg}</section>")


def _stage_bar(stages: dict[str, float], most: float) -> str:
    if most <= 0:
        return ""
    rects, x = [], 0.0
    for stage in STAGES:
        if (v := stages.get(stage, 0)) > 0:
            rects.append(f'<rect x="{x:.1f}" y="0" width="{v / most * 300:.1f}" height="12" fill="{COLORS[stage]}">'
                         f"<title>{stage} {v:.3g} s</title></rect>")
            x += v / most * 300
    return f'<svg width="300" height="12" role="img">{"".join(rects)}</svg>'


def _formats(d: Digest) -> str:
    statuses = [s for s in STATUS_COLORS if any(c[s] for c in d.formats.values())]
    most = max((c["seconds"] for c in d.formats.values()), default=0)
    head = "".join(f"<th>{h}</th>" for h in ("format", "files", *statuses, "chunks", "seconds", "where the time went"))
    rows = "".join(f'<tr><td>{escape(fmt)}</td><td class="n">{c["files"]:,}</td>'
                   + "".join(f'<td class="n">{c[s]:,}</td>' for s in statuses)
                   + f'<td class="n">{c["chunks"]:,}</td><td class="n">{c["seconds"]:.2f}</td>'
                   f"<td>{_stage_bar(c, most)}</td></tr>"
                   for fmt, c in sorted(d.formats.items(), key=lambda kv: -kv[1]["seconds"]))
    body = f"<table><tr>{head}</tr>{rows}</table>{_legend()}" if rows else '<p class="meta">No files.</p>'
    return f'<section id="formats"><h2>By format</h2>{body}</section>'


def _slowest(d: Digest) -> str:
    items = sorted(d.slowest, reverse=True)
    most = items[0][0] if items else 0
    rows = "".join(f'<tr><td class="path">{escape(e["path"])}</td><td>{escape(e["format"] or "")}</td>'
                   f'<td>{escape(e["status"])}</td><td class="n">{e["chunks"]:,}</td><td class="n">{s:.3f}</td>'
                   f'<td>{_stage_bar(e["stages"], most)} <span class="small">'
                   f'{escape(", ".join(f"{k} {v:.3g}" for k, v in e["stages"].items()))}</span></td></tr>'
                   for s, _, e in items)
    head = "".join(f"<th>{h}</th>" for h in ("file", "format", "status", "chunks", "seconds", "stages"))
    body = f"<table><tr>{head}</tr>{rows}</table>{_legend()}" if rows else '<p class="meta">No file took time.</p>'
    return f'<section id="slowest"><h2>Slowest files</h2>{body}</section>'


def _problems(d: Digest) -> str:
    out = []
    for status in LISTS:
        listed, total = d.lists[status], d.counts[status]
        if not total:
            continue
        rows = "".join(f'<tr><td class="path">{escape(e["path"])}</td><td>{escape(e["format"] or "")}</td>'
                       f'<td class="err">{escape(e["error"] or "")}</td></tr>' for e in listed)
        more = f'<p class="more">and {total - len(listed):,} more (the JSON report lists every file)</p>' \
            if total > len(listed) else ""
        out.append(f'<h2>{escape(status.capitalize())} ({total:,})</h2><table class="list"><col class="p"><col class="f">'
                   f"<col><tr><th>file</th><th>format</th><th>why</th></tr>{rows}</table>{more}")
    body = "".join(out) or '<p>No file failed, was empty or was skipped.</p>'
    return f'<section id="problems">{body}</section>'
