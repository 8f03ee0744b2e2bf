"""The structure step (ingest.sections, ingest.chunk.section_chunks): sections follow the heading path
across pages, tables are chunked by whole rows under their header, every chunk is embedded under its
context line, and non-language text is skipped."""
from __future__ import annotations

import base64
import random

import numpy as np

from ingest.chunk import ChunkSpec, section_chunks
from ingest.loaders import Block, Page
from ingest.model_ref import resolve_model
from ingest.junk import is_junk
from ingest.sections import Doc, Outline, context_line, document_title, page_sections
from ingest.workers.encode import load_tokenizer

MODEL = resolve_model("default")
SPEC = ChunkSpec(MODEL.tokenizer_file, MODEL.max_seq_length, 60, 10, 48, True)
WORDS = "river stone lantern harvest quiet meadow copper signal window orchard thunder ledger".split()


def prose(n: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n)) + "."


def test_the_heading_path_follows_the_document_across_pages() -> None:
    outline = Outline()
    one = Page(1, "", blocks=(Block("heading", "Part II", 1), Block("heading", "Item 7. Results", 2),
                              Block("text", prose(20), bbox=(10, 100, 300, 140)),
                              Block("text", prose(20, 2), bbox=(10, 150, 300, 190)),
                              Block("heading", "Liquidity", 3), Block("text", prose(10, 3))))
    two = Page(2, "", blocks=(Block("text", prose(15, 4)), Block("heading", "Item 8. Statements", 2),
                              Block("table", "| Revenue | 10 | 12 |", header="| | 2023 | 2022 |\n|---|---|---|")))
    first, second = page_sections(one, outline), page_sections(two, outline)
    assert [s.headings for s in first] == [("Part II", "Item 7. Results"), ("Part II", "Item 7. Results", "Liquidity")]
    assert first[0].text == prose(20) + "\n\n" + prose(20, 2) and "Part II" not in first[0].text
    assert first[0].boxes[1][0] == len(prose(20)) + 2
    assert [(s.headings, s.element) for s in second] == [(("Part II", "Item 7. Results", "Liquidity"), "text"),
                                                        (("Part II", "Item 8. Statements"), "table")]
    assert [s.index for s in second] == [0, 1]
    plain = page_sections(Page(3, "just text"), outline)
    assert plain[0].headings == ("Part II", "Item 8. Statements") and plain[0].text == "just text"


def test_a_table_is_chunked_by_whole_rows_each_chunk_under_its_header() -> None:
    header = "| Item | FY2023 | FY2022 |\n|---|---|---|"
    rows = [f"| {WORDS[i % 12]} line {i} | {1000 + i:,} | {900 + i:,} |" for i in range(40)]
    outline = Outline(("Item 8. Financial Statements",))
    (section,) = page_sections(Page(5, "", blocks=(Block("table", "\n".join(rows), header=header),)), outline)
    chunks = section_chunks(section, SPEC, Doc("ACME_2023_10K.pdf", "ACME_2023_10K.pdf"))
    assert len(chunks.chunks) > 2 and chunks.element == "table" and chunks.headings == "Item 8. Financial Statements"
    seen = []
    for chunk in chunks.chunks:
        head, *body = chunk.split("\n")
        assert "\n".join([head, body[0]]) == header                      # the header rows lead every chunk
        assert all(row in rows for row in body[1:])                      # rows are never cut
        seen += body[1:]
    assert seen == rows                                                  # every row once, in order (no overlap)
    exact = load_tokenizer(MODEL.tokenizer_file, MODEL.max_seq_length)[0]
    line = context_line("ACME_2023_10K.pdf", "ACME_2023_10K.pdf", section.headings)
    first = chunks.ids[:chunks.lengths[0]].tolist()                     # embedded without pipes and rule
    assert first == exact.encode(f"{line}\nItem FY2023 FY2022\n" + "\n".join(
        " ".join(r.strip("| ").split(" | ")) for r in chunks.chunks[0].splitlines()[2:])).ids


