"""How well a question's organisation, kind and period match a document's card (ingest/doc_card.py).

NOTE (what a question says, and how it meets a card):
- organisation: the share of the card's main organisation's distinctive words (its name less "the", "of",
  "&" and its legal suffix) the question names, as words or squashed ("American Express'" and
  "AmericanExpress" name american, express), each word weighed by how few of the candidates' organisations
  share it ("American" in two names counts less than "Express"); or 1 when it writes one of the card's short
  forms (a ticker or initials as a word in capitals: "AXP", "LM"; a defined name: "CVS Health"), or
  abbreviates the name: a word with two capitals or more ("AMEX", "JPM", "AmEx") that is, letter by letter,
  the start of its words in order, each word giving a prefix ("AM"+"EX": American Express; "AMD": Advanced
  Micro Devices), or a start of its first word of 3 letters or more ("JPM": JPMorgan Chase).
- period: the years it names (FY2021, fiscal 2019, 2022, FY21, "as of December 31, 2022"), less those after
  every candidate's (a year an amount is expected in: "expect to pay in 2024"); its quarter ("Q3", "third
  quarter", "Q3 of FY2020", "2021 Q1", "second fiscal quarter of 2023") with the year next to it; "latest",
  "most recent". A card of the latest year asked scores 1, of another year asked 0.5; with a quarter asked,
  that quarter's report 1, the annual report of its year 0.8 (a year covers its quarters; the fourth
  quarter's figures are in the annual report), another quarter of that year 0.3; "latest": the newest of
  the named organisation's cards.
- kind: annual report (10-K, annual report), quarterly report (10-Q), current report (8-K), earnings release, proxy, contract,
  slides, memo, paper: 1 when the card's kind is the one asked.
A card's match is the weighed mean of the parts the question names (ORG, PERIOD, KIND); when the question
names an organisation of some candidate, cards of other organisations score 0. A question that names
none of the three matches every card 0, and keeps the dense order.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping

from ingest.doc_card import Card, name_words

ORG, PERIOD, KIND = 0.4, 0.45, 0.15      # weights of the parts a question names (a year tells a company's filings apart)
OTHER_YEAR = 0.5                         # a card of a year asked, not the latest asked
YEAR_FOR_QUARTER = 0.8                   # the annual report of a quarter's year
OTHER_QUARTER = 0.3                      # another quarter's report of that year

_WORD = re.compile(r"[^\W_]+")
_YEAR = re.compile(r"(?<![\d.$])(?:FY\s*'?)?((?:19|20)\d\d)(?![\d%])|\bFY\s*'?(\d\d)\b", re.I)
_ORD = {"first": 1, "second": 2, "third": 3, "fourth": 4, "1st": 1, "2nd": 2, "3rd": 3, "4th": 4}
_QUARTER = re.compile(r"\bQ([1-4])\b|\b(first|second|third|fourth|1st|2nd|3rd|4th)\s+(?:fiscal\s+|calendar\s+)?"
                      r"quarter\b|\b([1-4])Q\b", re.I)
_KINDS = (("annual report", r"\b10-?K\b|\bannual report|\bannual filing"),
          ("quarterly report", r"\b10-?Q\b|\bquarterly report|\bquarterly filing|\binterim report"),
          ("current report", r"\b8-?K\b|\bcurrent report"),
          ("earnings release", r"\bearnings (?:release|call)|\bpress release"),
          ("proxy", r"\bproxy\b"), ("contract", r"\bcontract\b|\bagreement\b"),
          ("slides", r"\bslides?\b|\bdeck\b|\bpresentation\b"), ("memo", r"\bmemo(?:randum)?\b"),
          ("paper", r"\bpaper\b|\barticle\b"))
_LATEST = re.compile(r"\b(?:latest|most recent|newest|last reported|current)\b", re.I)


@dataclass(frozen=True)
class Asked:
    """What a question says of its document."""
    words: frozenset[str]               # lowercased
    squashed: str                       # its words lowercased, joined
    caps: tuple[str, ...]               # words with 2 capitals or more, as written ("AMEX", "JPM")
    raw_words: frozenset[str]           # as written
    years: tuple[int, ...]
    quarter: int | None
    quarter_year: int | None
    kind: str
    latest: bool


def asked(query: str) -> Asked:
    """What `query` names (see NOTE)."""
    raw = _WORD.findall(query)
    years = []
    for m in _YEAR.finditer(query):
        years.append(int(m.group(1)) if m.group(1) else 2000 + int(m.group(2)))
    quarter, quarter_year = None, None
    if m := _QUARTER.search(query):
        quarter = int(m.group(1) or m.group(3) or _ORD[m.group(2).lower()])
        near = [(abs(y.start() - m.start()), int(y.group(1)) if y.group(1) else 2000 + int(y.group(2)))
                for y in _YEAR.finditer(query) if abs(y.start() - m.start()) <= 40]
        quarter_year = min(near)[1] if near else None
    kind = next((k for k, rule in _KINDS if re.search(rule, query, re.I)), "")
    return Asked(frozenset(w.lower() for w in raw), "".join(w.lower() for w in raw),
                 tuple(w for w in raw if sum(c.isupper() for c in w) >= 2 and w.isalpha() and 2 <= len(w) <= 6),
                 frozenset(raw), tuple(years), quarter, quarter_year, kind, bool(_LATEST.search(query)))


def abbreviates(token: str, words: list[str]) -> bool:
    """Whether `token` is the start of `words` in order, each word giving a prefix of 1 letter or more, at
    least two words used, or a start of the first word of 3 letters or more ("AMEX": american express)."""
    t = token.lower()
    if not words:
        return False
    if len(t) >= 3 and words[0].startswith(t) and len(words[0]) > len(t):
        return True

    def split(i: int, w: int) -> bool:              # t[i:] from words[w:], each word a prefix
        if i == len(t):
            return w >= 2
        if w == len(words):
            return False
        return any(t[i:i + n] == words[w][:n] and split(i + n, w + 1) for n in range(1, min(len(words[w]), len(t) - i) + 1))

    return len(t) >= 2 and split(0, 0)


def org_score(a: Asked, card: Card, weight: Mapping[str, float]) -> float:
    """How fully the question names the card's main organisation (NOTE), 0..1."""
    if not card.orgs:
        return 0.0
    words = name_words(card.orgs[0])
    for form in card.short:
        fw = [w.lower() for w in _WORD.findall(form)]
        if not fw:
            continue
        if len(fw) == 1 and len(form) <= 5 and form.isupper():
            if form in a.raw_words:                 # a ticker or initials, in capitals as written
                return 1.0
        elif all(w in a.words for w in fw) or "".join(fw) in a.squashed and len("".join(fw)) >= 4:
            return 1.0
    if any(abbreviates(tok, words) for tok in a.caps):
        return 1.0
    total = sum(weight.get(w, 1.0) for w in words)
    said = sum(weight.get(w, 1.0) for w in words if w in a.words or (len(w) >= 4 and w in a.squashed))
    if words and len(words) > 1 and "".join(words) in a.squashed:
        said = total
    return said / total if total else 0.0


