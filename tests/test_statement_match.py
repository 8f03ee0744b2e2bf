"""Issue 46 item 2: a question that names a financial statement, or a measure one holds, favours the chunks of that
statement's table (ingest/statement_match.py) over prose with the same words."""
from __future__ import annotations

from ingest.doc_rank import rerank
from ingest.statement_match import STATEMENT, named_statements, statement_scores

HITS = [{"source": "acme.pdf", "page": 40, "score": 0.62, "text": "Capital expenditures rose as we invested in plants "
         "and in cash flows from operations.", "headings": "Item 7 > Liquidity and capital resources"},
        {"source": "acme.pdf", "page": 71, "score": 0.60, "text": "Purchases of property, plant and equipment | (120)",
         "headings": "Financial statements > Consolidated Statements of Cash Flows"},
        {"source": "acme.pdf", "page": 69, "score": 0.59, "text": "Revenue | 1,200 | Cost of sales | (700)",
         "headings": "Financial statements > Consolidated Statements of Operations"},
        {"source": "acme.pdf", "page": 70, "score": 0.58, "text": "Inventories | 300 | Total assets | 5,000",
         "headings": "Financial statements > Consolidated Balance Sheets"}]


def test_questions_name_statements_by_title_or_by_a_measure() -> None:
    assert len(named_statements("What was capex as shown in the cash flow statement?")) == 1
    assert len(named_statements("Revenue over average PP&E (the statement of income and of financial position)")) == 2
    assert len(named_statements("What is the days payable outstanding, using COGS?")) == 2      # payables, COGS
    assert named_statements("Who is the chief executive officer?") == []


def test_the_named_statements_table_outranks_prose_with_its_words() -> None:
    assert statement_scores("What was the capital expenditure in FY2021?", HITS) == [0.0, STATEMENT, 0.0, 0.0]
    top = rerank("What was the capital expenditure in FY2021?", HITS, 4, terms=False)
    assert top[0]["page"] == 71
    ratio = rerank("What is the inventory turnover (COGS over average inventories)?", HITS, 4, terms=False)
    assert {h["page"] for h in ratio[:2]} == {69, 70}
    assert rerank("Who leads the company?", HITS, 4, terms=False) == HITS             # names none: order kept
    assert rerank("What was the capital expenditure?", HITS, 4, terms=False, statements=False) == HITS
