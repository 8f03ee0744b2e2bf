"""Issue 41: a document's card (who, what kind, when) comes from its own content, not its file name; the
ranking matches a question against the cards; `ingest status --json` shows each file's card."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ingest, run
from docs import make_docx, make_pdf, make_pptx
from ingest.card_match import abbreviates, asked, card_matches
from ingest.doc_card import Card, make_card
from ingest.doc_rank import rerank

COVER = """UNITED STATES SECURITIES AND EXCHANGE COMMISSION
Washington, D.C. 20549
FORM 10-K
ANNUAL REPORT PURSUANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934
For the fiscal year ended September 30, 2021
Commission File Number 1-12345
GLOBEX INTERNATIONAL HOLDINGS, INC.
(Exact name of registrant as specified in its charter)
Delaware 12-3456789
Title of each class Trading Symbol(s) Name of each exchange on which registered
Common Stock, par value $0.01 per share GBX New York Stock Exchange"""
BUSINESS = ("PART I. Item 1. Business. In this report, the terms \"Globex,\" \"we,\" \"us\" and \"our\" mean Globex "
            "International Holdings, Inc. and its subsidiaries. Globex makes industrial pumps in 14 countries.")
PAPER = """Sparse Retrieval for Long Documents
Ana Lima, Department of Computer Science, University of Porto
Abstract
We study how documents describe themselves and how retrieval can use it.
1 Introduction
Dense retrieval of long documents loses the document's identity.
References
[1] A. Author. A paper. 2019."""
MEMO = ["MEMORANDUM", "To: All staff", "From: Facilities, Initrode Ltd.", "Date: March 3, 2023",
        "Subject: Parking during the works", "The north car park closes from Monday."]


@pytest.mark.slow
def test_cards_of_documents_with_meaningless_names(work: Path) -> None:
    docs = work / "docs"
    make_pdf(docs / "scan_0012.pdf", [COVER, BUSINESS])
    make_pptx(docs / "Q2.pptx", [{"title": "Initech Corporation: Third Quarter 2022 Results",
                                  "body": "Revenue grew 12% in the third quarter of fiscal 2022."},
                                 {"title": "Outlook", "body": "We expect growth to continue."}])
    make_pdf(docs / "report-final-v2.pdf", [PAPER])
    make_docx(docs / "document(3).docx", heading="", body_paragraphs=MEMO)
    (docs / "note.txt").write_text("\n".join(MEMO))
    res = run(docs, work, "--backend", "null")
    assert res.rc == 0, res.stderr
    out = ingest("status", "--store", str(work / "store.db"), "--json", cwd=work)
    assert out.rc == 0, out.stderr
    cards = {s: Card.from_json(json.dumps(c)) for s, c in json.loads(out.stdout)["cards"].items()}
    assert set(cards) == {"scan_0012.pdf", "Q2.pptx", "report-final-v2.pdf", "document(3).docx", "note.txt"}

    filing = cards["scan_0012.pdf"]
    assert filing.orgs[0] == "Globex International Holdings, Inc."
    assert "GBX" in filing.short and filing.kind == "annual report"
    assert (filing.year, filing.quarter, filing.date) == (2021, None, "2021-09-30")
    deck = cards["Q2.pptx"]
    assert deck.kind == "slides" and deck.orgs[0] == "Initech Corporation" and (deck.year, deck.quarter) == (2022, 3)
    paper = cards["report-final-v2.pdf"]
    assert paper.kind == "paper" and "University of Porto" in paper.orgs
    for source in ("document(3).docx", "note.txt"):
        memo = cards[source]
        assert memo.kind == "memo" and memo.orgs[0] == "Initrode Ltd." and memo.date == "2023-03-03", source


def test_a_question_meets_cards_by_short_forms_and_periods() -> None:
    assert abbreviates("AMEX", ["american", "express"]) and abbreviates("AMD", ["advanced", "micro", "devices"])
    assert abbreviates("JPM", ["jpmorgan", "chase"]) and not abbreviates("AMEX", ["american", "water", "works"])
    q = asked("What was the revenue in Q3 of FY2020?")
    assert (q.quarter, q.quarter_year) == (3, 2020)
    assert asked("the second fiscal quarter of 2023").quarter == 2 and asked("fiscal 2019 capex").years == (2019,)
    amex = Card(orgs=("American Express Company",), short=("AXP", "AE"), kind="annual report", year=2022)
    water = Card(orgs=("American Water Works Company, Inc.",), short=("AWK",), kind="annual report", year=2022)
    old = Card(orgs=("American Express Company",), short=("AXP",), kind="annual report", year=2021)
    q3 = Card(orgs=("American Express Company",), short=("AXP",), kind="quarterly report", year=2022, quarter=3)
    cards = {"a.pdf": amex, "b.pdf": water, "c.pdf": old, "d.pdf": q3}
    m = card_matches("Does AMEX have an improving operating margin as of 2022?", cards)
    assert m["a.pdf"] > m["c.pdf"] > m["b.pdf"] == 0.0
    m = card_matches("AXP's net interest income in the third quarter of 2022", cards)
    assert m["d.pdf"] > m["a.pdf"] > m["c.pdf"]
    m = card_matches("What is the latest annual dividend of American Express?", cards)
    assert m["a.pdf"] > m["c.pdf"] and m["b.pdf"] == 0.0
    assert card_matches("What drove operating margin?", cards) == dict.fromkeys(cards, 0.0)


def test_rerank_by_card_with_hidden_names() -> None:
    hits = [{"source": f"scan_{i:04d}.pdf", "score": 0.70 - i * 0.01} for i in range(4)]
    cards = {"scan_0000.pdf": Card(orgs=("Globex Inc.",), year=2020), "scan_0001.pdf": Card(orgs=("Globex Inc.",), year=2021),
             "scan_0002.pdf": Card(orgs=("Initech Corp.",), year=2021), "scan_0003.pdf": Card()}
    assert rerank("capital expenditures", hits, 4, cards) == hits              # names nothing: dense order
    assert rerank("Globex FY2021 capital expenditures", hits, 4, cards)[0]["source"] == "scan_0001.pdf"
    assert rerank("Initech's capex in 2021", hits, 4, cards)[0]["source"] == "scan_0002.pdf"


def test_card_from_text_alone() -> None:
    card = make_card(['Acme Widgets plc (the "Group") Interim report for the six months ended 30 June 2024. '
                      'Acme (LSE: ACW) ...'])
    assert card.orgs[0] == "Acme Widgets plc" and card.short[0] == "ACW" and card.kind == "quarterly report"
    assert card.date == "2024-06-30"
