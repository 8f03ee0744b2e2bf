"""OCR one page of a PDF or image: render it with PyMuPDF, recognize it with RapidOCR (bundled
Chinese+English models) or, when configured, PaddleOCR with local models. Nothing downloads."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .base import Block, LoaderError, OcrOptions, Page
from .image import MEGAPIXEL
from .pdf import damaged, import_pymupdf, mupdf_errors, open_document
from .pdf_layout import PAGE_NUMBER

if TYPE_CHECKING:
    import numpy as np

EDGE_BAND = 0.1        # a lone page number in the top or bottom tenth of a page is left out of its blocks
PARAGRAPH_GAP = 0.8    # a vertical gap of this many row heights starts a new text block
MAX_SIDE_PX = 4000      # larger renders only cost time: the detector downsizes to 2000 px anyway
PADDLE_HELP = ("the paddleocr backend needs paddleocr and local models: pip install paddleocr, and set "
               "[loaders.ocr] paddle_model_dir to a directory holding det/, rec/ and cls/ model folders")

Box = Sequence[Sequence[float]]          # four (x, y) corners
_ENGINES: dict[str, Any] = {}            # one engine per backend per process


def render(path: Path, page: int, options: OcrOptions) -> np.ndarray:
    """Page `page` (1-based) as a BGR array: PDFs at options.dpi, images at their own resolution, both
    scaled down to stay within MAX_SIDE_PX and options.max_image_mp."""
    return _render(path, page, options)[0]


def _render(path: Path, page: int, options: OcrOptions) -> tuple[np.ndarray, float | None]:
    """render's array, and the PDF points per pixel for a PDF page (None for an image)."""
    import numpy as np

    pymupdf: Any = import_pymupdf(layout=False)     # OCR renders: no layout model

    kind = "PDF" if path.suffix.lower() == ".pdf" else "image"
    with open_document(path, options.passwords, kind) as doc:
        if not 1 <= page <= doc.page_count:
            raise LoaderError(f"page {page} does not exist (the {kind} has {doc.page_count}); rescan the file")
        try:
            pg = doc[page - 1]
            images = pg.get_image_info() if not doc.is_pdf else []
            zoom = images[0]["width"] / pg.rect.width if images else options.dpi / 72
            zoom = min(zoom, MAX_SIDE_PX / max(pg.rect.width, pg.rect.height),
                       max_zoom(pg.rect.width, pg.rect.height, options.max_image_mp * MEGAPIXEL))
            pix = pg.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), colorspace=pymupdf.csRGB, alpha=False)
            scale = pg.rect.width / pix.width if doc.is_pdf else None
        except mupdf_errors() as exc:
            raise damaged(f"page {page} of the {kind}", exc) from None
    rgb = np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.width, 3)
    return np.ascontiguousarray(rgb[:, :, ::-1]), scale


def max_zoom(width: float, height: float, max_pixels: float) -> float:
    """The largest zoom at which a width x height page renders to at most `max_pixels`, counting the
    pixel each edge may gain when rounded outward: (width*z + 2) * (height*z + 2) <= max_pixels."""
    a, b, c = width * height, 2 * (width + height), 4 - max_pixels
    return (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)


def _rows(lines: list[tuple[Box, str]]) -> list[tuple[float, float, list[tuple[Box, str]]]]:
    """Recognized lines in rows, top to bottom: (top, bottom, boxes left to right); boxes whose middle
    lies within a row's first box's height share the row."""
    rows: list[tuple[float, float, list[tuple[Box, str]]]] = []
    for box, text in sorted(lines, key=lambda item: min(y for _, y in item[0])):
        top, bottom = min(y for _, y in box), max(y for _, y in box)
        if rows and (top + bottom) / 2 < rows[-1][1]:
            rows[-1][2].append((box, text))
        else:
            rows.append((top, bottom, [(box, text)]))
    return [(t, b, sorted(row, key=lambda item: min(x for x, _ in item[0]))) for t, b, row in rows]


def reading_order(lines: list[tuple[Box, str]]) -> str:
    """Join recognized lines top-to-bottom; boxes whose middle lies within a row's height share the row,
    left-to-right."""
    return "\n".join(" ".join(text for _, text in row) for _, _, row in _rows(lines))


def ocr_blocks(lines: list[tuple[Box, str]], height: float, scale: float) -> list[Block]:
    """Text blocks of rows separated by a gap, bboxes in PDF points (pixels * scale); a lone page number
    in the top or bottom band of a page `height` pixels high is left out."""
    blocks: list[Block] = []
    group: list[tuple[str, Box]] = []
    last_bottom = None
    for top, bottom, row in _rows(lines):
        text = " ".join(t for _, t in row).strip()
        edge = bottom < EDGE_BAND * height or top > (1 - EDGE_BAND) * height
        if not text or (edge and PAGE_NUMBER.match(text)):
            continue
        if group and last_bottom is not None and top - last_bottom > PARAGRAPH_GAP * (bottom - top):
            blocks.append(_ocr_block(group, scale))
            group = []
        group += [(text, tuple(pt for box, _ in row for pt in box))]
        last_bottom = bottom
    if group:
        blocks.append(_ocr_block(group, scale))
    return blocks


def _ocr_block(group: list[tuple[str, tuple]], scale: float) -> Block:
    xs = [p[0] for _, pts in group for p in pts]
    ys = [p[1] for _, pts in group for p in pts]
    bbox = tuple(round(v * scale, 1) for v in (min(xs), min(ys), max(xs), max(ys)))
    return Block("text", "\n".join(text for text, _ in group), bbox=bbox)


