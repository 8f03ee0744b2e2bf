"""Statement ranking within the candidates (issue 46 item 2): a question that names a financial statement, or a
measure one of them holds, favours the chunks of that statement's table over pages that only mention its words.

NOTE (what counts):
- A question names a statement by its title's words ("cash flow statement", "balance sheet", "income
  statement", "statement of financial position") or by a measure it holds (capital expenditure, COGS,
  inventory, revenue: CUES). A question may name several ("revenue / average PP&E": income and balance).
- A chunk holds a statement when its heading path carries that statement's title: the structure step puts a
  table's statement title ("Consolidated Statements of Cash Flows") into the path of the table and of the
  tables that continue it (ingest/sections.py). Prose about cash flows sits under other headings.
- Such a chunk gains STATEMENT of cosine similarity, once, however many statements the question names. A
  question that names none, or a collection without statement titles, keeps its order.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

STATEMENT = 0.05      # cosine similarity a chunk of a named statement gains

_STATEMENTS = (        # (what a question says, what the statement's title says)
    (r"cash[- ]flows?|\bcapex\b|capital expenditures?|purchases? of property|\b(?:operating|investing|financing) "
     r"activities|dividends? paid|repurchases? of (?:common )?stock|depreciation and amortization",
     r"cash\s+flows?"),
    (r"income statements?|statements? of (?:income|operations|earnings)|\bp&l\b|profit and loss|\brevenues?\b|"
     r"net sales|cost of (?:goods sold|sales|revenues?)|\bcogs\b|gross (?:profit|margin)|operating (?:income|margin|"
     r"profit)|net (?:income|earnings)|\bebitda?\b|earnings per share|\beps\b|interest expense",
     r"statements?\s+of\s+(?:consolidated\s+)?(?:comprehensive\s+)?(?:income|operations|earnings)|income\s+statements?"),
    (r"balance sheets?|financial (?:position|condition)|total assets|current (?:assets|liabilities)|inventor(?:y|ies)|"
     r"receivables?|payables?|working capital|quick ratio|current ratio|pp&e|property,? plant|total debt|"
     r"long-term debt|(?:shareholders|stockholders)['’]? equity|cash and cash equivalents",
     r"balance\s+sheets?|statements?\s+of\s+(?:consolidated\s+)?financial\s+(?:position|condition)"),
)
_CUES = tuple((re.compile(cue, re.I), re.compile(title, re.I)) for cue, title in _STATEMENTS)


def named_statements(query: str) -> list[re.Pattern]:
    """The titles of the statements `query` names (NOTE)."""
    return [title for cue, title in _CUES if cue.search(query)]


def statement_scores(query: str, hits: Sequence[dict[str, Any]]) -> list[float]:
    """What each hit gains: STATEMENT when its heading path carries the title of a statement the question names."""
    titles = named_statements(query)
    if not titles:
        return [0.0] * len(hits)
    return [STATEMENT if any(t.search(h.get("headings", "")) for t in titles) else 0.0 for h in hits]
