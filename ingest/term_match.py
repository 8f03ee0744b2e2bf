"""Term ranking within the candidates (issue 41): which of the dense candidates contain the question's rare words,
in their text and in their heading path. It finds the page inside the named document: "the cash flow statement",
"capital expenditure", "dividends" are words that page has and its neighbours in embedding space may lack.

NOTE (what counts, and why it is bounded):
- A question's terms are its words, lowercased and crudely stemmed ("dividends" -> "dividend"), less the
  function words and the words every question uses to ask (STOP: "what", "fiscal", "calculate", "round" ...)
  and words with digits (years, amounts, "FY2022": the card ranking reads periods, ingest/card_match.py).
- A term weighs its inverse document frequency among the candidates (a word in most of them tells none apart)
  and a chunk's match is the share of the question's weight found in its text and that found in its
  headings: each between 0 and 1, so a chunk can gain at most TEXT + HEADINGS of cosine similarity. A
  question of function words only adds 0 everywhere and keeps the dense order.
- The stems and STOP words are English; a word of another language still counts, matched as it is spelt.
"""
from __future__ import annotations

import math
import re
from typing import Any, Sequence

TEXT = 0.1            # a chunk whose text holds every term of the question gains this much cosine similarity
HEADINGS = 0.1        # ... and this much again when its heading path holds them all

STOP = frozenset("""
a an the of in on at to for by with from and or as is are was were be been being has have had do does did what
which who whom whose when where why how that this these those it its their there than then if into about over
under between based much many any all each per vs versus also not no yes can could would should will shall may
might we our you your i me my he she they them his her company fy fiscal year years quarter define
defined using use used calculate answer question following round
""".split())
_WORD = re.compile(r"[^\W_]+(?:\.\d+)?")
_SUFFIXES = (("ies", "y"), ("sses", "ss"), ("ss", "ss"), ("us", "us"), ("is", "is"), ("s", ""), ("ing", ""),
             ("ed", ""))


def stem(word: str) -> str:
    """A crude stem: a plural's or a participle's ending cut from a word of more than 3 letters left
    ("dividends" -> "dividend", "liabilities" -> "liability", "operating" -> "operat"; "loss" stays)."""
    for suffix, kept in _SUFFIXES:
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[:-len(suffix)] + kept
    return word


def words(text: str) -> set[str]:
    """A text's words, lowercased."""
    return set(_WORD.findall(text.lower()))


def forms(term: str) -> tuple[str, ...]:
    """The words whose stem is `term` ("dividend" <- dividend, dividends; "liability" <- liabilities): a text
    is matched by looking its words up, not by stemming them all."""
    made = (term, term + "s", term + "es", term + "ing", term + "ed", term[:-1] + "ies" if term.endswith("y") else term)
    return tuple(dict.fromkeys(f for f in made if stem(f) == term))


def query_terms(query: str) -> list[str]:
    """The terms of a question: its words' stems less STOP words, single letters and words with digits (years,
    amounts, "FY2022", "Q3": the card ranking reads periods), in order."""
    return list(dict.fromkeys(stem(w) for w in _WORD.findall(query.lower())
                              if w not in STOP and len(w) > 1 and not any(c.isdigit() for c in w)))


def term_scores(query: str, hits: Sequence[dict[str, Any]]) -> list[float]:
    """What each hit gains by the question's terms: TEXT x their weighted share in its text + HEADINGS x that
    in its heading path (see NOTE); 0 for all when the question has no terms."""
    terms = query_terms(query)
    if not terms or not hits:
        return [0.0] * len(hits)
    spelt = {t: forms(t) for t in terms}
    texts = [{t for t in terms if not words_of.isdisjoint(spelt[t])} for words_of in
             (words(h.get("text", "")) for h in hits)]
    heads = [{t for t in terms if not words_of.isdisjoint(spelt[t])} for words_of in
             (words(h.get("headings", "")) for h in hits)]
    n = len(hits)
    weight = {t: math.log((n + 1) / (1 + sum(t in a or t in b for a, b in zip(texts, heads)))) for t in terms}
    total = sum(weight.values())
    if total <= 0:
        return [0.0] * n
    return [(TEXT * sum(weight[t] for t in a) + HEADINGS * sum(weight[t] for t in b)) / total
            for a, b in zip(texts, heads)]