def test_each_chunk_is_embedded_under_its_context_line_and_stored_clean() -> None:
    (section,) = page_sections(Page(7, "", blocks=(Block("heading", "Liquidity and Capital Resources", 2),
                                                   Block("text", prose(120), bbox=(50, 60, 500, 700)))), Outline())
    doc = Doc("filings/ACME_2023_10K.pdf", "Acme Corp Annual Report")
    chunks = section_chunks(section, SPEC, doc)
    line = context_line(doc.source, doc.title, section.headings)
    assert line == "filings/ACME 2023 10K > Acme Corp Annual Report > Liquidity and Capital Resources"
    exact = load_tokenizer(MODEL.tokenizer_file, MODEL.max_seq_length)[0]
    offsets = np.concatenate([[0], np.cumsum(chunks.lengths)])
    for i, chunk in enumerate(chunks.chunks):
        assert "ACME" not in chunk and "Liquidity" not in chunk           # the stored text is the chunk alone
        ids = chunks.ids[offsets[i]:offsets[i + 1]].tolist()
        assert ids == exact.encode(f"{line}\n{chunk}").ids                 # what the model sees
        assert len(ids) <= MODEL.max_seq_length
    assert chunks.bboxes == ("50.0,60.0,500.0,700.0",) * len(chunks.chunks)
    assert chunks.title == "Acme Corp Annual Report"
    # no room left by the chunk, or context_tokens = 0: the plain chunk
    plain = section_chunks(section, ChunkSpec(MODEL.tokenizer_file, MODEL.max_seq_length, 60, 10, 0), doc)
    assert plain.chunks == chunks.chunks and plain.ids[:plain.lengths[0]].tolist() == exact.encode(chunks.chunks[0]).ids


def test_a_long_context_line_is_cut_to_its_token_budget() -> None:
    spec = ChunkSpec(MODEL.tokenizer_file, MODEL.max_seq_length, 200, 30, 48, True)
    headings = tuple(f"Heading number {i} about {WORDS[i % 12]}" for i in range(30))
    (section,) = page_sections(Page(1, prose(400)), Outline(headings))
    chunks = section_chunks(section, spec, Doc("a.pdf", "a.pdf"))
    assert max(chunks.lengths) <= MODEL.max_seq_length
    assert spec.context_room == min(48, MODEL.max_seq_length - 2 - 200)


def test_the_title_skips_identifiers_and_generic_names() -> None:
    assert document_title(Page(1, "", title="0000004962-23-000006"), "AMEX_2022_10K.pdf") == "AMEX_2022_10K.pdf"
    assert document_title(Page(1, "", title="Microsoft Word - Q3 review.docx"), "x.docx") == "Q3 review.docx"
    heading = Page(1, "", title="untitled", blocks=(Block("heading", "Annual Report 2023", 1),))
    assert document_title(heading, "r.pdf") == "Annual Report 2023"
    assert context_line("a/b/report_final.md", "report_final.md", ()) == "a/b/report final"


def test_junk_is_detected_and_language_tables_and_leaders_are_not() -> None:
    rng = random.Random(5)
    blob = base64.b64encode(bytes(rng.randrange(256) for _ in range(3000))).decode()
    assert is_junk(blob) and is_junk("\n".join(blob[i:i + 76] for i in range(0, len(blob), 76)))
    assert is_junk(" ".join(f"{rng.randrange(256):02x}" for _ in range(300)))                # a hex dump
    assert is_junk(bytes(rng.randrange(256) for _ in range(800)).decode("latin-1"))         # binary as text
    assert not is_junk("| Revenue | $ 1,234 | $ 2,345 | (123) |\n" * 20)
    assert not is_junk("Risk Factors" + "." * 80 + " 12\nProperties" + "." * 80 + " 31")
    assert not is_junk(prose(100)) and not is_junk("see https://example.com/" + "a1b2c3" * 20 + " for more")
    assert not is_junk("deadbeef cafe face")                                               # too short to judge
    spec = ChunkSpec(MODEL.tokenizer_file, MODEL.max_seq_length, 200, 30, 48, True)
    mixed = prose(150) + "\n\n" + "\n".join(blob[i:i + 76] for i in range(0, len(blob), 76)) + "\n\n" + prose(150, 2)
    chunks = section_chunks(page_sections(Page(None, mixed), Outline())[0], spec, Doc("m.txt", "m.txt"))
    assert chunks.junk >= 5 and all(not is_junk(c) for c in chunks.chunks)
    assert any(prose(150)[:40] in c for c in chunks.chunks) and any(prose(150, 2)[-40:] in c for c in chunks.chunks)


