"""Issue 41: within the named document, the page is found by the question's rare words in a chunk's text and
headings (ingest/term_match.py); and a card that names its organisation keeps of the file name only what the
name says beyond it (issue 46), so a renamed copy embeds the same text."""
from __future__ import annotations

from ingest.doc_card import make_card
from ingest.doc_rank import rerank
from ingest.sections import context_line
from ingest.term_match import HEADINGS, TEXT, query_terms, stem, term_scores


def test_query_terms_are_the_rare_words_stemmed() -> None:
    assert stem("dividends") == "dividend" and stem("liabilities") == "liability" and stem("gas") == "gas"
    assert query_terms("What was the FY2022 dividend paid per share in 2022? Round to 2.5 places.") \
        == ["dividend", "paid", "share", "place"]
    assert query_terms("What is it?") == []


def test_term_scores_weigh_rare_words_in_text_and_headings() -> None:
    hits = [{"text": "Revenue grew. Dividends paid to shareholders were 2 million.", "headings": "Notes"},
            {"text": "Revenue grew; dividends rose.", "headings": "Cash flow statement > Dividends"},
            {"text": "Revenue grew again.", "headings": "Results of operations"}]
    got = term_scores("How much did the company pay in dividends, against its revenue?", hits)
    assert got[2] == 0.0 and 0 < got[0] <= TEXT and 0 < got[1] <= TEXT + HEADINGS
    assert got[1] > got[0]                                       # in its text and in its headings
    assert term_scores("What is it?", hits) == [0.0, 0.0, 0.0]    # no terms: nothing gained


def test_rerank_finds_the_page_within_the_named_document() -> None:
    hits = [{"source": "scan_1.pdf", "page": p, "score": 0.60 - p * 0.002, "text": text, "headings": head}
            for p, (text, head) in enumerate([("Our business and strategy.", "Business"),
                                              ("Risks of our business.", "Risk factors"),
                                              ("Purchases of property and equipment 120", "Cash flow statement")])]
    assert rerank("What are the risks of the business?", hits, 3, terms=False) == hits
    assert rerank("What was capex in the cash flow statement?", hits, 3)[0]["page"] == 2
    assert rerank("What was capex in the cash flow statement?", hits, 3, terms=False, statements=False)[0]["page"] == 0


def test_a_meaningful_file_name_stays_beside_the_card_a_meaningless_one_is_left_out() -> None:
    card = make_card(["ACME WIDGETS INC.\n(Exact name of registrant as specified in its charter)\nANNUAL REPORT "
                      "PURSUANT TO SECTION 13 OF THE SECURITIES EXCHANGE ACT OF 1934\nFor the fiscal year ended "
                      "December 31, 2021\nForm 10-K"])
    assert card.orgs and card.label()
    shown = context_line("ACME_2021_10K.pdf", "Annual report", ("Item 7",), card.label(), named=True)
    assert shown == f"{card.label()} > Annual report > Item 7"        # the name says nothing the card does not
    extra = context_line("ACME_board_pack_2021_10K.pdf", "Annual report", ("Item 7",), card.label(), named=True)
    assert extra == f"board pack > {card.label()} > Annual report > Item 7"      # what it says beyond the card
    for meaningless in ("scan_0012.pdf", "3f2a9c0e1b7d4e55.pdf", "IMG_20190512_1234.pdf"):
        hidden = context_line(meaningless, "Annual report", ("Item 7",), card.label(), named=True)
        assert hidden == f"{card.label()} > Annual report > Item 7"                 # the card stands alone
    assert context_line("scan_0012.pdf", "T", (), "annual report FY2021").startswith("scan 0012 > ")   # no org
    assert context_line("ACME_2021_10K.pdf", "T", (), "annual report FY2021").startswith("ACME 2021 10K > ")
