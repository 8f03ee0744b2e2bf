"""A document's card: who and when it is from and what kind it is, read from its own content (its first
pages, its metadata, its running headers), never from its file name.

NOTE (rules): the rules are about how documents present themselves, in general, not about any company:
- organisations: a name right before "(exact name of registrant ...)"; a name that defines a short form
  ('American Express Company ("we", "AXP")', 'Acme Ltd. (the "Company")', '"Foo," "we" and "our" mean
  Foo Inc.'); capitalized names ending in a legal or institutional word in several languages (Inc.,
  Corporation, Company, Ltd, GmbH, AG, S.A., N.V., S.p.A., University, Institute, ...), the most frequent
  first; the metadata author when it is such a name. Short forms: tickers ("(NYSE: AXP)", a 2-5 capital
  symbol right before an exchange's name in a cover page's table), quoted defined names, and the initials
  of the first organisation ("Lockheed Martin Corporation" -> LM).
- kind: the first form or phrase found (Form 10-K, annual report / Geschäftsbericht / rapport annuel, quarterly
  or interim report, Form 8-K or current report, earnings or press release with results, proxy statement,
  agreement or contract, an abstract with references or a DOI (paper), "memorandum" or To:/From:/Subject:
  lines (memo)); a PPTX is slides.
- period: a current report's "Date of Report ...: <date>"; "fiscal year ended <date>" (year, its end date),
  "quarterly period ended <date>" (year and calendar quarter of that date), "first/second/third/fourth
  quarter [of] [fiscal] YEAR", "Q3 2020", metadata's "period ending YYYY-MM-DD"; else "as of <date>" or a
  document date ("Date: ..."). The card is made once per file in its loader worker from what the chunker
  reads anyway (FIRST_PAGES), so it costs a few regular expressions over a few pages.
"""
from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import accumulate
from pathlib import PurePosixPath
from typing import Any, Iterable, Sequence

from ingest.loaders import Page
from ingest.sections import Doc, document_title

FIRST_PAGES = 4                 # pages read for the card
PAGE_CHARS = 6_000              # characters of each looked at
PERIOD_CHARS = 8_000            # characters of them where the period is looked for
MAX_ORGS = 3
MAX_SHORT = 6

KINDS = ("annual report", "quarterly report", "current report", "earnings release", "proxy", "contract", "paper", "slides", "memo")

_MONTHS = {m: i for i, m in enumerate(("january february march april may june july august september october "
                                       "november december").split(), 1)}
_MONTHS.update({m[:3]: i for m, i in list(_MONTHS.items())})
_MONTHS.update({"sept": 9, "januar": 1, "februar": 2, "märz": 3, "mai": 5, "juni": 6, "juli": 7, "oktober": 10,
                "dezember": 12, "janvier": 1, "février": 2, "mars": 3, "avril": 4, "juin": 6, "juillet": 7,
                "août": 8, "septembre": 9, "octobre": 10, "novembre": 11, "décembre": 12, "enero": 1,
                "febrero": 2, "marzo": 3, "abril": 4, "mayo": 5, "junio": 6, "julio": 7, "agosto": 8,
                "septiembre": 9, "octubre": 10, "noviembre": 11, "diciembre": 12})
_MONTH = "|".join(sorted(map(re.escape, _MONTHS), key=len, reverse=True))
_DATE = (rf"(?:(?P<m1>{_MONTH})\.?\s+(?P<d1>\d{{1,2}}),?\s+(?P<y1>(?:19|20)\d\d)"
         rf"|(?P<d2>\d{{1,2}})\.?\s+(?P<m2>{_MONTH})\.?,?\s+(?P<y2>(?:19|20)\d\d)"
         rf"|(?P<y3>(?:19|20)\d\d)-(?P<m3>\d\d)-(?P<d3>\d\d))")
_DATE_RE = re.compile(_DATE, re.I)
_ORDINAL = {"first": 1, "second": 2, "third": 3, "fourth": 4, "1st": 1, "2nd": 2, "3rd": 3, "4th": 4}

_SUFFIX = (r"Inc\.?|Corporation|Corp\.?|Company|Co\.|Companies|Ltd\.?|Limited|LLC|L\.L\.C\.|LLP|"
           r"plc|PLC|P\.L\.C\.|AG|SE|GmbH|KGaA|S\.A\.|SA|S\.p\.A\.|SpA|N\.V\.|B\.V\.|AB|ASA|A/S|Oyj|K\.K\.|"
           r"Holdings?|Group|Bancorp|Trust|Partners|University|Universität|Université|Universidad|Institute|"
           r"Institut|Laboratory|Laboratories|Foundation|Agency|Ministry|Association")
