"""Issue 46 item 1: which file names carry meaning (ingest/names.py), and the card's kinds a name used to give."""
from __future__ import annotations

import pytest

from ingest.doc_card import make_card
from ingest.names import beside, meaningful

MEANINGFUL = ["ACME_2019Q2_10Q", "AMD_2015_10K", "ACME_2019_8K_dated-2019-04-25", "budget 2024", "Lebenslauf",
              "10-K", "Q2", "FY2021 results", "notes/Lecture3", "AnnualReport", "report_final_v2", "2019",
              "中文报告", "Rapport annuel 2022", "cafe menu"]
MEANINGLESS = ["scan_0001", "scan_12345678", "IMG_20190512_1234", "DSC_0042", "PXL_20230101_123456789",
               "3f2a9c0e1b7d4e55", "a1b2c3d4-e5f6-4789-abcd-ef0123456789", "Document1", "untitled",
               "0001047469-19-000123", "Scan 2024-03-01", "Screenshot 2024-05-01 at 10.22.31",
               "WhatsApp Image 2023-01-02 at 12.00.01", "Xk3mQp9Zr"]


@pytest.mark.parametrize("name", MEANINGFUL)
def test_a_name_with_words_a_year_a_quarter_or_a_form_carries_meaning(name: str) -> None:
    assert meaningful(name)


@pytest.mark.parametrize("name", MEANINGLESS)
def test_a_device_stamp_a_hash_or_a_stock_word_carries_none(name: str) -> None:
    assert not meaningful(name)


def test_the_card_says_a_current_report_and_its_date() -> None:
    card = make_card(["UNITED STATES SECURITIES AND EXCHANGE COMMISSION\nFORM 8-K\nCURRENT REPORT\nPursuant to "
                      "Section 13 or 15(d) of the Securities Exchange Act of 1934\nDate of Report (Date of earliest "
                      "event reported): April 25, 2019\nACME WIDGETS INC.\n(Exact name of registrant as specified "
                      "in its charter)\nItem 2.02 Results of Operations and Financial Condition. On April 25, 2019 "
                      "the Company issued a press release announcing its results for the quarter ended March 31, 2019."])
    assert card.kind == "current report" and card.date == "2019-04-25", card
    assert "current report" in card.label() and "2019-04-25" in card.label()


def test_a_quarterly_report_and_an_earnings_release_keep_their_kind_and_quarter() -> None:
    q = make_card(["FORM 10-Q\nQUARTERLY REPORT PURSUANT TO SECTION 13 OR 15(d)\nFor the quarterly period ended "
                   "June 30, 2022\nACME WIDGETS INC."])
    assert (q.kind, q.year, q.quarter) == ("quarterly report", 2022, 2)
    e = make_card(["ACME WIDGETS INC. REPORTS SECOND QUARTER 2022 RESULTS\nPress release\nFor the quarter ended "
                   "June 30, 2022, revenue rose 8%."])
    assert (e.kind, e.year, e.quarter) == ("earnings release", 2022, 2)


@pytest.mark.parametrize("name, card, kept", [
    ("AMERICANWATERWORKS 2020 10K", "American Water Works Company, Inc. (AWK) annual report FY2020", ""),
    ("COCACOLA 2017 10K", "The Coca-Cola Company (KO) annual report FY2017", ""),
    ("JPMORGAN 2022Q2 10Q", "JPMorgan Chase & Co. (JPM) quarterly report Q2 2022", ""),
    ("ACME 2019 8K dated-2019-04-25", "Acme Inc. (ACME) current report 2019-04-25", ""),
    ("ACME 2019 8K dated-2019-04-25", "Acme Inc. (ACME) earnings release", "2019 8K dated"),
    ("ACME_board_minutes_2021", "Acme Inc. (ACME)", "board minutes 2021"),
    ("board/Lebenslauf Maria Schmidt", "Acme Inc. (ACME)", "board Lebenslauf Maria Schmidt"),
    ("scan 12345678", "Acme Inc. (ACME) annual report FY2020", ""),
    ("a1b2c3d4-e5f6-4789-abcd-ef0123456789", "Acme Inc. (ACME)", "")])
def test_beside_the_card_a_name_keeps_only_what_the_card_does_not_say(name: str, card: str, kept: str) -> None:
    assert beside(name, card) == kept


def test_a_question_on_a_dated_8k_meets_the_current_report_not_the_10q_of_its_year() -> None:
    from ingest.card_match import card_matches
    from ingest.doc_card import Card
    cards = {"a.pdf": Card(orgs=("Acme Widgets Inc.",), short=("ACME",), kind="current report", date="2019-04-25"),
             "b.pdf": Card(orgs=("Acme Widgets Inc.",), short=("ACME",), kind="quarterly report", year=2019, quarter=1),
             "c.pdf": Card(orgs=("Acme Widgets Inc.",), short=("ACME",), kind="annual report", year=2019)}
    m = card_matches("What did ACME's 8-K of April 2019 say about its revenue?", cards)
    assert m["a.pdf"] > m["b.pdf"] and m["a.pdf"] > m["c.pdf"]
