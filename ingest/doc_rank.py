"""Document-aware ranking: a question that names its document (company, year, form: "3M's FY2018 10-K ...")
favours the chunks of the documents whose cards (who, what kind, when: read from their own text,
ingest/doc_card.py, matched by ingest/card_match.py) or names say the same.

NOTE (what is matched, and why it never filters):
- A document's name parts are the words of its file name's stem, lowercased ("AMERICANEXPRESS_2022_10K"
  -> americanexpress, 2022, 10k), each with its pieces at case and letter/digit changes ("2022Q2" ->
  2022, q2; "JPMorgan" -> jp, morgan).
- A part is named by a question that has it as a word, or (4 characters or more, or 3 mixing letters and
  digits) has it inside the question squashed to letters and digits ("American Express'" names
  "americanexpress", "FY2019" names 2019, "10-K" names 10k), or names each of its two or more pieces so
  ("Q2 2022" names 2022q2).
- A document's match is the share of its name's weight that the question names, a part weighing its
  inverse document frequency among the candidates' documents: a part every candidate shares ("10k")
  tells none of them apart and weighs nothing.
- A document's match is the better of its card's (ingest/card_match.py: organisation, kind, period) and its
  name's, so a file named "scan_0012.pdf" is found by what it says, and one without a card (stored before
  cards) by its name.
- The dense candidates (CANDIDATES, however small k) are reranked by score + WEIGHT x match, plus (unless
  `terms` is False) what the question's rare words in a chunk's text and headings add (ingest/term_match.py):
  the document is named by its card or name, the page within it by its words. A question that names nothing
  and has no terms adds 0 everywhere and keeps the dense order; a named document is favoured, never the only
  one allowed.
"""
from __future__ import annotations

import math
import re
from pathlib import PurePosixPath
from typing import Any, Mapping, Sequence

from ingest.card_match import card_matches
from ingest.doc_card import Card
from ingest.statement_match import statement_scores
from ingest.term_match import term_scores

CANDIDATES = 100      # dense hits reranked (at least k)
WEIGHT = 0.1          # a full name match is worth this much cosine similarity

_WORD = re.compile(r"[^\W_]+")
_PIECE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+|[^\W\d_A-Za-z]+")   # case and letter/digit changes


def name_parts(source: str) -> dict[str, tuple[str, ...]]:
    """The words of a source's file name (its stem), lowercased, each with its pieces (of 2 characters or
    more; a letter piece followed by digits joins them: "Q2"): {"2022q2": ("2022", "q2"), "amex": ()}."""
    stem = PurePosixPath(source.replace("\\", "/")).stem
    parts: dict[str, tuple[str, ...]] = {}
    for word in _WORD.findall(stem):
        pieces = _PIECE.findall(word)
        joined = [a + b for a, b in zip(pieces, pieces[1:]) if a.isalpha() and b.isdigit()]
        kept = tuple(dict.fromkeys(p.lower() for p in pieces + joined if len(p) > 1 and not (
            p.isalpha() and any(j.startswith(p) for j in joined))))
        if len(word) > 1:
            parts.setdefault(word.lower(), kept if len(pieces) > 1 else ())
    return parts


def named(query: str, parts: dict[str, tuple[str, ...]]) -> set[str]:
    """The words of a file name that `query` names: as a word of it, squashed into it (4 characters or more,
    or 3 of letters and digits: "American Express" names "americanexpress", "10-Q" names "10q"), or every
    piece of the word so (see NOTE)."""
    words = {w.lower() for w in _WORD.findall(query)}
    squashed = "".join(w.lower() for w in _WORD.findall(query))
    def says(p: str) -> bool:
        return p in words or ((len(p) >= 4 or (len(p) == 3 and not p.isalpha() and not p.isdigit())) and p in squashed)

    return {w for w, pieces in parts.items() if says(w) or (len(pieces) > 1 and all(says(p) for p in pieces))}


def rerank(query: str, hits: Sequence[dict[str, Any]], k: int,
           cards: Mapping[str, Card] | None = None, terms: bool = True, statements: bool = True) -> list[dict[str, Any]]:
    """The k best of `hits` (dense, best first) by score + WEIGHT x the better of their document's card match
    (`cards` by source) and the named share of its name, + their term score unless `terms` is False, + their
    statement score unless `statements` is False; each hit's `score` stays the dense one."""
    names = {h["source"]: name_parts(h["source"]) for h in hits}
    docs = len(names)
    counts: dict[str, int] = {}
    for parts in names.values():
        for p in parts:
            counts[p] = counts.get(p, 0) + 1
    weight = {p: math.log((docs + 1) / c) for p, c in counts.items()}
    share = {}
    for source, parts in names.items():
        total = sum(weight[p] for p in parts)
        share[source] = sum(weight[p] for p in named(query, parts)) / total if total else 0.0
    if cards:
        by_card = card_matches(query, {s: cards[s] for s in names if s in cards})
        share = {s: max(v, by_card.get(s, 0.0)) for s, v in share.items()}
    gain = term_scores(query, hits) if terms else [0.0] * len(hits)
    if statements:
        gain = [g + s for g, s in zip(gain, statement_scores(query, hits))]
    ranked = sorted(range(len(hits)), key=lambda i: -(hits[i]["score"] + WEIGHT * share[hits[i]["source"]] + gain[i]))
    return [hits[i] for i in ranked[:k]]
