"""Issue 33, item 1: a question that names its document (company, year, form) finds that document's chunk
first, when the file names are the only clue; a question that names nothing keeps the dense order."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ingest, run
from ingest.doc_rank import name_parts, named, rerank

COMPANIES = ["ACME", "GLOBEX", "INITECH"]
BODY = ("Liquidity and capital resources. Capital expenditures for the year were {} million dollars, mostly for "
        "new plants and equipment, compared with {} million dollars in the prior year.")


def test_name_parts_and_what_a_question_names() -> None:
    assert name_parts("AMERICANEXPRESS_2022_10K.pdf") == {"americanexpress": (), "2022": (), "10k": ("10",)}
    assert name_parts("dir/JPMorgan-Chase 2022Q2.pdf") == {"jpmorgan": ("jp", "morgan"), "chase": (),
                                                          "2022q2": ("2022", "q2")}
    assert named("What was JPMorgan's net income in Q2 2022 (10-Q)?", name_parts("JPMORGAN_2022Q2_10Q.pdf")) \
        == {"jpmorgan", "2022q2", "10q"}
    assert named("Which debt is listed under American Express' name as of 2022?",
                 name_parts("AMERICANEXPRESS_2022_10K.pdf")) == {"americanexpress", "2022"}
    assert named("3M's FY2018 capex", name_parts("3M_2018_10K.pdf")) == {"3m", "2018"}
    assert named("ten percent of revenue", name_parts("3M_2018_10K.pdf")) == set()


def test_rerank_favours_the_named_document_and_never_drops_a_hit() -> None:
    hits = [{"source": f"{c}_{y}_10K.pdf", "score": 0.70 - i * 0.01}
            for i, (c, y) in enumerate((c, y) for c in COMPANIES for y in (2019, 2020))]
    assert rerank("capital expenditures", hits, 6) == hits                     # names nothing: dense order
    ranked = rerank("Initech FY2020 capital expenditures", hits, 6)
    assert ranked[0]["source"] == "INITECH_2020_10K.pdf" and sorted(map(id, ranked)) == sorted(map(id, hits))
    assert rerank("Initech FY2020 capital expenditures", hits, 2)[0] is ranked[0] and len(ranked) == 6


@pytest.mark.slow
def test_named_document_ranks_first_end_to_end(work: Path) -> None:
    docs = work / "filings"
    docs.mkdir()
    for i, company in enumerate(COMPANIES):
        for year in (2019, 2020):
            (docs / f"{company}_{year}_10K.txt").write_text(BODY.format(100 + 7 * i + year % 10, 90 + i))
    res = run(docs, work)
    assert res.rc == 0, res.stderr
    store = ("--store", str(work / "store.db"))
    for company in COMPANIES:
        for year in (2019, 2020):
            question = f"What were {company.title()}'s capital expenditures in fiscal {year}?"
            out = ingest("search", question, "-k", "3", "--json", *store, cwd=work)
            assert out.rc == 0, out.stderr
            assert json.loads(out.stdout)[0]["source"] == f"{company}_{year}_10K.txt", question
    plain = ingest("search", "capital expenditures for new plants", "-k", "6", "--json", *store, cwd=work)
    ranked = ingest("search", "capital expenditures for new plants", "-k", "6", "--json", "--no-doc-rank", *store,
                    cwd=work)
    assert plain.rc == ranked.rc == 0
    assert [h["source"] for h in json.loads(plain.stdout)] == [h["source"] for h in json.loads(ranked.stdout)]