def test_a_short_caption_and_footnote_join_their_table() -> None:
    blocks = (Block("heading", "Other liabilities", 2),
              Block("text", "The following is a summary of Other liabilities as of December 31:", bbox=(72, 90, 400, 100)),
              Block("table", "| Accrued interest | 1,204 | 1,090 |", header="| | 2022 | 2021 |\n|---|---|---|",
                    bbox=(72, 110, 540, 200)),
              Block("text", "See Note 6 for leases.", bbox=(72, 210, 300, 220)),
              Block("heading", "Leases", 2), Block("text", prose(200, 8)))
    table, text = page_sections(Page(9, "", blocks=blocks), Outline())
    assert (table.element, table.index, text.element, text.index) == ("table", 0, "text", 1)
    assert table.header.startswith("The following is a summary of Other liabilities")
    assert table.text.endswith("\nSee Note 6 for leases.") and text.text == prose(200, 8)
    long = page_sections(Page(9, "", blocks=(Block("text", prose(200, 8)), blocks[2])), Outline())
    assert [s.element for s in long] == ["text", "table"]                # a paragraph is no caption
    (chunk,) = section_chunks(table, SPEC, Doc("a.pdf", "a.pdf")).chunks
    assert chunk.splitlines()[0].startswith("The following is") and "Accrued interest" in chunk
    assert section_chunks(table, SPEC, Doc("a.pdf", "a.pdf")).bboxes == ("72.0,90.0,540.0,220.0",)


def test_a_page_of_headings_alone_keeps_them_as_its_text() -> None:
    outline = Outline(("Deck",))
    cover = Page(1, "", blocks=(Block("heading", "FORM 10-K", 1, bbox=(10, 10, 100, 30)),
                                Block("heading", "Acme Corp", 2, bbox=(10, 40, 120, 60))))
    (section,) = page_sections(cover, outline)
    assert (section.text, section.headings, section.boxes) == ("FORM 10-K\nAcme Corp", ("Deck",),
                                                              ((0, 19, (10, 10, 120, 60)),))
    assert outline.path == ("FORM 10-K", "Acme Corp")                 # the headings still head what follows


def test_a_statement_title_in_a_table_reaches_its_chunks_and_its_continuation() -> None:
    """Issue 33, item 2: "Consolidated Statements of Cash Flows" set as a table's first rows (not a heading)
    joins the table's heading path, so its context line; the same table continued on the next page keeps it;
    a heading or text in between ends it; a sentence naming "these statements of operations" is no title."""
    outline = Outline()
    one = Page(1, "", blocks=(Block("heading", "Critical Audit Matters", 2),
                              Block("table", "| The Acme Company | | Consolidated Statements of Cash Flows |\n"
                                             "| Net income | 10 | 12 |", header="| | 2023 | 2022 |"),))
    two = Page(2, "", blocks=(Block("table", "| Capital expenditures | (5) | (4) |", header="| | 2023 | 2022 |"),
                              Block("text", "The accompanying notes are an integral part of these statements of "
                                            "operations and of these statements of income."),
                              Block("table", "| Other | 1 | 2 |")))
    three = Page(3, "", blocks=(Block("text", "CONSOLIDATED BALANCE SHEETS"), Block("table", "| Cash | 3 | 4 |"),
                                Block("heading", "Notes", 2), Block("table", "| Leases | 5 | 6 |")))
    first, second, third = (page_sections(p, outline) for p in (one, two, three))
    title = ("Critical Audit Matters", "Consolidated Statements of Cash Flows")
    assert [s.headings for s in first] == [title]
    assert [s.headings for s in second] == [title, ("Critical Audit Matters",)]      # the text: the 2nd's caption
    assert [s.headings for s in third] == [("Critical Audit Matters", "CONSOLIDATED BALANCE SHEETS"), ("Notes",)]
    assert Doc("acme-10k.pdf", "Acme").context(first[0].headings).endswith("> Consolidated Statements of Cash Flows")