_CAP = r"(?:[A-Z&][\w&'’.\-]*|of|and|de|du|des|der|für|the|y|&)"
_ORG_RE = re.compile(rf"\b((?:The\s+)?[A-Z][\w&'’.\-]*(?:[ \t]+{_CAP}){{0,6}}?,?[ \t]+(?i:{_SUFFIX}))(?![\w])(?![ \t]+(?:of|for|de|für)\b)")
_SPACES = re.compile("[\xa0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000]")
_SUFFIX_FULL, _SUFFIX_FULL_I = re.compile(_SUFFIX), re.compile(_SUFFIX, re.I)
# the lines where _ORG_RE or _ORG_INST may match: a space before a legal word (in _fold's text), or an institution
_ORG_NEAR = re.compile(rf"[ \t](?:{_SUFFIX.lower()})(?!\w)")
_INST_NEAR = re.compile(r"Universit|Institut")
_OPENS = re.compile(r"\((?:[^)]{0,60}?, )?(?:collectively,? )?(?:the\s+)?[“\"']")
_ORG_INST = re.compile(r"\b((?:University|Universität|Université|Universidad|Institute|Institut)[ \t]+(?:of|for|de|für)"
                       r"[ \t]+[A-Z][\w\-]*(?:[ \t]+(?:[A-Z][\w\-]*|of|and))*)")
_REGISTRANT = re.compile(r"\(\s*exact name of (?:the )?registrant", re.I)
_DEFINED = re.compile(r"([A-Z][\w&'’.,\- ]{2,80}?)\s*\((?:together with [^)]{0,60}?, )?(?:collectively,? )?"
                      r"(?:the\s+|“|\"|')+([^”\"')]{2,30})[”\"']")
_MEAN = re.compile(r"(?:terms?|references to)\s+((?:[“\"][^”\"]{1,40}[”\"],?\s*(?:or|and)?\s*)++)"
                   r"(?:as used herein\s+)?(?:mean|refer to)s?\s+((?:The\s+)?[A-Z][\w&'’.\-]*(?:\s+" + _CAP + r"){0,6})")
_TICKER = re.compile(r"\((?:NYSE|Nasdaq|NASDAQ|NYSE American|LSE|TSX|ASX|Euronext|XETRA|SIX)\s*:\s*([A-Z][A-Z.]{0,5})\)")
_EXCHANGES = ("New York Stock Exchange", "NYSE", "Nasdaq", "NASDAQ", "Chicago Stock Exchange", "Cboe")
_SYMBOL = re.compile(r"(?<![\w.])([A-Z]{2,5})\s+(?:The\s+)?(?:" + "|".join(_EXCHANGES) + ")")
_NOT_ORG = re.compile(r"^(?:the |our |its |this )?(?:company|registrant|securities and exchange commission|united states|"
                      r"form|table of contents|annual report|quarterly report)\b", re.I)
_GENERIC_SHORT = {"company", "we", "us", "our", "registrant", "corporation", "group", "agreement", "act", "notes",
                  "plan", "board", "exchange act", "securities act", "sec", "issuer", "parent", "bank"}


