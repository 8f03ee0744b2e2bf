"""PPTX: one page per slide: its title, every text frame (inside group shapes too), tables and
speaker notes."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

from .base import LoaderOptions, Page, register
from .ooxml import check_zip, open_error

if TYPE_CHECKING:
    from pptx.shapes.base import BaseShape
    from pptx.slide import Slide
    from pptx.table import Table


def _table_rows(table: Table) -> Iterator[str]:
    """One line per row, cells joined by " | "; a merged cell appears once."""
    for row in table.rows:
        line = " | ".join(c.text.strip() for c in row.cells if not c.is_spanned and c.text.strip())
        if line:
            yield line


def _shape_texts(shapes: Iterable[BaseShape], skip_id: int | None) -> Iterator[str]:
    """Text of every shape in z-order, descending into groups; the shape with `skip_id` is left out."""
    from pptx.shapes.group import GroupShape

    for shape in shapes:
        if shape.shape_id == skip_id:
            continue
        if isinstance(shape, GroupShape):
            yield from _shape_texts(shape.shapes, skip_id)
        elif shape.has_text_frame and shape.text_frame.text.strip():
            yield shape.text_frame.text.strip()
        elif shape.has_table:
            yield from _table_rows(shape.table)


def _slide_page(number: int, slide: Slide) -> Page:
    title, title_id = None, None
    if (title_shape := slide.shapes.title) is not None:
        title, title_id = title_shape.text_frame.text.strip() or None, title_shape.shape_id
    lines = [title] if title else []
    lines += _shape_texts(slide.shapes, title_id)
    notes = slide.notes_slide.notes_text_frame if slide.has_notes_slide else None
    if notes is not None and notes.text.strip():
        lines.append(notes.text.strip())
    return Page(number, "\n".join(lines), title=title)


def read_pptx(path: Path) -> list[Page]:
    """One page per slide (1-based numbers) of a PPTX that passed check_zip."""
    import pptx

    try:
        slides = pptx.Presentation(str(path)).slides
        return [_slide_page(n, slide) for n, slide in enumerate(slides, start=1)]
    except Exception as exc:  # python-pptx / lxml raise many types for malformed parts
        raise open_error("PPTX", exc) from None


@register("pptx", (".pptx",), "pptx")
def load(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """Every slide as a page numbered like the slide."""
    check_zip(path, options, "PPTX", "ppt/presentation.xml")
    yield from read_pptx(path)