# Text lines recognized one at a time: in a batch every line is padded to the widest one's width, which costs
# CPU and accuracy (bench/ocr_rec_batch.py: 6 dense filing pages at 200 dpi, 34 % less CPU and a better word F1
# against the text layer on every page than RapidOCR's default of 6).
REC_BATCH = 1
# Text lines are found on the page scaled down to this longest side (RapidOCR's own: up to 2,000 pixels); they
# are still cut from the full page for recognition. bench/ocr_det_side.py, without the angle classifier: word F1
# 0.84 -> 0.94 on the six pages where it was chosen, 0.88 -> 0.96 on 11 held-out pages, a quarter less CPU.
DET_SIDE = 1280


def rapidocr_engine(options: OcrOptions, det_side: int = DET_SIDE) -> Any:
    """A RapidOCR engine as OCR workers run it: the rewritten models (ocr_graph), lines found at `det_side`, and
    no angle classifier: each line is read as it stands and, when it cannot be read so, turned half round
    (_EitherWayUp). Call it as engine(image, use_cls=False)."""
    from rapidocr_onnxruntime import RapidOCR
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DetPreProcess

    from .ocr_graph import fast_models

    # options.threads shares the cores between OCR workers instead of every worker using all of them.
    engine = RapidOCR(intra_op_num_threads=options.threads, rec_batch_num=REC_BATCH,
                      **fast_models(options.model_cache))
    det, own = engine.text_det, engine.text_det.get_preprocess
    det.get_preprocess = lambda longest: (DetPreProcess(det_side, "max", det.mean, det.std) if longest > det_side
                                          else own(longest))
    engine.text_rec = _EitherWayUp(engine.text_rec, engine.text_score)
    return engine


class _EitherWayUp:
    """RapidOCR's recognizer, reading a line turned half round when it cannot read it as it stands (score under
    RapidOCR's text_score, below which the line is dropped). RapidOCR's angle classifier squeezes a line into
    192 x 48 pixels: it turned long upright lines of scanned letters over with 0.91-0.998 confidence, and the line,
    read upside down, was dropped (9 of 39 lines of one page of the development set)."""

    def __init__(self, recognize: Any, min_score: float) -> None:
        self.recognize, self.min_score = recognize, min_score
        self.lines = self.turned = 0            # of the last call: lines read, and of them read turned round

    def __call__(self, crops: list[np.ndarray], return_word_box: bool = False) -> tuple[list, float]:
        import numpy as np

        found, spent = self.recognize(crops, return_word_box)
        low = [i for i, line in enumerate(found) if line[1] < self.min_score]
        self.lines, self.turned = len(found), 0
        if low:
            turned, more = self.recognize([np.ascontiguousarray(crops[i][::-1, ::-1]) for i in low], return_word_box)
            for i, line in zip(low, turned):
                if line[1] > found[i][1]:
                    found[i] = line
                    self.turned += 1
            spent += more
        return found, spent


def _rapidocr(image: np.ndarray, options: OcrOptions) -> list[tuple[Box, str]]:
    if "rapidocr" not in _ENGINES:
        _ENGINES["rapidocr"] = rapidocr_engine(options)
    engine = _ENGINES["rapidocr"]
    engine.text_rec.lines = engine.text_rec.turned = 0          # a page without text lines never reaches it
    result, _ = engine(image, use_cls=False)
    if engine.text_rec.turned * 2 > engine.text_rec.lines:
        # Most lines read only turned round: the page is upside down. Read it turned, so that its lines come in
        # order; their boxes are then the turned page's, as a reader holds it.
        result, _ = engine(image[::-1, ::-1].copy(), use_cls=False)
    return [(box, text) for box, text, _score in result or []]


def _paddleocr(image: np.ndarray, options: OcrOptions) -> list[tuple[Box, str]]:
    """PaddleOCR 3.x with det/, rec/ and cls/ under paddle_model_dir (never its downloads)."""
    model_dir = options.paddle_model_dir
    dirs = {name: Path(model_dir, name) for name in ("det", "rec", "cls")}
    if not model_dir or not all(d.is_dir() for d in dirs.values()):
        raise LoaderError(PADDLE_HELP)
    if "paddleocr" not in _ENGINES:
        os.environ.setdefault("PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK", "True")
        try:
            from paddleocr import PaddleOCR
        except ImportError:
            raise LoaderError(PADDLE_HELP) from None
        _ENGINES["paddleocr"] = PaddleOCR(
            text_detection_model_dir=str(dirs["det"]), text_recognition_model_dir=str(dirs["rec"]),
            textline_orientation_model_dir=str(dirs["cls"]), use_textline_orientation=True,
            use_doc_orientation_classify=False, use_doc_unwarping=False)
    lines: list[tuple[Box, str]] = []
    for res in _ENGINES["paddleocr"].predict(image):
        lines += [(poly.tolist(), text) for poly, text in zip(res["rec_polys"], res["rec_texts"])]
    return lines


_BACKENDS = {"rapidocr": _rapidocr, "paddleocr": _paddleocr}


def ocr_page(path: Path, page: int, options: OcrOptions) -> Page:
    """Render page `page` (1-based) of a PDF or image and OCR it: Page(page, text, needs_ocr=False), with
    text blocks (bboxes in PDF points) for a PDF page.

    `options.passwords` unlocks encrypted PDFs.
    """
    if options.backend not in _BACKENDS:
        raise LoaderError(f"unknown OCR backend {options.backend!r}; "
                          "set [loaders.ocr] backend to rapidocr or paddleocr")
    image, scale = _render(path, page, options)
    lines = _BACKENDS[options.backend](image, options)
    blocks = tuple(ocr_blocks(lines, image.shape[0], scale)) if scale else ()
    return Page(page, reading_order(lines), needs_ocr=False, blocks=blocks)
