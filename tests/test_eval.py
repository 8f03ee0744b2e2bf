"""Issue 21, item 6: `ingest eval QUESTIONS.jsonl` (doc-hit@k, page-hit@k, MRR@10, the misses, --json)
on a tiny store whose answers are known, and the metrics themselves on hand-made rankings."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import ingest
from ingest.evaluate import Question, score
from test_search_modes import PART, TARGET, TEXTS, build, vectors  # noqa: F401  (vectors: the fixture)

QUESTIONS = [
    {"question": PART, "source": "catalog.pdf", "pages": [TARGET + 1]},           # page hit at 1 (a path's tail)
    {"question": "lighthouse keeper lamp", "source": "docs/catalog.pdf", "pages": [10]},   # page hit at 1
    {"question": "revenue fiscal 2019", "source": "catalog.pdf", "pages": [1]},   # doc hit, page miss
    {"question": "lighthouse", "source": "other.pdf"},                            # no pages: doc miss
    {"question": "revenue", "source": "talog.pdf"},                               # a name's tail is not a path's
]


def test_metrics_on_known_rankings() -> None:
    def hit(source: str, page: int | None) -> dict:
        return {"source": source, "page": page, "score": 0.5}

    questions = [Question("a", "x.pdf", (3,)), Question("b", "x.pdf", (3, 4)), Question("c", "x.pdf", ()),
                 Question("d", "x.pdf", (1,))]
    hits = [[hit("dir/x.pdf", 3)],                                            # page hit at 1
            [hit("y.pdf", 4)] * 6 + [hit("x.pdf", 5), hit("x.pdf", 4)],      # doc at 7, page at 8
            [hit("y.pdf", None), hit("x.pdf", None)],                         # doc at 2, no pages asked
            [hit("ax.pdf", 1)] * 10]                                          # no hit: ax.pdf is not x.pdf
    result = score(questions, hits)
    assert result["questions"] == 4 and result["with_pages"] == 3
    assert result["metrics"] == pytest.approx({"doc-hit@5": 2 / 4, "page-hit@5": 1 / 3, "doc-hit@10": 3 / 4,
                                               "page-hit@10": 2 / 3, "MRR@10": (1 + 1 / 8) / 3})
    assert [(r["doc_rank"], r["page_rank"]) for r in result["results"]] == [(1, 1), (7, 8), (2, None), (None, None)]


def _built(work: Path, vectors: np.ndarray) -> tuple[Path, tuple[str, str]]:
    """(the questions file, the --store arguments) of the tiny store of test_search_modes (blank lines end it)."""
    build(str(work / "store.db"), "documents", vectors)
    questions = work / "questions.jsonl"
    questions.write_text("\n".join(map(json.dumps, QUESTIONS)) + "\n\n")
    return questions, ("--store", str(work / "store.db"))


def test_eval_command(work: Path, vectors: np.ndarray) -> None:  # noqa: F811
    questions, store = _built(work, vectors)

    res = ingest("eval", str(questions), "--mode", "bm25", "--json", *store, cwd=work)
    assert res.rc == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["mode"] == "bm25" and out["questions"] == 5 and out["with_pages"] == 3
    assert out["metrics"] == pytest.approx({"doc-hit@5": 3 / 5, "page-hit@5": 2 / 3, "doc-hit@10": 3 / 5,
                                            "page-hit@10": 2 / 3, "MRR@10": 2 / 3})
    assert [(r["doc_rank"], r["page_rank"]) for r in out["results"]] == [(1, 1), (1, 1), (1, None), (None, None),
                                                                           (None, None)]
    assert out["results"][0]["hits"][0] == {"source": "docs/catalog.pdf", "page": TARGET + 1,
                                            "score": out["results"][0]["hits"][0]["score"]}

    plain = ingest("eval", str(questions), "--mode", "bm25", *store, cwd=work)
    assert plain.rc == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert "page metrics and MRR over the 3 that name pages" in lines[0]
    assert lines[1:6] == ["doc-hit@5    0.600", "page-hit@5   0.667", "doc-hit@10   0.600", "page-hit@10  0.667",
                          "MRR@10       0.667"]
    assert lines[6].startswith("misses") and lines[6].endswith(": 3")
    assert lines[7:10] == ["- revenue fiscal 2019", "    expected catalog.pdf p.1",
                           f"    got      docs/catalog.pdf p.{TEXTS.index(next(t for t in TEXTS if 'Revenue' in t)) + 1}"]

    default = ingest("eval", str(questions), "-k", "3", "--json", "--mode", "hybrid", *store, cwd=work)  # embeds all at once
    assert default.rc == 0, default.stderr
    out = json.loads(default.stdout)
    assert out["mode"] == "hybrid" and set(out["metrics"]) == {"doc-hit@3", "page-hit@3", "doc-hit@5", "page-hit@5",
                                                               "doc-hit@10", "page-hit@10", "MRR@10"}
    assert out["results"][0]["page_rank"] == 1 and all(len(r["hits"]) == 10 for r in out["results"])


def test_bad_questions_file(work: Path) -> None:
    bad = work / "questions.jsonl"
    bad.write_text(json.dumps(QUESTIONS[0]) + "\n" + json.dumps({"question": "no source"}) + "\n")
    res = ingest("eval", str(bad), "--store", str(work / "store.db"), cwd=work)
    assert res.rc == 2 and res.stderr.count("\n") == 1
    assert "questions.jsonl, line 2: missing 'source'" in res.stderr


@pytest.mark.slow
def test_compare_shows_metric_and_rank_changes(work: Path, vectors: np.ndarray) -> None:  # noqa: F811
    """Issue 33, item 4: `--compare OTHER.json` shows each metric then -> now and each question that moved."""
    questions, store = _built(work, vectors)
    bm25 = ingest("eval", str(questions), "--mode", "bm25", "--json", *store, cwd=work)
    assert bm25.rc == 0, bm25.stderr
    earlier = json.loads(bm25.stdout)
    earlier["results"][0]["page_rank"] = 4                 # as if the first question had ranked 4th then
    earlier["results"][1]["page_rank"] = None              # and the second had missed
    earlier["results"][2]["doc_rank"] = 1                  # unchanged (it names pages: page_rank counts)
    earlier["metrics"]["MRR@10"] = 0.25
    earlier["results"].append({"question": "an old one", "source": "x.pdf", "pages": [], "doc_rank": 1, "page_rank": None})
    (work / "before.json").write_text(json.dumps(earlier))

    res = ingest("eval", str(questions), "--mode", "bm25", "--json", "--compare", "before.json", *store, cwd=work)
    assert res.rc == 0, res.stderr
    change = json.loads(res.stdout)["compare"]
    assert change["metrics"]["MRR@10"] == [0.25, pytest.approx(2 / 3)]
    assert [(m["source"], m["then"], m["now"]) for m in change["wins"]] == [("catalog.pdf", 4, 1),
                                                                            ("docs/catalog.pdf", None, 1)]
    assert change["losses"] == [] and change["gone"] == ["an old one"] and change["new"] == []

    plain = ingest("eval", str(questions), "--mode", "bm25", "--compare", "before.json", *store, cwd=work)
    lines = plain.stdout.splitlines()
    start = lines.index("compared with before.json (mode bm25):")
    assert "MRR@10       0.250 -> 0.667 (+0.417)" in lines[start:]
    assert lines[lines.index("wins: 2") + 1].split()[:3] == ["4", "->", "1"]
    assert lines[lines.index("wins: 2") + 2].split()[:3] == ["miss", "->", "1"]
    assert "losses: 0" in lines and "gone (in only one of the two): 1" in lines

    bad = ingest("eval", str(questions), "--compare", "questions.jsonl", *store, cwd=work)
    assert bad.rc == 2 and bad.stderr.count("\n") == 1 and "cannot compare with questions.jsonl" in bad.stderr
