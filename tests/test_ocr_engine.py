"""How OCR workers run RapidOCR: the rewritten models (loaders/ocr_graph.py) read the same lines as the bundled
ones, the rewrite on a graph built here, the cache's rules (kept, refused, unwritable); and a scanned letter
loses no line, upright or upside down (loaders/ocr.py rapidocr_engine)."""
from __future__ import annotations

import difflib
from pathlib import Path

import numpy as np
import pytest

import docs
from ingest.loaders import ocr_graph
from ingest.loaders.ocr import ocr_page, render
from test_loaders import ocr_opts

LINES = ("Quarterly results were announced on the first Tuesday of the month, as the board had agreed in March, "
         "and dividends of 0.52 per share follow.\nNet cash from operating activities: 4,471 million\n"
         "扫描文件中的中文识别测试")


def _lines(engine, image: np.ndarray) -> list[tuple[list, str]]:
    result, _ = engine(image)
    return [(np.asarray(box).round(2).tolist(), text) for box, text, _ in result or []]


def test_rewritten_models_read_a_scan_line_for_line_as_the_bundled_ones(tmp_path: Path) -> None:
    from rapidocr_onnxruntime import RapidOCR

    fast = ocr_graph.fast_models(str(tmp_path / "cache"))
    assert sorted(fast) == ["det_model_path", "rec_model_path"]
    image = render(docs.make_scanned_pdf(tmp_path / "scan.pdf", [LINES], (595.0, 400.0)), 1, ocr_opts())
    bundled = _lines(RapidOCR(intra_op_num_threads=1, rec_batch_num=1), image)
    rewritten = _lines(RapidOCR(intra_op_num_threads=1, rec_batch_num=1, **fast), image)
    assert len(bundled) >= 3 and "4,471" in " ".join(t for _, t in bundled)
    assert [t for _, t in rewritten] == [t for _, t in bundled]
    # the same boxes (equal here; a pixel of slack for another CPU's float rounding at the detector's threshold)
    assert np.abs(np.array([b for b, _ in rewritten]) - np.array([b for b, _ in bundled])).max() <= 1.0


