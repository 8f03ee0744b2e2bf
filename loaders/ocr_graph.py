"""RapidOCR's bundled models with the same arithmetic in fewer ONNX nodes, made once per machine.

PaddleOCR's PP-LCNetV3 backbone (the v4 detector and recognizer) follows each convolution with a learnable
scalar affine, a hard swish written as four elementwise nodes (x * Clip(x + 3, 0, 6) / 6) and another
scalar affine. ONNX Runtime fuses none of them, so on the CPU over half of a text line's recognition was
elementwise passes over big activations and layout reorders between them (bench/ocr_graph.py). The rewrite:

    Conv -> Mul(a) -> Add(b)                 Conv with weights a*W and bias a*B + b
    Add(3) -> Clip(0, 6) -> Mul(x) -> Div(6)  x * HardSigmoid(x, 1/6, 1/2), which ONNX Runtime fuses into
                                             the convolution before it
    Mul(c) -> Add(d) -> Conv without padding Conv with weights c*W and bias B + d * sum(W)

A convolution that pads keeps the affine in front of it (zero padding of c*x + d is not d).

NOTE: the cache. The rewritten models live in `cache_dir`/ocr, named by the bundled file's name, size and
modification time and REWRITE_VERSION, written by os.replace (two OCR workers starting together may both write:
the files are equal). Before a rewritten model is kept, it and the bundled one run on a fixed input, and their
outputs must agree within TOLERANCE; otherwise, or when the cache cannot be written, OCR uses the bundled model
(a `.refused` file records a refusal, so that it is not retried by every worker).
"""
from __future__ import annotations

import hashlib
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REWRITE_VERSION = "1"
TOLERANCE = 1e-4          # max |new - old| / (1 + max |old|) on the check input
MODELS = {"det": (1, 3, 96, 128), "rec": (1, 3, 48, 320)}   # check input shapes (the angle classifier: unused)


def fast_models(cache_dir: str) -> dict[str, str]:
    """RapidOCR keywords (det_model_path, rec_model_path) naming the rewritten models; a model
    that cannot be rewritten, checked or cached is left out, so RapidOCR uses its own."""
    if not cache_dir:
        return {}
    import rapidocr_onnxruntime

    bundled = Path(rapidocr_onnxruntime.__file__).parent / "models"
    paths: dict[str, str] = {}
    for kind, shape in MODELS.items():
        found = sorted(bundled.glob(f"*_{kind}_infer.onnx"))
        if len(found) == 1:
            fast = _cached(found[0], Path(cache_dir) / "ocr", shape)
            if fast:
                paths[f"{kind}_model_path"] = fast
    return paths


def _cached(source: Path, folder: Path, shape: tuple[int, ...]) -> str | None:
    st = source.stat()
    key = hashlib.sha256(f"{REWRITE_VERSION}\0{source.name}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    target = folder / f"{source.stem}-{key}.onnx"
    refused = target.with_suffix(".refused")
    if target.is_file():
        return str(target)
    if refused.exists():
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        data, ok = _rewrite_and_check(source, shape)
        out = refused if not ok else target
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data if ok else b"")
        os.replace(tmp, out)
    except (OSError, ValueError, RuntimeError):
        return None             # a cache that cannot be written, a graph that cannot be read: the bundled model
    return str(target) if ok else None


def _rewrite_and_check(source: Path, shape: tuple[int, ...]) -> tuple[bytes, bool]:
    import numpy as np
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(source))
    if not sum(fold(model).values()):
        return b"", False       # nothing to gain: the bundled model
    data = model.SerializeToString()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = 1, 4
    old = ort.InferenceSession(str(source), opts, providers=["CPUExecutionProvider"])
    new = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    # dark strokes in lines on a light page, with noise: the detector finds text lines in it
    r, c = np.arange(shape[2])[:, None] % 32, np.arange(shape[3])[None, :]
    x = np.where((r > 8) & (r < 20) & (c % 6 < 2) & (c % 64 < 50), -1.0, 1.0)
    x = x + np.random.default_rng(0).uniform(-0.1, 0.1, shape)
    feed = {old.get_inputs()[0].name: x.astype(np.float32)}
    a, b = old.run(None, feed)[0], new.run(None, feed)[0]
    return data, bool(np.abs(a - b).max() <= TOLERANCE * (1 + np.abs(a).max()))


