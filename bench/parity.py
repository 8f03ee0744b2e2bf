"""Retrieval parity of the backends: do onnx and onnx-int8 return the same top-k sources as torch?

    python bench/parity.py              # samples/ and a corpus of the standard library's documentation

Two corpora, each ingested once per backend into its own Milvus Lite file:
  samples  the bundled samples; queries: the phrase of each sample (samples/README.md) and a
           paraphrase of it
  stdlib   one text file per standard-library module (its pydoc page, ~100 modules, many
           neighbours on similar topics); queries: the first sentence of 60 function docstrings
The query is embedded by the backend itself (torch really runs torch here). Prints, per backend
against torch: queries with the same top-k sources in the same order, as a set, and the same top 1.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pydoc
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_QUERIES = [
    "The lighthouse keeper logs every passing ship", "who watches the boats at night",
    "Migratory cranes return to the marsh in early March", "when do the birds come back",
    "长江是亚洲最长的河流", "longest river in Asia",
    "Quarterly revenue grew by eleven percent", "how much did sales increase",
    "Invoices are archived in the basement", "where are old bills kept",
    "Parking is free after six", "evening parking cost",
    "The blue meeting room seats twelve people", "how big is the conference room",
    "Our mascot is a purple octopus", "team mascot animal",
    "The orchard committee approved new ladders", "apple picking equipment decision",
    "Volunteers repaint the harbour fence", "painting the fence by the port",
]
MODULES = ("argparse asyncio base64 bisect calendar cmath codecs collections colorsys configparser contextlib copy csv "
           "dataclasses datetime decimal difflib enum filecmp fnmatch fractions ftplib functools getpass gettext glob "
           "gzip hashlib heapq hmac html http.client http.cookies imaplib inspect io ipaddress itertools json locale "
           "logging lzma mailbox math mimetypes operator optparse os pathlib pickle platform plistlib poplib pprint "
           "queue quopri random re sched secrets selectors shelve shlex shutil signal smtplib socket sqlite3 ssl "
           "statistics string struct subprocess tarfile tempfile textwrap threading time timeit tokenize traceback "
           "types typing unicodedata unittest urllib.parse uuid warnings wave weakref xml.dom zipfile zlib").split()


def stdlib_corpus(folder: Path, n_queries: int, seed: int = 0) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    queries = []
    for name in MODULES:
        module = importlib.import_module(name)
        (folder / f"{name}.txt").write_text(pydoc.render_doc(module, renderer=pydoc.plaintext))
        for attr in sorted(dir(module)):
            doc = getattr(getattr(module, attr, None), "__doc__", None)
            if callable(getattr(module, attr, None)) and not attr.startswith("_") and isinstance(doc, str) and len(doc) > 40:
                first = doc.strip().split("\n\n")[0].replace("\n", " ")
                if 30 < len(first) < 200 and "(" not in first[:20]:
                    queries.append(first)
    queries = sorted(set(queries))
    return random.Random(seed).sample(queries, min(n_queries, len(queries)))


def top_sources(store: str, backend: str, queries: list[str], k: int) -> list[list[str]]:
    code = f"""
import json, sys
import ingest.search as s
from ingest.model_ref import resolve_model
from ingest.store import Store
s._fp32_if_exact = lambda ref: ""          # torch means torch here, not the ONNX stand-in
ref, store = resolve_model(), Store({store!r}, "documents")
out = []
for q in json.loads(sys.stdin.read()):
    out.append([h["source"] for h in store.search(s.embed_query(ref, {backend!r}, q).tolist(), {k})])
store.close()
print(json.dumps(out))
"""
    import json

    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(queries), capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=1800, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", type=int, default=5)
    ap.add_argument("--queries", type=int, default=60, help="stdlib queries")
    ap.add_argument("--backends", default="onnx,onnx-int8", help="compared with torch")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpora = {"samples": (ROOT / "samples", SAMPLE_QUERIES),
                   "stdlib": (Path(tmp) / "stdlib", stdlib_corpus(Path(tmp) / "stdlib", args.queries))}
        for corpus, (folder, queries) in corpora.items():
            print(f"{corpus}: {len(list(folder.iterdir()))} files, {len(queries)} queries, top {args.k}", flush=True)
            tops = {}
            for backend in ["torch", *args.backends.split(",")]:
                store = str(Path(tmp) / f"{corpus}-{backend}.db")
                subprocess.run([sys.executable, "-m", "ingest.cli", "run", str(folder), "--store", store, "--backend",
                                backend, "--quiet", "--report", str(Path(tmp) / "r.json")], check=False,
                               env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, timeout=3600)
                tops[backend] = top_sources(store, backend, queries, args.k)
            for backend in args.backends.split(","):
                pairs = list(zip(tops["torch"], tops[backend]))
                ordered = sum(a == b for a, b in pairs)
                as_set = sum(set(a) == set(b) for a, b in pairs)
                first = sum(a[:1] == b[:1] for a, b in pairs)
                print(f"  {backend:<9} vs torch: same top-{args.k} in order {ordered}/{len(pairs)}, "
                      f"as a set {as_set}/{len(pairs)}, same top-1 {first}/{len(pairs)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