def _graph(pad_second: bool):
    """x -> Conv 3x3 (no pad) -> *a +b -> hard swish (4 nodes) -> *c +d -> Conv (1x1, or 3x3 padded) -> y."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    k2 = 3 if pad_second else 1
    inits = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in [
        ("w1", rng.normal(size=(8, 3, 3, 3))), ("b1", rng.normal(size=8)),
        ("w2", rng.normal(size=(4, 8, k2, k2))), ("b2", rng.normal(size=4)),
        ("a", np.array([1.7])), ("b", np.array([0.4])), ("three", np.array([3.0])), ("zero", np.array(0.0)),
        ("six", np.array(6.0)), ("six1", np.array([6.0])), ("c", np.array([0.3])), ("d", np.array([-0.2]))]]
    pads = dict(pads=[1, 1, 1, 1]) if pad_second else {}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
             helper.make_node("Mul", ["a", "c1"], ["m1"]), helper.make_node("Add", ["m1", "b"], ["s1"]),
             helper.make_node("Add", ["s1", "three"], ["h1"]), helper.make_node("Clip", ["h1", "zero", "six"], ["h2"]),
             helper.make_node("Mul", ["s1", "h2"], ["h3"]), helper.make_node("Div", ["h3", "six1"], ["h4"]),
             helper.make_node("Mul", ["c", "h4"], ["m2"]), helper.make_node("Add", ["m2", "d"], ["s2"]),
             helper.make_node("Conv", ["s2", "w2", "b2"], ["y"], **pads)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])


@pytest.mark.parametrize("pad_second", [False, True])
def test_fold_keeps_the_arithmetic_and_leaves_an_affine_before_a_padded_conv(pad_second: bool) -> None:
    import onnxruntime as ort

    model = _graph(pad_second)
    before = model.SerializeToString()
    done = ocr_graph.fold(model)
    expected = {"affine into the conv before": 1, "hard swish": 1}
    if not pad_second:
        expected["affine into the conv after"] = 1
    assert dict(done) == expected
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == 2 and "Clip" not in ops and "Div" not in ops
    assert ops.count("Add") == (1 if pad_second else 0)     # the padded conv keeps its +d
    x = np.random.default_rng(2).normal(size=(1, 3, 16, 20)).astype(np.float32)
    old = ort.InferenceSession(before, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    new = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(new, old, rtol=1e-4, atol=1e-4)


def test_cache_kept_refused_and_unwritable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    first = ocr_graph.fast_models(str(cache))
    stamps = {p: Path(p).stat().st_mtime_ns for p in first.values()}
    assert ocr_graph.fast_models(str(cache)) == first                      # found, not rewritten again
    assert {p: Path(p).stat().st_mtime_ns for p in first.values()} == stamps

    real = ocr_graph.fold
    calls = []

    def wrong(model):                 # a rewrite that changes the arithmetic: the check must refuse it
        calls.append(1)
        done = real(model)
        gate = next(n for n in model.graph.node if n.op_type == "HardSigmoid")
        next(a for a in gate.attribute if a.name == "alpha").f = 0.3
        return done

    monkeypatch.setattr(ocr_graph, "fold", wrong)
    other = tmp_path / "other"
    assert ocr_graph.fast_models(str(other)) == {}                         # RapidOCR's own models
    assert len(list((other / "ocr").glob("*.refused"))) == len(ocr_graph.MODELS) and not list((other / "ocr").glob("*.onnx"))
    tried = len(calls)
    assert ocr_graph.fast_models(str(other)) == {} and len(calls) == tried    # a refusal is not retried

    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert ocr_graph.fast_models(str(blocked)) == {}                       # cannot be written: the bundled models
    assert ocr_graph.fast_models("") == {}


PROSE = ("On behalf of the Company and its Board of Directors, we are pleased to offer you the position of Chief "
         "Executive Officer and President, effective on the second day of February. As Chief Executive Officer you "
         "shall have the authority to control the day-to-day operations of the Company and its subsidiaries, subject "
         "to the Bylaws and the delegations of the Board. Base salary: you will receive a bi-weekly salary which, "
         "when annualized, would be approximately one million dollars, subject to applicable withholdings. The "
         "salary will be reviewed annually based on your performance as assessed by the Executive Development and "
         "Compensation Committee of the Board. You will continue to participate in the annual performance plan, and "
         "your target award will be based on the level of progress towards achieving the goals set in the year.")


def _letter(path: Path, upside_down: bool) -> Path:
    """A scanned letter: long lines of 10.5-pt prose on a US Letter page, as a 150-dpi grayscale image."""
    import pymupdf

    with pymupdf.open() as src:
        page = src.new_page(width=612, height=792)
        page.insert_textbox(pymupdf.Rect(72, 72, 540, 720), PROSE, fontsize=10.5, fontname="tiro")
        pix = page.get_pixmap(dpi=150, colorspace=pymupdf.csGRAY)
    if upside_down:
        turned = np.frombuffer(pix.samples, np.uint8).reshape(pix.h, pix.w)[::-1, ::-1].tobytes()
        pix = pymupdf.Pixmap(pymupdf.csGRAY, pix.w, pix.h, turned, 0)
    with pymupdf.open() as doc:
        page = doc.new_page(width=612, height=792)
        page.insert_image(page.rect, pixmap=pix)
        doc.save(path)
    return path


@pytest.mark.parametrize("upside_down", [False, True])
def test_a_scanned_letter_loses_no_line(tmp_path: Path, upside_down: bool) -> None:
    """RapidOCR's angle classifier turned long upright lines over, and they were dropped as unreadable (6 of the
    137 words here, 9 of 39 lines of a page of the development set). Without it, every line is read in order; an
    upside-down page is read turned round."""
    page = ocr_page(_letter(tmp_path / "letter.pdf", upside_down), 1, ocr_opts())
    want, got = PROSE.lower().split(), page.text.lower().split()
    assert difflib.SequenceMatcher(None, want, got, autojunk=False).ratio() >= 0.95, page.text