def fold(model: Any) -> Counter:
    """Rewrite `model` (an onnx ModelProto) in place as the module docstring says; how many of each rewrite."""
    from onnx import helper, numpy_helper

    g = model.graph
    values = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in g.node
              if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value"}
    values.update((i.name, numpy_helper.to_array(i)) for i in g.initializer)
    added: dict[str, Any] = {}
    outputs = {o.name for o in g.output}
    nodes = list(g.node)
    done: Counter = Counter()

    def scalar(name: str) -> float | None:
        v = values.get(name)
        return float(v.ravel()[0]) if v is not None and v.size == 1 else None

    def consumers() -> dict[str, list]:
        users: dict[str, list] = defaultdict(list)
        for n in nodes:
            for i in n.input:
                users[i].append(n)
        return users

    def only(users: dict[str, list], name: str, op: str) -> Any:
        """The one node reading `name`, if it is an `op` and nothing else reads `name`."""
        if name in outputs or len(users[name]) != 1 or users[name][0].op_type != op:
            return None
        return users[name][0]

    def other(node: Any, name: str) -> str:
        return node.input[1] if node.input[0] == name else node.input[0]

    def set_conv(conv: Any, x: str, w: Any, bias: Any, tag: str) -> None:
        wn, bn = f"{conv.output[0]}.{tag}w", f"{conv.output[0]}.{tag}b"
        values[wn] = added[wn] = w.astype("float32")
        values[bn] = added[bn] = bias.astype("float32")
        conv.ClearField("input")
        conv.input.extend([x, wn, bn])

    def conv_parts(conv: Any) -> tuple[Any, Any] | None:
        if len(users[conv.input[1]]) != 1 or values.get(conv.input[1]) is None:
            return None
        w = values[conv.input[1]]
        bias = values.get(conv.input[2]) if len(conv.input) > 2 else w[:, 0, 0, 0] * 0
        return (w, bias) if bias is not None and w.ndim == 4 else None

    def pads(conv: Any) -> bool:
        attrs = {a.name: a for a in conv.attribute}
        auto = attrs["auto_pad"].s.decode() if "auto_pad" in attrs else "NOTSET"
        return auto not in ("NOTSET", "VALID") or any(attrs["pads"].ints if "pads" in attrs else ())

    # Conv -> Mul(a) -> Add(b)
    users, drop = consumers(), set()
    for n in nodes:
        mul = only(users, n.output[0], "Mul") if n.op_type == "Conv" else None
        a = scalar(other(mul, n.output[0])) if mul else None
        add = only(users, mul.output[0], "Add") if a is not None else None
        b = scalar(other(add, mul.output[0])) if add else None
        parts = conv_parts(n) if b is not None else None
        if parts:
            set_conv(n, n.input[0], parts[0] * a, parts[1] * a + b, "pre")
            n.output[0] = add.output[0]
            drop |= {id(mul), id(add)}
            done["affine into the conv before"] += 1
    nodes = [n for n in nodes if id(n) not in drop]

    # x * Clip(x + 3, 0, 6) / 6  ->  x * HardSigmoid(x)
    users, drop, swap = consumers(), set(), {}
    for n in nodes:
        if n.op_type != "Add" or scalar(n.input[1]) != 3.0:
            continue
        x = n.input[0]
        clip = only(users, n.output[0], "Clip")
        ok = clip is not None and len(clip.input) == 3 and (scalar(clip.input[1]), scalar(clip.input[2])) == (0.0, 6.0)
        mul = only(users, clip.output[0], "Mul") if ok else None
        div = only(users, mul.output[0], "Div") if mul is not None and other(mul, clip.output[0]) == x else None
        if div is None or div.input[0] != mul.output[0] or scalar(div.input[1]) != 6.0:
            continue
        gate = f"{div.output[0]}.gate"
        swap[id(n)] = [helper.make_node("HardSigmoid", [x], [gate], alpha=1 / 6, beta=0.5),
                       helper.make_node("Mul", [x, gate], [div.output[0]])]
        drop |= {id(clip), id(mul), id(div)}
        done["hard swish"] += 1
    nodes = [m for n in nodes if id(n) not in drop for m in swap.get(id(n), [n])]

    # Mul(c) -> Add(d) -> Conv that does not pad
    users, drop = consumers(), set()
    for n in nodes:
        known = [i for i in n.input if scalar(i) is not None] if n.op_type == "Mul" else []
        if len(known) != 1 or len(n.input) != 2:
            continue
        c, x = scalar(known[0]), other(n, known[0])
        add = only(users, n.output[0], "Add")
        d = scalar(other(add, n.output[0])) if add else None
        conv = only(users, add.output[0], "Conv") if d is not None else None
        parts = conv_parts(conv) if conv is not None and not pads(conv) else None
        if parts and c is not None and conv.input[0] == add.output[0]:
            set_conv(conv, x, parts[0] * c, parts[1] + d * parts[0].sum(axis=(1, 2, 3)), "post")
            drop |= {id(n), id(add)}
            done["affine into the conv after"] += 1
    nodes = [n for n in nodes if id(n) not in drop]

    used = {i for n in nodes for i in n.input} | outputs
    nodes = [n for n in nodes if n.op_type != "Constant" or n.output[0] in used]
    kept = [i for i in g.initializer if i.name in used]
    g.ClearField("node")
    g.node.extend(nodes)
    g.ClearField("initializer")
    g.initializer.extend(kept + [numpy_helper.from_array(v, k) for k, v in added.items() if k in used])
    return done
