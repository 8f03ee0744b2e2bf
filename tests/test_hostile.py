"""Issue 5: hostile inputs each fail with one line while every other file is ingested."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import cli_env, row_ids, search
from docs import make_encrypted_pdf, make_truncated_pdf, make_zip_bomb_docx

SECRET = "SECRETBYTES-7f3a"
GOOD = {
    "résumé 2024 файл.txt": "Nightingales sing in the hawthorn hedges of the valley.",
    "latin1.txt": "Crème brûlée à la française, servie après le déjeuner.",
    "utf16.txt": "Hedgehogs roll into spiky balls when they feel threatened.",
    "gbk.txt": "长城是世界上最长的城墙建筑。",
    "unlocked.pdf": "The unlocked report mentions basalt columns on the coast.",
}


def build(docs: Path) -> None:
    (docs / "résumé 2024 файл.txt").write_text(GOOD["résumé 2024 файл.txt"])
    (docs / "latin1.txt").write_bytes(GOOD["latin1.txt"].encode("latin-1"))
    (docs / "utf16.txt").write_bytes(GOOD["utf16.txt"].encode("utf-16"))
    (docs / "gbk.txt").write_bytes(GOOD["gbk.txt"].encode("gbk"))
    make_encrypted_pdf(docs / "unlocked.pdf", [GOOD["unlocked.pdf"]], password="s3cret")
    make_encrypted_pdf(docs / "locked.pdf", [SECRET], password="unknown-pw")
    make_truncated_pdf(docs / "truncated.pdf", [SECRET, SECRET])
    (docs / "empty.txt").write_bytes(b"")
    (docs / "pdf-named.txt").write_bytes(b"%PDF-1.4\n" + SECRET.encode() + b"\n%%EOF")
    (docs / "random.txt").write_bytes(os.urandom(4096) + SECRET.encode())
    make_zip_bomb_docx(docs / "bomb.docx", uncompressed_mb=64)
    with open(docs / "huge.txt", "wb") as f:                 # 200 MB on one line
        block = b"a" * (1 << 20)
        for _ in range(200):
            f.write(block)
    (docs / "unreadable.txt").write_text(SECRET)
    (docs / "unreadable.txt").chmod(0)
    os.symlink("loop", docs / "loop")


CONFIG = """
[loaders.pdf]
passwords = ["s3cret"]
[limits]
max_unzipped_mb = 16
max_text_mb = 64
"""


@pytest.mark.slow
def test_hostile_inputs() -> None:
    work = Path(tempfile.mkdtemp(prefix="ingest-hostile-"))
    docs = work / "docs"
    docs.mkdir()
    build(docs)
    (work / "config.toml").write_text(CONFIG)
    argv = [sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db", "--report", "report.json",
            "--quiet"]
    if os.geteuid() == 0:      # root reads anything: drop the capabilities that bypass file permissions
        caps = "-dac_override,-dac_read_search"
        argv = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", *argv]
    res = subprocess.run(argv, cwd=work, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stderr
    files = {f["path"]: f for f in json.loads((work / "report.json").read_text())["files"]}
    expect_failed = {
        "locked.pdf": "password", "truncated.pdf": "", "pdf-named.txt": "PDF",
        "random.txt": "binary", "bomb.docx": "max_unzipped_mb", "huge.txt": "max_text_mb",
        "unreadable.txt": "permission", "loop": "symlink loop",
    }
    for name, word in expect_failed.items():
        entry = files[name]
        assert entry["status"] == "failed", entry
        assert word.lower() in entry["error"].lower(), entry
        assert "\n" not in entry["error"] and len(entry["error"]) < 400 and SECRET not in entry["error"]
    assert (files["empty.txt"]["status"], files["empty.txt"]["error"]) == ("skipped", "empty file")
    for name in GOOD:
        assert files[name]["status"] == "ingested", files[name]
    for name, phrase in GOOD.items():
        assert name in [h["source"] for h in search(work, phrase)], name
    assert len(row_ids(work)) == sum(files[n]["chunks"] for n in GOOD)