def period_score(a: Asked, card: Card, years: list[int], newest: int | None) -> float | None:
    """How well the card's period meets the question's (NOTE), 0..1; None when the question names none."""
    year = card.year or (int(card.date[:4]) if card.date[:4].isdigit() else None)
    if a.quarter:
        qy = a.quarter_year or (max(years) if years else None)
        if qy is None:
            return (1.0 if card.quarter == a.quarter else 0.0) if card.quarter else None
        if year != qy:
            return 0.0
        return 1.0 if card.quarter == a.quarter else OTHER_QUARTER if card.quarter else YEAR_FOR_QUARTER
    if years:
        return 1.0 if year == max(years) else OTHER_YEAR if year in years else 0.0
    if a.latest and newest is not None:
        return 1.0 if year == newest else 0.0
    return None


def card_matches(query: str, cards: Mapping[str, Card]) -> dict[str, float]:
    """Each source's card match with `query`, 0..1 (NOTE)."""
    a = asked(query)
    distinct = {c.orgs[0]: name_words(c.orgs[0]) for c in cards.values() if c.orgs}
    counts: dict[str, int] = {}
    for words in distinct.values():
        for w in set(words):
            counts[w] = counts.get(w, 0) + 1
    weight = {w: math.log((len(distinct) + 1) / n) + 0.1 for w, n in counts.items()}
    orgs = {s: org_score(a, c, weight) for s, c in cards.items()}
    named = any(v >= 0.5 for v in orgs.values())
    newest_of = max(((c.year or 0) for s, c in cards.items() if not named or orgs[s] >= 0.5), default=None)
    known = [y for c in cards.values() if (y := c.year or (int(c.date[:4]) if c.date[:4].isdigit() else 0))]
    years = [y for y in a.years if not known or y <= max(known)]
    out = {}
    for source, card in cards.items():
        parts: list[tuple[float, float]] = []
        if named:
            if orgs[source] < 0.5:
                out[source] = 0.0
                continue
            parts.append((ORG, orgs[source]))
        if (p := period_score(a, card, years, newest_of)) is not None:
            parts.append((PERIOD, p))
        if a.kind:
            parts.append((KIND, 1.0 if card.kind == a.kind else 0.0))
        out[source] = sum(w * v for w, v in parts) / sum(w for w, _ in parts) if parts else 0.0
    return out
