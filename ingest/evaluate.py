"""`ingest eval QUESTIONS.jsonl`: how well a collection's search finds known evidence.

Each line of the file is an object with `question`, `source` (the document's path as ingested, or its
tail: a hit matches when its source equals it or ends with "/" + it) and optionally `pages` (1-based).
Reported: doc-hit@k (a top-k hit is from the source), page-hit@k (a top-k hit is from the source on one
of the pages), MRR@10 (reciprocal rank of the first page hit, 0 past 10), for k = 5, 10 (and -k).
Page metrics and MRR count only the questions that name pages. The questions are embedded together
(one model load), then searched one by one. A source no chunk of the collection comes from (a typo, a file
not ingested) still scores its questions as misses, and is named in a warning and in `missing_sources`.

`--hide-names`: the collection was ingested from a copy of the documents under meaningless names
(`hide_names`: "scan_<8 digits>.pdf", from a hash of the file name), so that nothing can find a document by
its name; each question's source is mapped to its hidden name.

`--compare OTHER.json` (an earlier `ingest eval --json`) adds each metric's change and, per question (matched
by question and source), its rank there and here: the rank of its first page hit, or of its first doc hit
for a question without pages, a miss past the hits searched. Wins moved up, losses moved down.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from ingest.search import Searcher, same_doc

CUTOFFS = (5, 10)
MRR_AT = 10
MISS_AT = 5               # a question is listed as a miss without a page hit (doc hit: no pages) in its top 5
MISSING_SHOWN = 10        # sources not in the collection named in the warning (--json lists all)


class EvalError(ValueError):
    """A questions file that cannot be read; the message is one line."""


@dataclass(frozen=True)
class Question:
    question: str
    source: str
    pages: tuple[int, ...]       # () when the question names none


def hidden_name(source: str) -> str:
    """A meaningless name for the file `source` names, as a scanner would give it: "scan_<8 digits>" (from a
    hash of its file name) with its extension, in the same folder; the same file name always gets the same."""
    path = PurePosixPath(source.replace("\\", "/"))
    number = int(hashlib.sha256(path.name.encode()).hexdigest(), 16) % 10 ** 8
    return str(path.with_name(f"scan_{number:08d}{path.suffix}"))


def hide_names(folder: Path, into: Path) -> dict[str, str]:
    """Copy every file under `folder` into `into` under its hidden_name (a hard link where it can, else a copy;
    an existing copy is kept); {source: hidden source}, sources relative to `folder`."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        source = path.relative_to(folder).as_posix()
        target = into / hidden_name(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            try:
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)
        out[source] = hidden_name(source)
    return out


