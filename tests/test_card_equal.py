"""make_card's result is exactly what it was before its speed-up (ingest/doc_card.py, bench/card_cost.py): the
cards recorded in card_equal.json (by the code before it) of generated texts (from seeds: random words as
bench/feed.py writes them, and a soup of the words the card's rules look for), hand-written covers and headers,
adversarial texts, and the first pages of the 18 development PDFs (each page's first 1,200 characters, with
their metadata, running lines and title); and, where ../shared/retrieval-dev is present, the cards of those PDFs'
whole first pages. One recorded card changed since, on purpose: the 8-K case is now a "current report" (issue 46)."""
from __future__ import annotations

import json
import random
import re
import sys
from itertools import islice
from pathlib import Path, PurePosixPath

import pytest

from ingest.doc_card import FIRST_PAGES, Card, make_card

FIXTURE = Path(__file__).with_name("card_equal.json")
DEV_PDFS = Path(__file__).resolve().parents[1].parent / "shared" / "retrieval-dev" / "pdfs"

WORDS = ("river mountain engine harbour lantern orchard copper glacier violin meadow falcon circuit "
         "canyon archive thunder pepper compass marble ribbon saddle quartz tunnel beacon walnut").split()
SOUP = ("Acme Globex Initech Lockheed Martin American Express Water Works Verizon Communications Porto Kraft Heinz "
        "Inc. Inc Corp Corp. Corporation Company Co. Companies Ltd Ltd. Limited LLC L.L.C. LLP plc PLC P.L.C. AG SE "
        "GmbH KGaA S.A. SA S.p.A. SpA N.V. B.V. AB ASA A/S Oyj K.K. Holding Holdings Group Bancorp Trust Partners "
        "University Universität Université Universidad Institute Institut Laboratory Laboratories Foundation Agency "
        "Ministry Association of of of and the The THE ACME WIDGETS, INC. for de für y & , , , . . ; : - ( ( ) ) "
        "\" \" “ ” ' ’ (\" (the \" (together with its subsidiaries, (collectively, (NYSE: (Nasdaq: (LSE: NYSE Nasdaq "
        "NASDAQ New York Stock Exchange Chicago Stock Exchange Cboe GBX AXP LMT ACW Form 10-K 10-Q 20-F FORM annual "
        "report quarterly interim half-yearly press earnings release reports third quarter results proxy statement "
        "Schedule 14A notice of annual meeting this Agreement contract by and between WHEREAS Vertrag contrat "
        "Abstract Introduction References DOI arXiv: Proceedings MEMORANDUM memo To: From: Subject: Re: Date: "
        "Datum: fiscal financial year ended Fiscal Year Ended quarterly period ended three months ended three-month "
        "interim period ending as of dated: first second third fourth 1st 4th quarter Q1 Q3 Q4 FY FY2021 fiscal2020 "
        "2019 2020 2021 2022 2023 1999 1899 30 31 1 12 September 30, 2021 December 31, 2022 30 June 2024 "
        "Sept. 4, 2020 2022-12-31 2021-13-45 März Geschäftsjahr zum endend exercice clos le décembre juin "
        "Geschäftsbericht rapport annuel informe anual Jahresbericht årsredovisning Quartalsbericht "
        "Pressemitteilung (Exact name of registrant as specified in its charter) the terms references to mean "
        "refers to as used herein we us our Registrant Securities and Exchange Commission Table of Contents "
        "Officers a division filed pursuant incorporated by İnc ınc ſe KK Inc\u00a0 \u2009 \t \t  \n \n \n\n "
        "\r\n \x0c \u2028 0 7 42 $ % 14 12-3456789").split(" ")


def words_text(seed: int) -> str:
    """A text as bench/feed.py's make_docs writes it: paragraphs of ~150 random words."""
    rng = random.Random(seed)
    return "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(140, 160))) + "."
                       for _ in range(rng.randint(1, 20)))


def soup_args(seed: int) -> tuple[list[str], str, dict[str, str], str, list[str]]:
    """make_card's arguments made of the words its rules look for, in random order, case and spacing."""
    rng = random.Random(seed)
    density = rng.choice((1.0, 0.5, 0.2, 0.05))

    def soup(n: int) -> str:
        out = []
        for _ in range(n):
            w = rng.choice(SOUP if rng.random() < density else WORDS)
            r = rng.random()
            w = w.upper() if r < 0.08 else w.lower() if r < 0.14 else w.title() if r < 0.18 else w
            out.append(w + rng.choice(("", " ", " ", " ", " ", "  ", "\n", ",", ".")))
        return "".join(out)

    texts = [soup(rng.randint(0, 900)) for _ in range(rng.randint(1, FIRST_PAGES))]
    if rng.random() < 0.2:
        texts = [t.replace("\n", " ") for t in texts]
    meta = {k: soup(rng.randint(1, 12)) for k in ("subject", "author", "keywords") if rng.random() < 0.3}
    if rng.random() < 0.1:
        meta["subject"] = f"Form 10-K filed on 2023-02-10 for the period ending 20{rng.randint(10, 29)}-" \
                          f"{rng.randint(1, 13):02d}-{rng.randint(1, 31):02d}"
    if rng.random() < 0.1:
        meta["author"] = rng.choice(("Verizon Communications Inc.", "EDGAR Online, a division of Donnelley", "x Inc"))
    running = [soup(rng.randint(1, 10)) for _ in range(rng.choice((0, 0, 1, 3)))]
    title = soup(rng.randint(0, 8)) if rng.random() < 0.5 else ""
    return texts, title, meta, rng.choice(("txt", "pdf", "pdf", "pptx")), running


