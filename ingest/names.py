"""Whether a file's name says something: the user's own words for a document, kept beside its card.

NOTE (meaningful names): a name is split into its runs of letters and digits (separators, case and the
extension aside). It carries meaning when one run is
- a word: two letters or more, not a camera's, scanner's or download's stock word (scan, img, document,
  untitled, copy, page...), and not hexadecimal noise (8+ characters of 0-9a-f mixing letters and digits,
  or a run that mixes letters and digits in no known pattern, as a hash or a UUID does);
- a year (1900-2099), a quarter or half (Q2, H1, 2019Q2), a fiscal year (FY2021, FY21) or a form (10-K,
  10Q, 8-K, 20-F, S-1, DEF 14A).
A date or time stamp counts for nothing (a device writes it), and neither does a name whose runs are all
hexadecimal with digits among them (a UUID or a hash in parts). So "ACME_2019Q2_10Q", "budget 2024" and
"Lebenslauf" carry meaning; "scan_0001", "IMG_20190512_1234", "Scan 2024-03-01", "3f2a9c0e1b7d4e55",
"Document1" and "0001047469-19-000123" do not. A meaningless name is left out of the
context line where the card names the document's organisation: the card then stands alone.

NOTE (beside the card): where the card names the organisation, the context line keeps only the name's
meaningful runs the card does not already say (`beside`): the organisation, the year, the quarter, a form
whose kind the card names (10-K: annual report, 10-Q: quarterly report, 8-K: current report, DEF 14A:
proxy) and "dated" beside a card's date are said; "AMERICANWATERWORKS_2020_10K" beside "American Water Works
Company, Inc. (AWK) annual report FY2020" adds nothing, "ACME_board_minutes_2021" beside "Acme Inc. (ACME)"
adds "board minutes 2021". Measured on the development set, a word every chunk repeats ("10K" beside an annual
report's card) moved the dense hits of every question: MRR@10 0.30 -> 0.23 without ranking (docs/retrieval.md).
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import PurePosixPath

_RUN = re.compile(r"[^\W_]+")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
_STOCK = frozenset("""scan scans scanned img image images dsc dscn dcim pic photo picture screenshot screen shot
    document documents doc docs file files page pages untitled unnamed copy new final draft version ver rev
    download downloads attachment attach export output print printout pdf tmp temp test sample at am pm
    whatsapp signal telegram camera cam pxl mvimg vid video scanner fax""".split())
_FORM = re.compile(r"^(?:10[kq]|8k|20f|6k|40f|s1|f1|def14a|14a|ex\d+|q[1-4]|h[12]|fy(?:19|20)?\d\d|"
                   r"(?:19|20)\d\d(?:q[1-4]|h[12])|(?:q[1-4]|h[12])(?:19|20)?\d\d)$", re.I)
_YEAR = re.compile(r"^(?:19|20)\d\d$")
_YEAR_QUARTER = re.compile(r"^((?:19|20)\d\d)?([qh][1-4])((?:19|20)\d\d)?$", re.I)
_FORM_KINDS = {"10k": "annualreport", "20f": "annualreport", "40f": "annualreport", "10q": "quarterlyreport",
               "8k": "currentreport", "6k": "currentreport", "def14a": "proxy", "14a": "proxy"}
_ISO = re.compile(r"(?:19|20)\d\d-\d\d-\d\d")
_HEX = re.compile(r"^[0-9a-f]{8,}$", re.I)
_DATE = re.compile(r"(?<!\d)(?:(?:19|20)\d\d[-_.]?\d\d[-_.]?\d\d|\d\d[-_.]\d\d[-_.](?:19|20)\d\d)(?:[-_. T]?\d\d[-_.:]?\d\d(?:[-_.:]?\d\d)?)?(?!\d)")
_WORD_NUMBER = re.compile(r"^([^\W\d_]{3,})(\d{1,4})$|^(\d{1,4})([^\W\d_]{3,})$")     # Lecture3, 2019report


@lru_cache(maxsize=4096)
def meaningful(name: str) -> bool:
    """Whether `name` (a file's name or path, extension removed) carries meaning (NOTE)."""
    if _FORM.match(re.sub(r"[\W_]+", "", name)):
        return True
    runs = _RUN.findall(_DATE.sub(" ", name))              # a device's time stamp says nothing
    if all(not _YEAR.match(r) and re.fullmatch(r"[0-9a-f]+", r, re.I) for r in runs) \
            and any(r.isdigit() or not r.isalpha() for r in runs):
        return False                                        # a UUID or a hash in parts
    return any(map(_says, runs))


@lru_cache(maxsize=4096)            # asked once a section (the context line): a file's sections share it
def beside(name: str, card: str) -> str:
    """The runs of `name` that carry meaning and that `card` does not say (NOTE: beside the card), in order."""
    if not meaningful(name):
        return ""
    said = re.sub(r"[\W_]+", "", card.lower()) + (" dated" if _ISO.search(card) else "")    # "annualreportfy2020"
    return " ".join(r for r in _RUN.findall(_DATE.sub(" ", name)) if _says(r) and not _in(r.lower(), said))


def _in(run: str, said: str) -> bool:
    """Whether the card says `run`: as it is ("amd", "americanwaterworks", "2020" in "fy2020"), its year and
    quarter apart ("2019q2" in "q2 2019"), a form by its kind ("10k": "annual report"); `said` ends with " dated"
    when the card has a date."""
    m = _YEAR_QUARTER.match(run)
    return run in said or bool(m) and all(p in said for p in m.groups() if p) \
        or (kind := _FORM_KINDS.get(run)) is not None and kind in said


def _says(run: str) -> bool:
    if _YEAR.match(run) or _FORM.match(run):
        return True
    if run.isalpha():
        return run.lower() not in _STOCK and any(len(w) >= 2 and w.lower() not in _STOCK for w in _CAMEL.split(run))
    if _HEX.match(run) or not (m := _WORD_NUMBER.match(run)):
        return False                                        # digits, a hash, letters and digits mixed
    word, number = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
    return word.lower() not in _STOCK or bool(_YEAR.match(number))


def split_name(source: str) -> tuple[str, str, str]:
    """PurePosixPath's (the path less its suffix, the name, the suffix) of `source`, without its parsing (~7 us,
    a few calls a file on the supervisor's path); a path to normalise ("//", "/.", a leading "/") through
    PurePosixPath. Without a suffix, the path is `source` as it is."""
    if "//" in source or "/." in source or source.startswith(("/", "./")) or source.endswith("/") or source == ".":
        path = PurePosixPath(source)
        return str(path.with_suffix("")) if path.suffix else source, path.name, path.suffix
    folder, _, name = source.rpartition("/")
    dot = name.rfind(".")
    if 0 < dot < len(name) - 1:
        return f"{folder}/{name[:dot]}" if folder else name[:dot], name, name[dot:]
    return source, name, ""


def suffix(source: str) -> str:
    """`source`'s extension, lowercased ("" if none)."""
    return split_name(source)[2].lower()
