"""PPTX: one page per slide, as blocks: its title (a level-1 heading), every text frame (inside group
shapes too), tables (Markdown, first row as header) and speaker notes. Page.title is the presentation's
title (core properties), if any."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

from .base import Block, LoaderOptions, Page, register
from .ooxml import check_zip, core_meta, open_error
from .tables import page_text, table_block

if TYPE_CHECKING:
    from pptx.shapes.base import BaseShape
    from pptx.slide import Slide
    from pptx.table import Table


def _table_rows(table: Table) -> list[list[str]]:
    """The table's rows of cell texts; a merged cell appears once."""
    return [[c.text.strip() for c in row.cells if not c.is_spanned] for row in table.rows]


def _shape_blocks(shapes: Iterable[BaseShape], skip_id: int | None) -> Iterator[Block]:
    """Blocks of every shape in z-order, descending into groups; the shape with `skip_id` is left out."""
    from pptx.shapes.group import GroupShape

    for shape in shapes:
        if shape.shape_id == skip_id:
            continue
        if isinstance(shape, GroupShape):
            yield from _shape_blocks(shape.shapes, skip_id)
        elif shape.has_text_frame and shape.text_frame.text.strip():
            yield Block("text", shape.text_frame.text.strip())
        elif shape.has_table and (block := table_block(_table_rows(shape.table), header_rows=1)) is not None:
            yield block


def _slide_page(number: int, slide: Slide, title: str | None) -> Page:
    blocks: list[Block] = []
    title_id = None
    if (title_shape := slide.shapes.title) is not None:
        title_id = title_shape.shape_id
        if heading := " ".join(title_shape.text_frame.text.split()):
            blocks.append(Block("heading", heading, level=1))
    blocks += _shape_blocks(slide.shapes, title_id)
    notes = slide.notes_slide.notes_text_frame if slide.has_notes_slide else None
    if notes is not None and notes.text.strip():
        blocks.append(Block("text", notes.text.strip()))
    return Page(number, page_text(blocks), title=title, blocks=tuple(blocks))


def read_pptx(path: Path) -> list[Page]:
    """One page per slide (1-based numbers) of a PPTX that passed check_zip."""
    import pptx

    try:
        deck = pptx.Presentation(str(path))
        title = (deck.core_properties.title or "").strip() or None
        meta = core_meta(deck.core_properties)
        return [replace(_slide_page(n, slide, title), meta=meta) for n, slide in enumerate(deck.slides, start=1)]
    except Exception as exc:  # python-pptx / lxml raise many types for malformed parts
        raise open_error("PPTX", exc) from None


@register("pptx", (".pptx",), "pptx")
def load(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """Every slide as a page numbered like the slide."""
    check_zip(path, options, "PPTX", "ppt/presentation.xml")
    yield from read_pptx(path)