def adversarial() -> list[tuple[str, list[str]]]:
    """Long lines, no line breaks, capitals, quotes, many legal suffixes: (name, the pages' texts)."""
    return [("long-line", ["Acme Inc. river " * 2000]),
            ("no-newline", [" ".join(["Globex Corporation and Initech Ltd. reported"] * 400)]),
            ("all-caps", ["ACME GLOBEX INITECH CORPORATION COMPANY INC HOLDINGS GROUP TRUST " * 150]),
            ("caps-words", [" ".join(w.capitalize() for w in ("alpha beta gamma delta epsilon zeta eta theta iota "
                                                              "kappa " * 120).split())]),
            ("many-inc", ["\n".join(f"Company{i} Inc. and Subsidiary{i} Corp" for i in range(400))]),
            ("many-inc-flat", [" ".join(f"Name{i} Holdings Inc. (the \"N{i}\")" for i in range(300))]),
            ("quotes", ['(" (the " (collectively, " \u201c\u201d\u201c\u201d\'\' ' * 400]),
            ("parens", ["(" * 3000 + ")" * 3000]),
            ("unicode-heavy", ["Soci\u00e9t\u00e9 G\u00e9n\u00e9rale S.A. \u2014 \u201cRapport annuel\u201d 2021 "
                               "\u2018Exercice clos le 31 d\u00e9cembre 2021\u2019 " * 60]),
            ("cjk", ["\u682a\u5f0f\u4f1a\u793e Toyota Motor Corporation 2021\u5e743\u6708\u671f " * 80]),
            ("four-pages", ["Acme Inc. page one " * 300, "Globex Corp page two " * 300, "Initech Ltd page three " * 300,
                            "Foo AG page four " * 300, "fifth page Bar Inc"]),
            ("long-page", ["x" * 5990 + " Acme Inc. fiscal year ended December 31, 2021 " + "y" * 100]),
            ("period-late", ["z " * 3990 + " Q3 2021 and fiscal year ended June 30, 2020"]),
            ("date-late", ["w " * 990 + " March 3, 2021"]),
            ("registrant-many", ["Foo Inc.\n(exact name of registrant as specified)\n" * 50]),
            ("numbers-only", ["1 2 3 4 5 6 7 8 9 10 " * 300]),
            ("year-no-date", ["In 2019 and 2020 and 2021 revenue grew" * 50]),
            ("months-no-year", ["January February March April May June July August September October November "
                                "December " * 30]),
            ("lines-with-suffixes", ["\n".join(("a Inc", "Acme Co.", "b", "Globex Group for x", "The Foo Trust of y",
                                                 "x A/S", "İnc Corp", "ſe AG") * 200)])]


def outcome(card: Card) -> list:
    """All that a card holds and says."""
    return [card.title, list(card.orgs), list(card.short), card.kind, card.year, card.quarter, card.date, card.label()]


def fixture() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def test_generated_texts_keep_their_cards() -> None:
    rec = fixture()
    for seed, expected in rec["words"]:
        assert outcome(make_card([words_text(seed)], "", {}, "txt", [])) == expected, f"words seed {seed}"
    for seed, expected in rec["soup"]:
        assert outcome(make_card(*soup_args(seed))) == expected, f"soup seed {seed}"
    for name, texts in adversarial():
        assert outcome(make_card(texts, "", {}, "txt", [])) == rec["adversarial"][name], name


def test_written_and_extracted_texts_keep_their_cards() -> None:
    cases = fixture()["cases"]
    assert len(cases) > 80 and sum(c["name"].startswith("pdf:") for c in cases) == 18
    for case in cases:
        texts, title, meta, fmt, running = case["args"]
        assert outcome(make_card(texts, title, meta, fmt, running)) == case["card"], case["name"]
    # make_card's defaults
    assert outcome(make_card(["Acme Widgets plc (the \"Group\") annual report 2021"])) == \
        outcome(make_card(["Acme Widgets plc (the \"Group\") annual report 2021"], "", None, "", ()))


def test_case_insensitive_folds_are_the_ones_the_fast_paths_assume() -> None:
    """The fast paths fold text with _fold (ingest/doc_card.py): a character a pattern's letter matches under
    re.IGNORECASE folds to that letter, and folding keeps each character's place and whether it is a \\w."""
    from ingest.doc_card import _fold
    chars = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    folded = _fold(chars)
    assert len(folded) == len(chars)
    assert [m.start() for m in re.finditer(r"\w", chars)] == [m.start() for m in re.finditer(r"\w", folded)]
    for letter in "abcdefghijklmnopqrstuvwxyzäåéûü0123456789:-/.& ":
        matched = set(re.findall(re.escape(letter), chars, re.I))
        assert matched and all(_fold(c) == letter for c in matched), (letter, matched)


@pytest.mark.skipif(not DEV_PDFS.is_dir(), reason=f"the development PDFs are not at {DEV_PDFS}")
def test_dev_pdfs_keep_their_cards() -> None:
    from ingest.config import DEFAULTS, loader_options
    from ingest.loaders import loader_for
    from ingest.sections import document_title
    expected = fixture()["pdfs"]
    opts = loader_options(DEFAULTS)
    for path in sorted(DEV_PDFS.glob("*.pdf")):
        if path.name not in expected:
            continue
        first = list(islice(loader_for("pdf")(path, opts), FIRST_PAGES))
        title = document_title(first[0], path.name)
        card = make_card([p.text for p in first], "" if title == PurePosixPath(path.name).name else title,
                         dict(first[0].meta), "pdf", [t for p in first for t in p.running])
        assert outcome(card) == expected[path.name], path.name


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