@dataclass(frozen=True)
class Card:
    """What a file says of itself (see NOTE); empty fields where it says nothing."""
    title: str = ""
    orgs: tuple[str, ...] = ()          # full names, the main one first
    short: tuple[str, ...] = ()         # its short forms: tickers, defined names, initials
    kind: str = ""                      # one of KINDS, or ""
    year: int | None = None             # the (fiscal) year it covers
    quarter: int | None = None          # 1-4 when it covers a quarter
    date: str = ""                      # ISO date: the period's end, or the document's date
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> str:
        d = {k: v for k, v in asdict(self).items() if v not in ("", (), None, {}, [])}
        return json.dumps(d, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> Card:
        if not text:
            return cls()
        try:
            d = json.loads(text)
            return cls(d.get("title", ""), tuple(d.get("orgs", ())), tuple(d.get("short", ())), d.get("kind", ""),
                       d.get("year"), d.get("quarter"), d.get("date", ""))
        except (ValueError, TypeError, AttributeError):
            return cls()

    @property
    def period(self) -> str:
        """"FY2021", "Q2 2022", or the date."""
        if self.year and self.quarter:
            return f"Q{self.quarter} {self.year}"
        if self.year:
            return f"FY{self.year}"
        return self.date

    def label(self) -> str:
        """What the context line says of the card: "Lockheed Martin Corporation (LMT, LM) annual report FY2021"."""
        parts = []
        if self.orgs:
            parts.append(self.orgs[0] + (f" ({', '.join(self.short[:3])})" if self.short else ""))
        parts += [p for p in (self.kind, self.period) if p]
        return " ".join(parts)


def file_doc(source: str, fmt: str, first: list[Page], label: bool = True) -> Doc:
    """A file's Doc from its first pages: its title and its card (with the card's label for the context line
    unless `label` is False)."""
    page = first[0] if first else Page(None, "")
    title = document_title(page, source)
    card = make_card([p.text for p in first], "" if title == PurePosixPath(source).name else title,
                     dict(page.meta), fmt, [t for p in first for t in p.running])
    return Doc(source, title, card.to_json(), card.label() if label else "", label and bool(card.orgs))


def make_card(texts: Sequence[str], title: str = "", meta: dict[str, str] | None = None, fmt: str = "",
              running: Iterable[str] = ()) -> Card:
    """The card of a document from its first pages' texts, its title, its metadata (subject, author,
    keywords, created) and the lines repeating on its pages (`running`)."""
    meta = meta or {}
    head = "\n".join(t[:PAGE_CHARS] for t in texts)
    head = head if head.isascii() else _SPACES.sub(" ", head)
    run = "\n".join(dict.fromkeys(running))
    flat = " ".join(head.split())
    orgs, short = _orgs(head, flat, run, meta.get("author", ""))
    kind = _kind(flat, fmt, " ".join((title, meta.get("subject", ""), meta.get("keywords", ""))))
    year, quarter, date = _period(flat[:PERIOD_CHARS], " ".join((meta.get("subject", ""), title)), kind)
    return Card(" ".join(title.split())[:200], tuple(orgs[:MAX_ORGS]), tuple(short[:MAX_SHORT]), kind, year, quarter, date)


_ABBREV_END = re.compile(r"(?i)\b(?:inc|co|corp|ltd|bros|s\.a|n\.v|b\.v|s\.p\.a|l\.l\.c|p\.l\.c|k\.k)\.$")
_TAIL_WORD = re.compile(r"(?i)\s+(?:and|or|of|&)$")
_LEAD_WORD = re.compile(r"^(?:and|or|by|of|from|between|with|for|to|at|in)\s+", re.I)
_LETTERS, _LETTERS_DIGITS = re.compile(r"[^\W\d_]+"), re.compile(r"[^\W_]+")
_OF_AND = re.compile(r"\b(Of|And)\b")
_NOT_NAME = re.compile(r"(?i)(a division of|filed|pursuant|incorporated by)")
_OF_THE = re.compile(r"\s(?:the|our|its|this|such|a|each|any)\s+\S+$", re.I)
_NON_WORD, _LEAD_THE = re.compile(r"[^\w]+"), re.compile(r"^the ")


def _clean_org(name: str) -> str:
    name = " ".join(name.replace("\n", " ").split()).strip(" ,;:-–—")
    if name.endswith(".") and not _ABBREV_END.search(name):
        name = name.rstrip(".")
    name = _TAIL_WORD.sub("", name)
    words = name.split()
    if len(words) > 1 and words[-1].isupper() and len(words[-1]) > 2:     # "Part III. THE ACME COMPANY": the capitals
        while len(words) > 1 and not (words[0].isupper() and words[0].isalpha() or words[0] == "&"):
            words.pop(0)
    name = _LEAD_WORD.sub("", " ".join(words))
    if name.isupper() and len(name) > 5:                     # ACME WIDGETS, INC. -> Acme Widgets, Inc.
        name = " ".join(w if len(w) <= 3 and w.isalpha() and not _SUFFIX_FULL.fullmatch(w.title() + ".")
                        and w not in ("THE", "AND", "OF") else _LETTERS.sub(lambda m: m.group(0).capitalize(), w)
                        for w in name.split())
        name = _OF_AND.sub(lambda m: m.group(1).lower(), name)
    if _NOT_NAME.search(name) or _OF_THE.search(name):    # "Officers of the Company"
        return ""
    return name


def _key(name: str) -> str:
    return _LEAD_THE.sub("", _NON_WORD.sub(" ", name.lower()).strip())


def _fold(text: str) -> str:
    """`text` lowercased so that a character an IGNORECASE pattern's letter matches becomes that letter, each
    character in its place (tests/test_card_equal.py checks it on every character)."""
    if not text.isascii():
        for c, f in (("İ", "i"), ("ı", "i"), ("ſ", "s")):
            if c in text:
                text = text.replace(c, f)
    return text.lower()


def _org_lines(text: str) -> list[str]:
    """The lines of `text` where _ORG_RE or _ORG_INST may match (a superset of those with a legal word), in order."""
    at = [m.start() for m in _ORG_NEAR.finditer(_fold(text))] + [m.start() for m in _INST_NEAR.finditer(text)]
    if not at:
        return []
    lines = text.splitlines()
    ends = list(accumulate(map(len, text.splitlines(True))))
    return [lines[i] for i in sorted({bisect_right(ends, p) for p in at})]


def _orgs(head: str, flat: str, run: str, author: str) -> tuple[list[str], list[str]]:
    votes: Counter[str] = Counter()
    names: dict[str, str] = {}
    short: list[str] = []
    owned: list[tuple[str, str]] = []       # (org key, a short form it defines)

    def vote(raw: str, weight: float) -> str:
        name = _clean_org(raw)
        if len(name) < 3 or _NOT_ORG.match(name) or sum(c.isalpha() for c in name) < 3:
            return ""
        key = _key(name)
        names.setdefault(key, name)
        votes[key] += weight
        return key

    for m in _REGISTRANT.finditer(head):         # the name right before "(Exact name of registrant ...)"
        line = next((s.strip() for s in reversed(re.split(r"[\n()]", head[max(0, m.start() - 120):m.start()]))
                     if s.strip()), "")
        vote(re.split(r"\s{2,}|\d{3,}", line)[-1] if line else line, 10)
    for m in _MEAN.finditer(flat) if "term" in flat or "references to" in flat else ():
        key = vote(m.group(2), 6)
        if key:
            owned += [(key, s) for s in re.findall(r"[“\"]([^”\"]{1,40})[”\"]", m.group(1))
                      if s.strip(" ,").lower() not in _GENERIC_SHORT and _key(s) != key]
    defining = [flat[max(0, m.start() - 90):m.end() + 40] for m in _OPENS.finditer(flat)]   # near '("' only
    for m in (d for window in defining for d in _DEFINED.finditer(window)):
        tail = _ORG_RE.search(m.group(1))
        defined = m.group(2).strip(" ,")
        if tail and defined.lower() not in _GENERIC_SHORT:
            if key := vote(tail.group(1), 4):
                owned.append((key, defined))
        elif tail:
            vote(tail.group(1), 3)
    for text, weight in ((head, 1), (run, 2)):           # each distinct name cleaned once; lines with a name only
        lines = _org_lines(text)
        found = Counter(m.group(1) for ln in lines for rx in (_ORG_RE, _ORG_INST) for m in rx.finditer(ln))
        for raw, n in found.items():
            vote(raw, weight * n)
    if author and _ORG_RE.fullmatch(author.strip()):
        vote(author, 2)
    # a name and its longer form ("Verizon" in "Verizon Communications Inc.") are one organisation
    merged: dict[str, str] = {}            # "express company" and "american express company": one, named as voted most
    for key in sorted(votes, key=len):
        if key not in votes:
            continue
        for longer in [k for k in votes if k != key and k.endswith(" " + key)]:
            keep, drop = (key, longer) if votes[key] >= votes[longer] else (longer, key)
            votes[keep] += votes.pop(drop)
            merged[drop] = keep
            if drop == key:
                break
    for key in list(merged):
        while merged[key] in merged:
            merged[key] = merged[merged[key]]
    ranked = [k for k, _ in votes.most_common()]
    tickers = [m.group(1) for m in _TICKER.finditer(flat)] + \
        ([m.group(1) for m in _SYMBOL.finditer(flat)] if any(x in flat for x in _EXCHANGES) else [])
    if tickers:
        short = [Counter(tickers).most_common(1)[0][0]] + short
    orgs = [names[k] for k in ranked][:MAX_ORGS]
    if orgs:
        main = ranked[0]
        short += [form for key, form in owned if merged.get(key, key) == main]
        initials = _initials(orgs[0])
        if len(initials) >= 2:
            short.append(initials)
    return orgs, list(dict.fromkeys(s.strip(" ,;") for s in short if s.strip(" ,;")))


def name_words(name: str) -> list[str]:
    """An organisation's distinctive words: lowercased, without "the", "&", "and", "of" and its legal suffix."""
    words = _LETTERS_DIGITS.findall(name.replace("’", "'").replace("'s", ""))
    while words and _SUFFIX_FULL_I.fullmatch(words[-1] + ("." if words[-1].lower() in ("inc", "co", "corp", "ltd") else "")):
        words.pop()
    return [w.lower() for w in words if w.lower() not in ("the", "and", "of", "de", "der", "des", "du")]


def _initials(name: str) -> str:
    words = name_words(name)
    return "".join(w[0] for w in words).upper() if len(words) >= 2 else ""


_KIND_RULES: tuple[tuple[str, str], ...] = (
    ("annual report", r"\bform\s*10-?k\b|\bform\s*20-?f\b|\bannual report\b|\bgeschäftsbericht|\bjahresbericht|"
                      r"\brapport annuel|\binforme anual|\brelazione annuale|\bjaarverslag|\bårsredovisning"),
    ("quarterly report", r"\bform\s*10-?q\b|\bquarterly report\b|\binterim report\b|\bhalf-year(?:ly)? report\b|"
                         r"\bquartalsbericht|\bzwischenbericht|\brapport trimestriel|\binforme trimestral"),
    ("current report", r"\bform\s*8-?k\b|\bcurrent report\b"),
    ("earnings release", r"\b(?:earnings|press) release\b|\breports? (?:first|second|third|fourth|full[- ]year)[- ]"
                         r"(?:quarter )?(?:and [\w ]{0,20})?(?:fiscal )?(?:\d{4} )?results\b|\bpressemitteilung"),
    ("proxy", r"\bproxy statement\b|\bschedule 14a\b|\bnotice of (?:the )?annual (?:general )?meeting\b"),
    ("contract", r"\bthis (?:\w+ ){0,3}(?:agreement|contract)\b|\bby and between\b|\bwhereas\b|\bvertrag\b|\bcontrat\b"),
    ("paper", r"\babstract\b.{0,4000}\b(?:introduction|references|keywords|doi)\b|\barxiv:|\bproceedings of\b"),
    ("memo", r"^\W{0,3}(?:internal\s+)?(?:memorandum|memo)\b|\bto:\s.{1,120}\bfrom:\s.{1,200}\b(?:subject|re|date):\s"),
)
_KIND_RES = tuple((kind, re.compile(rule, re.I | re.S)) for kind, rule in _KIND_RULES)
_KIND_WORDS = {         # a rule matches only where one of its words is in the _fold-ed text
    "annual report": ("form", "annual report", "geschäftsbericht", "jahresbericht", "rapport annuel", "informe anual",
                      "relazione annuale", "jaarverslag", "årsredovisning"),
    "quarterly report": ("form", "quarterly report", "interim report", "half-year", "quartalsbericht", "zwischenbericht",
                         "rapport trimestriel", "informe trimestral"),
    "current report": ("form", "current report"), "earnings release": ("release", "results", "pressemitteilung"),
    "proxy": ("proxy statement", "schedule 14a", "meeting"),
    "contract": ("agreement", "contract", "by and between", "whereas", "vertrag", "contrat"),
    "paper": ("abstract", "arxiv:", "proceedings of"),
    "memo": ("memo", "from:")}
_FORM_10Q = re.compile(r"form\s*10-?q", re.I)


def _kind(flat: str, fmt: str, meta: str) -> str:
    if fmt in ("pptx", "ppt"):
        return "slides"
    window = (meta + " " + flat[:4000])
    low = _fold(window)
    found = [(m.start(), kind) for kind, rx in _KIND_RES
             if any(w in low for w in _KIND_WORDS[kind]) and (m := rx.search(window))]
    if not found:
        return ""
    # forms and the cover page's own words come first; a later mention ("our annual report") loses to an
    # earlier, more specific one; a quarterly report mentions the annual report it updates, not the reverse
    kinds = dict((k, s) for s, k in found)
    if "quarterly report" in kinds and "annual report" in kinds and _FORM_10Q.search(window):
        return "quarterly report"
    return min(found)[1]


def _date(m: re.Match) -> tuple[int, int, int] | None:
    g = m.groupdict()
    for y, mo, d in (("y1", "m1", "d1"), ("y2", "m2", "d2"), ("y3", "m3", "d3")):
        if g[y]:
            month = int(g[mo]) if g[mo].isdigit() else _MONTHS.get(g[mo].lower().rstrip("."), 0)
            if 1 <= month <= 12 and 1 <= int(g[d]) <= 31:
                return int(g[y]), month, int(g[d])
    return None


def _after(rx: re.Pattern, text: str, span: int = 120) -> tuple[int, int, int] | None:
    m = rx.search(text)
    if not m:
        return None
    d = _DATE_RE.search(text, m.end(), m.end() + span)
    return _date(d) if d else None


_YEAR = re.compile(r"(?:19|20)\d\d")         # in every date, and in each pattern of _period but "period ending"
_YEAR_ENDED = re.compile(r"(?:fiscal|financial)\s+year\s+ended|year\s+ended|geschäftsjahr\s+(?:zum|endend)|"
                         r"exercice clos le", re.I)
_PERIOD_ENDED = re.compile(r"(?:quarterly|three[- ]month|interim)\s+period\s+ended|quarter\s+ended|three months ended",
                           re.I)
_QUARTER = re.compile(r"\b(first|second|third|fourth|1st|2nd|3rd|4th)\s+(?:fiscal\s+)?quarter\s+(?:of\s+)?(?:fiscal\s+"
                      r"(?:year\s+)?)?((?:19|20)\d\d)\b|\bQ([1-4])\s*(?:FY\s*)?((?:19|20)\d\d)\b|"
                      r"\b((?:19|20)\d\d)\s*Q([1-4])\b", re.I)
_PERIOD_ENDING = re.compile(r"period\s+ending", re.I)
_FISCAL = re.compile(r"\b(?:fiscal(?:\s+year)?|FY)\s*((?:19|20)\d\d)\b", re.I)
_DATED = tuple(re.compile(p, re.I) for p in (r"\bdate\s+of\s+report\b[^:]{0,60}:", r"\bas\s+of", r"\bdate[d]?\s*:",
                                             r"\bdatum\s*:|\bdate\s+de"))


def _period(flat: str, meta: str, kind: str) -> tuple[int | None, int | None, str]:
    iso = lambda d: f"{d[0]:04d}-{d[1]:02d}-{d[2]:02d}"  # noqa: E731
    if kind == "current report" and (d := _after(_DATED[0], flat[:4000], 40)):     # an 8-K: its report's date
        return None, None, iso(d)
    year = _YEAR.search(flat) is not None       # else no pattern over `flat` can match: skip them
    low = _fold(flat) if year else ""
    if year and any(w in low for w in ("year", "geschäftsjahr", "exercice clos le")) and (d := _after(_YEAR_ENDED, flat)):
        if kind != "quarterly report":
            return d[0], None, iso(d)
    if year and "ended" in low and (d := _after(_PERIOD_ENDED, flat)):
        return d[0], (d[1] - 1) // 3 + 1, iso(d)
    m = _QUARTER.search(flat[:3000]) if year and "q" in low[:3000] else None
    if m:
        if m.group(1):
            return int(m.group(2)), _ORDINAL[m.group(1).lower()], ""
        if m.group(3):
            return int(m.group(4)), int(m.group(3)), ""
        return int(m.group(5)), int(m.group(6)), ""
    if d := _after(_PERIOD_ENDING, meta, 20):
        return d[0], ((d[1] - 1) // 3 + 1) if kind == "quarterly report" else None, iso(d)
    m = _FISCAL.search(flat[:3000]) if year and ("fiscal" in low[:3000] or "fy" in low[:3000]) else None
    if m:
        return int(m.group(1)), None, ""
    for rx in _DATED if year else ():
        if d := _after(rx, flat[:4000], 40):
            return (d[0] if kind in ("annual report", "quarterly report") else None), None, iso(d)
    if not year:
        return None, None, ""
    d = _DATE_RE.search(flat[:2000])
    if d and (dd := _date(d)):
        return None, None, iso(dd)
    return None, None, ""