def load_questions(path: Path) -> list[Question]:
    """The questions of a JSONL file (blank lines skipped); EvalError names the line of a bad one."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalError(f"cannot read questions file {path}: {exc}; pass a JSONL file of questions") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            question, source, pages = obj["question"], obj["source"], obj.get("pages") or []
            if not (isinstance(question, str) and isinstance(source, str) and question.strip() and source):
                raise ValueError("question and source must be non-empty strings")
            if not isinstance(pages, list) or not all(isinstance(p, int) and not isinstance(p, bool) and p > 0
                                                      for p in pages):
                raise ValueError("pages must be a list of 1-based page numbers")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            raise EvalError(f"{path}, line {n}: {what}; each line must be a JSON object with question, source "
                            "and optionally pages") from None
        out.append(Question(question, source, tuple(pages)))
    if not out:
        raise EvalError(f"{path} holds no questions; write one JSON object a line")
    return out


def score(questions: Sequence[Question], hits: Sequence[Sequence[dict[str, Any]]],
          cutoffs: Sequence[int] = CUTOFFS) -> dict[str, Any]:
    """Metrics and per-question results for `hits` (each question's ranked hits, with source and page)."""
    results = []
    for q, found in zip(questions, hits):
        doc_rank = next((i for i, h in enumerate(found, 1) if same_doc(h["source"], q.source)), None)
        page_rank = next((i for i, h in enumerate(found, 1)
                          if same_doc(h["source"], q.source) and h["page"] in q.pages), None) if q.pages else None
        results.append({**asdict(q), "pages": list(q.pages), "doc_rank": doc_rank, "page_rank": page_rank,
                        "hits": [{"source": h["source"], "page": h["page"], "score": h["score"]} for h in found]})
    paged = [r for r in results if r["pages"]]
    metrics: dict[str, float | None] = {}
    for k in cutoffs:
        metrics[f"doc-hit@{k}"] = _rate(results, lambda r: r["doc_rank"] is not None and r["doc_rank"] <= k)
        metrics[f"page-hit@{k}"] = _rate(paged, lambda r: r["page_rank"] is not None and r["page_rank"] <= k)
    metrics[f"MRR@{MRR_AT}"] = (sum(1 / r["page_rank"] for r in paged if r["page_rank"] and r["page_rank"] <= MRR_AT)
                                / len(paged)) if paged else None
    return {"questions": len(results), "with_pages": len(paged), "metrics": metrics, "results": results}


def _rate(results: list[dict[str, Any]], hit) -> float | None:
    return sum(map(hit, results)) / len(results) if results else None


def is_miss(r: dict[str, Any]) -> bool:
    rank = r["page_rank"] if r["pages"] else r["doc_rank"]
    return rank is None or rank > MISS_AT


def evaluate(uri: str, collection: str, path: Path, mode: str, k: int = 10,
             model: str | None = None, doc_rank: bool = True, hide_names: bool = False,
             cards: bool = True, terms: bool = True, statements: bool = True) -> tuple[dict[str, Any], str]:
    """(score() of the collection's answers to the questions in `path`, with `missing_sources`: the
    questions' sources no chunk of the collection comes from; the lines to say on stderr: the search's note,
    a warning naming those sources, or ""); metrics at 5, 10 and k. `cards` False ranks by file names alone
    (measurements: what the cards add), `terms` False leaves out the term ranking, `statements` False the
    statement ranking. With `hide_names` the collection holds
    the documents under their hidden_name, and each question's source is mapped to it."""
    questions = load_questions(path)
    if hide_names:
        questions = [Question(q.question, hidden_name(q.source), q.pages) for q in questions]
    cutoffs = sorted({*CUTOFFS, k})
    with Searcher(uri, collection, model) as s:
        used, note = s.mode(mode)
        hits = s.search([q.question for q in questions], max(cutoffs), used, doc_rank, cards, terms, statements)
        result = score(questions, hits, cutoffs)
        missing = s.missing(r["source"] for r in result["results"] if r["doc_rank"] is None)
    warning = ""
    if missing:
        named = ", ".join(missing[:MISSING_SHOWN]) + (f" and {len(missing) - MISSING_SHOWN} more (--json lists "
                                                       "them)" if len(missing) > MISSING_SHOWN else "")
        warning = (f"warning: {len(missing)} source(s) of the questions are not in collection {collection!r}, so "
                   f"their questions count as misses; check their names or ingest them: {named}")
    return {"mode": used, **result, "missing_sources": missing}, "\n".join(filter(None, (note, warning)))


def report(result: dict[str, Any], shown: int = MISS_AT) -> str:
    """The plain-text report: the metrics, then each miss with the top hits that came instead."""
    n, paged = result["questions"], result["with_pages"]
    lines = [f"{n} questions, mode {result['mode']}; page metrics and MRR over the {paged} that name pages"
             if paged < n else f"{n} questions, mode {result['mode']}"]
    for name, value in result["metrics"].items():
        lines.append(f"{name:<12} {'-' if value is None else f'{value:.3f}'}")
    misses = [r for r in result["results"] if is_miss(r)]
    lines.append(f"misses (no page hit in the top {MISS_AT}; no doc hit for questions without pages): {len(misses)}")
    for r in misses:
        question = " ".join(r["question"].split())
        pages = f" p.{','.join(map(str, r['pages']))}" if r["pages"] else ""
        got = ", ".join(f"{h['source']} p.{h['page'] or '-'}" for h in r["hits"][:shown]) or "no hits"
        lines += [f"- {question[:160]}{'...' if len(question) > 160 else ''}",
                  f"    expected {r['source']}{pages}", f"    got      {got}"]
    return "\n".join(lines)


def compare(result: dict[str, Any], path: Path) -> dict[str, Any]:
    """The changes from the earlier result in `path` (its `ingest eval --json`) to `result`: each metric's
    (then, now), and the questions whose rank changed (`wins`: moved up, `losses`: moved down, each with
    question, source, then, now: None for a miss), `new` and `gone` (questions in only one of the two)."""
    try:
        other = json.loads(path.read_text(encoding="utf-8"))
        then = {_key(r): _rank(r) for r in other["results"]}
        metrics = other["metrics"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise EvalError(f"cannot compare with {path}: {exc}; pass the output of an earlier `ingest eval --json`") from None
    now = {_key(r): _rank(r) for r in result["results"]}
    moved = [{"question": q, "source": src, "then": then[(q, src)], "now": rank}
             for (q, src), rank in now.items() if (q, src) in then and rank != then[(q, src)]]
    better = lambda m: (m["now"] or MISSED) < (m["then"] or MISSED)  # noqa: E731
    return {"against": str(path), "mode": other.get("mode"),
            "metrics": {name: [metrics.get(name), value] for name, value in result["metrics"].items()},
            "wins": [m for m in moved if better(m)], "losses": [m for m in moved if not better(m)],
            "new": sorted(q for q, _ in now.keys() - then.keys()), "gone": sorted(q for q, _ in then.keys() - now.keys())}


MISSED = 10 ** 9          # a miss ranks below every hit


def _key(r: dict[str, Any]) -> tuple[str, str]:
    return r["question"], r["source"]


def _rank(r: dict[str, Any]) -> int | None:
    return r["page_rank"] if r["pages"] else r["doc_rank"]


def compare_report(change: dict[str, Any]) -> str:
    """The plain-text lines of `compare`: metrics then -> now, then each win and loss with its ranks."""
    lines = [f"compared with {change['against']} (mode {change['mode']}):"]
    for name, (then, now) in change["metrics"].items():
        show = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        delta = f" ({now - then:+.3f})" if then is not None and now is not None else ""
        lines.append(f"{name:<12} {show(then)} -> {show(now)}{delta}")
    rank = lambda v: "miss" if v is None else str(v)  # noqa: E731
    for title, moved in (("wins", change["wins"]), ("losses", change["losses"])):
        lines.append(f"{title}: {len(moved)}")
        lines += [f"  {rank(m['then']):>4} -> {rank(m['now']):<4} {' '.join(m['question'].split())[:140]}" for m in moved]
    for title in ("new", "gone"):
        if change[title]:
            lines.append(f"{title} (in only one of the two): {len(change[title])}")
    return "\n".join(lines)
