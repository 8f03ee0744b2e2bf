"""Issue 9, limits: LibreOffice under its guard, the pixel cap, the worker memory limit, pebble's exit
cleanup — with real processes."""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import psutil
import pytest

import docs
from conftest import cli_env, run
from ingest.config import load_config, loader_options, ocr_options
from ingest.loaders import LoaderError, loader_for
from ingest.loaders.ocr import ocr_page, render

SOFFICE = ("soffice.bin", "oosplash", "soffice")
needs_soffice = pytest.mark.skipif(not (shutil.which("soffice") or shutil.which("libreoffice")),
                                   reason="LibreOffice is not installed")


def make_flat_png(path: Path, width: int, height: int) -> Path:
    """A one-colour 1-bit greyscale PNG: a few hundred KB on disk, width*height pixels when decoded."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + b"\xff" * ((width + 7) // 8)
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return path


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def can_unshare_network() -> bool:
    """What the guard tries: a network namespace as root, or inside a user namespace."""
    return shutil.which("unshare") is not None and any(
        subprocess.run(["unshare", *flags, "true"], capture_output=True).returncode == 0 for flags in (["-n"], ["-rn"]))


# ---- LibreOffice ---------------------------------------------------------------------------------

CONVERT = """
import sys
from pathlib import Path
from ingest.loaders.legacy import convert
convert(Path(sys.argv[1]), "docx", Path(sys.argv[2]), 120)
"""


@needs_soffice
def test_soffice_dies_with_a_killed_worker_has_no_network_and_leaves_no_profile(tmp_path: Path, short_tmp: Path) -> None:
    # A long table: LibreOffice takes about a minute to convert it back, long past the kill below.
    doc = docs.make_doc(tmp_path / "slow.doc", ["Rows"], table_rows=[[f"row {i}", "v", "w"] for i in range(1200)])
    tmp = short_tmp                 # its TMPDIR: a short path (conftest.short_tmp)
    child = subprocess.Popen([sys.executable, "-c", CONVERT, str(doc), str(tmp_path)],
                             env={**cli_env(), "TMPDIR": str(tmp)})
    seen: dict[int, str] = {}
    deadline = time.monotonic() + 60
    while "soffice.bin" not in seen.values() and time.monotonic() < deadline and child.poll() is None:
        try:
            seen.update({p.pid: p.name() for p in psutil.Process(child.pid).children(recursive=True)})
        except psutil.Error:
            pass
        time.sleep(0.02)
    office = next((pid for pid, name in seen.items() if name == "soffice.bin"), None)
    assert office is not None, f"no soffice.bin seen under the worker: {seen}"
    office_ns, worker_ns = netns(office), netns(child.pid)
    assert [p.name for p in tmp.iterdir()] and all(p.name.startswith("ingest-legacy-") for p in tmp.iterdir())
    child.send_signal(signal.SIGKILL)
    child.wait()

    deadline = time.monotonic() + 10
    while (any(map(alive, seen)) or any(tmp.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [seen[p] for p in seen if alive(p)], "LibreOffice outlived its worker"
    assert not list(tmp.iterdir()), "the LibreOffice workdir (profile) was left behind"
    if can_unshare_network():
        assert office_ns != worker_ns, "LibreOffice shares the worker's network namespace"


CAPPED = """
import sys
from pathlib import Path
from ingest.loaders.legacy import convert
from ingest.workers.limits import limit_memory
limit_memory(400)              # LibreOffice alone needs more: the guard lifts the limit for it
print("converted", convert(Path(sys.argv[1]), "docx", Path(sys.argv[2]), 120).is_file())
"""


@needs_soffice
def test_legacy_odd_names_memory_cap_and_timeouts_leave_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    odd = Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9 \"q\" 'x'\nline \\ \xf0\x9f\x90\x9d.doc"))
    docs.make_doc(odd, ["Body of an oddly named file"], heading="Odd")
    options = loader_options(load_config())
    [page] = loader_for("doc")(odd, options)
    assert page.text.split("\n\n") == ["Odd", "Body of an oddly named file"]
    assert not list(tmp.iterdir())
    capped = subprocess.run([sys.executable, "-c", CAPPED, str(odd), str(tmp_path)], capture_output=True, text=True,
                            env=cli_env(), timeout=120)
    assert capped.returncode == 0 and "converted True" in capped.stdout, capped.stderr
    with pytest.raises(LoaderError, match=r"^LibreOffice did not convert the \.doc within 0\.5 s; raise"):
        list(loader_for("doc")(odd, dataclasses.replace(options, convert_timeout_s=0.5)))
    assert not list(tmp.iterdir())
    assert not [p for p in psutil.Process().children(recursive=True) if p.name() in SOFFICE]


# ---- the pixel cap -------------------------------------------------------------------------------

def test_pixel_cap_refuses_a_bomb_from_its_header_and_caps_renders(tmp_path: Path) -> None:
    bomb = make_flat_png(tmp_path / "bomb.png", 30000, 30000)
    assert bomb.stat().st_size < 1_000_000
    options = loader_options(load_config())
    start = time.monotonic()
    with pytest.raises(LoaderError, match=r"^image is 900 megapixels, over \[limits\] max_image_mp = 200 "
                                          r"\(a decompression bomb\?\); raise the limit to ingest it$"):
        list(loader_for("image")(bomb, options))
    assert time.monotonic() - start < 2                                   # the pixels were never decoded
    tiff = docs.make_tiff(tmp_path / "fax.tiff", ["one", "two"])
    with pytest.raises(LoaderError, match=r"^frame 1 of the image is [\d.]+ megapixels, over"):
        list(loader_for("image")(tiff, dataclasses.replace(options, max_image_mp=0.01)))

    ocr = ocr_options(load_config())
    png = docs.make_png(tmp_path / "sign.png", "Meeting moved to Friday")
    scan = docs.make_scanned_pdf(tmp_path / "scan.pdf", ["A scanned page"])
    for path in (png, scan):
        for mp in (0.05, 0.3):
            height, width, _ = render(path, 1, dataclasses.replace(ocr, max_image_mp=mp)).shape
            assert width * height <= mp * 1e6
    assert ocr_page(png, 1, dataclasses.replace(ocr, max_image_mp=0.5)).text == "Meeting moved to Friday"


@pytest.mark.slow
def test_bomb_fails_in_a_run_and_a_normal_image_still_ocrs(work: Path) -> None:
    make_flat_png(work / "docs" / "bomb.png", 30000, 30000)
    docs.make_png(work / "docs" / "sign.png", "Meeting moved to Friday")
    res = run(work / "docs", work)
    files = res.by_path()
    assert files["bomb.png"]["status"] == "failed", res.stderr
    assert files["bomb.png"]["error"].startswith("image is 900 megapixels, over [limits] max_image_mp = 200")
    assert files["bomb.png"]["seconds"] < 5
    assert files["sign.png"]["status"] == "ingested" and files["sign.png"]["chunks"] == 1


# ---- the worker memory limit ---------------------------------------------------------------------

def test_worker_over_its_memory_limit_fails_only_its_file(work: Path) -> None:
    (work / "docs" / "big.hog").write_text("x")
    (work / "docs" / "good.txt").write_text("Bees dance to tell the hive where the flowers are.")
    res = run(work / "docs", work, config='[loaders]\nplugins = ["limit_loaders"]\n[limits]\nworker_memory_mb = 1024\n')
    assert res.rc == 1 and res.report is not None, res.stderr
    files = res.by_path()
    hog = files["big.hog"]
    assert hog["status"] == "failed" and "out of memory" in hog["error"] and "worker_memory_mb" in hog["error"]
    assert "retried" not in hog["error"]                  # a MemoryError in the worker, not a killed worker
    assert files["good.txt"]["status"] == "ingested"


# ---- pebble's exit cleanup -----------------------------------------------------------------------

POOL = """
import multiprocessing
from pebble.pool import process as pebble_process
from ingest.workers.pool import Pools
pools = Pools({"txt": 1}, {"txt": 30.0})
assert pools.submit("txt", abs, -1).result(timeout=60) == 1
workers = [p for p in multiprocessing.active_children() if p.name == "pebble_pool_worker"]
assert workers, [p.name for p in multiprocessing.active_children()]
pebble_process.interpreter_shutdown()          # what pebble runs at exit
assert not any(p.is_alive() for p in workers), "pebble's exit cleanup missed its workers"
print("cleaned", len(workers))
"""


def test_pebble_finds_and_stops_its_workers_at_exit() -> None:
    proc = subprocess.run([sys.executable, "-c", POOL], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert proc.returncode == 0 and "cleaned 1" in proc.stdout, proc.stderr
