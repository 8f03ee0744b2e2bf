"""Issue 20, items 4-6: no other user reaches a run's store, LibreOffice pulls in no other file, and the
supervisor reads no unbounded input."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import psutil
import pytest

from conftest import cli_env, run, wait_recorded

SLOW_CONFIG = """
[loaders]
plugins = ["fault_loaders"]
[loaders.txt]
timeout_s = 600
"""

# Runs as root, imports pymilvus, then becomes nobody (so no file of root's is needed after) and tries
# every address it was given: a listing that answers is printed as BREACH.
_ATTACKER = """
import json, os, socket, sys
from pymilvus import MilvusClient
os.setgroups([]); os.setgid(65534); os.setuid(65534)
assert os.getuid() == 65534 and os.geteuid() == 65534
for address in json.loads(sys.argv[1]):
    if address.startswith("unix:"):
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(address[5:])
            except OSError as exc:
                print("refused", address, exc.strerror, flush=True)
                continue
    try:
        names = MilvusClient(address, timeout=5).list_collections(timeout=5)
    except Exception as exc:
        print("refused", address, type(exc).__name__, flush=True)
    else:
        print("BREACH", address, names, flush=True)
"""


def _listening(pid: int) -> tuple[list[str], list[str]]:
    """(TCP addresses, unix socket addresses) that process `pid` and its descendants listen on."""
    tcp, unix = set(), set()
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    for p in procs:
        try:
            conns = p.net_connections(kind="all")
        except psutil.NoSuchProcess:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN and c.laddr:
                ip = c.laddr.ip.removeprefix("::ffff:")
                ip = "127.0.0.1" if ip in ("0.0.0.0", "::") else f"[{ip}]" if ":" in ip else ip
                tcp.add(f"http://{ip}:{c.laddr.port}")
            elif c.family == getattr(os, "AF_UNIX", 1) and isinstance(c.laddr, str) and c.laddr.startswith("/"):
                unix.add(f"unix:{c.laddr}")
    return sorted(tcp), sorted(unix)



@pytest.mark.slow
def test_another_user_cannot_reach_the_runs_lite_store(work: Path) -> None:
    (work / "docs" / "slow.sleep").write_text("x")            # holds the run open (fault_loaders: sleeps)
    (work / "docs" / "a.txt").write_text("Otters hold hands while they sleep so they do not drift apart.")
    (work / "config.toml").write_text(SLOW_CONFIG)
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db", "--backend",
                             "null", "--report", "report.json", "--quiet"], cwd=work, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_recorded(work, "a.txt", proc)                   # the store now holds the collection
        tcp, unix = _listening(proc.pid)
        assert tcp or unix, "the run listens on nothing: the store's address was not found"
        attack = subprocess.run([sys.executable, "-c", _ATTACKER, json.dumps(tcp + unix)], env=cli_env(),
                                capture_output=True, text=True, timeout=300)
        assert attack.returncode == 0, attack.stderr
        assert "BREACH" not in attack.stdout, attack.stdout
        assert not tcp, f"the run listens on TCP: {tcp}"
        assert attack.stdout.count("refused") == len(unix)
        # the run's own user still reaches it (what nobody was refused is the store itself)
        mine = subprocess.run([sys.executable, "-c", "import sys; from pymilvus import MilvusClient; "
                               "print(MilvusClient(sys.argv[1], timeout=30).list_collections())", unix[0]],
                              env=cli_env(), capture_output=True, text=True, timeout=120)
        assert "documents" in mine.stdout, mine.stderr
    finally:
        proc.kill()
        proc.wait()
    directory = Path(unix[0][5:]).parent
    deadline = time.monotonic() + 30
    while directory.exists() and time.monotonic() < deadline:      # the host removes it once its run is gone
        time.sleep(0.2)
    assert not directory.exists()


def test_a_store_opened_without_a_host_listens_on_no_tcp_port(tmp_path: Path) -> None:
    """`ingest search` (and any Store without serve()) runs Lite in its own process: on a private socket too."""
    code = ("import json, os, sys, psutil; from ingest.store import Store\n"
            "s = Store(sys.argv[1], 'c'); s.exists()\n"
            "me = psutil.Process()\n"
            "print(json.dumps([[c.family, str(c.laddr), c.status] for c in me.net_connections(kind='all')]))\n"
            "s.close()")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "store.db")], env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    conns = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not [c for c in conns if c[2] == psutil.CONN_LISTEN], conns
    assert [c for c in conns if "milvus.sock" in c[1]], conns


def _docx_with_entries(path: Path, n: int) -> None:
    """A DOCX whose ZIP64 directory lists word/document.xml and `n` empty entries (bytes built directly:
    the same 47-byte directory entry n times)."""
    name, body = b"word/document.xml", b"<w:document/>"
    crc = zlib.crc32(body)
    local = struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(body), len(body), len(name), 0)

    def entry(entry_name: bytes, size: int, entry_crc: int) -> bytes:
        return struct.pack("<4s6H3I5HII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, entry_crc, size, size,
                           len(entry_name), 0, 0, 0, 0, 0, 0) + entry_name

    directory = entry(name, len(body), crc) + entry(b"e", 0, 0) * n
    start = len(local) + len(name) + len(body)
    end64 = start + len(directory)
    with open(path, "wb") as f:
        f.write(local + name + body)
        f.write(directory)
        f.write(struct.pack("<4sQ2H2I4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, n + 1, n + 1, len(directory), start))
        f.write(struct.pack("<4sIQI", b"PK\x06\x07", 0, end64, 1))
        f.write(struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))


_SNIFF = """
import json, resource, sys, time
from pathlib import Path
from ingest.sniff import detect_format
from ingest.loaders import LoaderError
def rchar():
    return int(next(l for l in open("/proc/self/io") if l.startswith("rchar:")).split()[1])
rss, read, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rchar(), time.monotonic()
try:
    verdict = detect_format(Path(sys.argv[1]))
except LoaderError as exc:
    verdict = "LoaderError: " + str(exc)
print(json.dumps({"verdict": verdict, "s": time.monotonic() - start, "read": rchar() - read,
                  "rss_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io to count bytes read")
def test_a_docx_of_a_million_entries_is_refused_from_its_end_record(work: Path) -> None:
    bomb = work / "docs" / "bomb.docx"
    _docx_with_entries(bomb, 1_000_000)
    small = work / "docs" / "small.docx"
    _docx_with_entries(small, 10)
    proc = subprocess.run([sys.executable, "-c", _SNIFF, str(bomb)], env=cli_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    sniffed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sniffed["verdict"].startswith("LoaderError: DOCX holds 1,000,001 files"), sniffed
    assert sniffed["read"] < 1_000_000, sniffed                 # the file is 47 MB: only its end was read
    assert sniffed["s"] < 2 and sniffed["rss_mb"] < 50, sniffed
    proc = subprocess.run([sys.executable, "-c", _SNIFF, str(small)], env=cli_env(), capture_output=True, text=True,
                          timeout=300)
    assert json.loads(proc.stdout.strip().splitlines()[-1])["verdict"] == "docx", proc.stderr
    # in a run: the file fails with one line, the others go on
    (work / "docs" / "small.docx").unlink()
    (work / "docs" / "a.txt").write_text("Sea otters keep a favourite stone in a pouch of skin.")
    res = run(work / "docs", work, "--backend", "null")
    files = res.by_path()
    assert files["a.txt"]["status"] == "ingested", res.stderr
    assert files["bomb.docx"]["status"] == "failed" and "zip bomb" in files["bomb.docx"]["error"]
    assert "\n" not in files["bomb.docx"]["error"]


_DOCX_PARTS = {
    "[Content_Types].xml": '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/'
    'package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.'
    'relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/word/document'
    '.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>',
    "_rels/.rels": '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/'
    'package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/'
    '2006/relationships/officeDocument" Target="word/document.xml"/></Relationships>',
}
_INCLUDING = ('<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="http://schemas.openxmlformats.org/'
              'wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>Walruses use their tusks to haul out onto ice.'
              '</w:t></w:r></w:p><w:p><w:r><w:fldChar w:fldCharType="begin"/></w:r><w:r><w:instrText xml:space='
              '"preserve"> INCLUDETEXT "{path}" </w:instrText></w:r><w:r><w:fldChar w:fldCharType="separate"/></w:r>'
              '<w:r><w:t>Cached words the author saw.</w:t></w:r><w:r><w:fldChar w:fldCharType="end"/></w:r></w:p>'
              '</w:body></w:document>')
_TEXTS = """
import json, sys
from ingest.store import Store
print(json.dumps([r["text"] for r in Store(sys.argv[1], "documents").rows(["text"])]))
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("soffice") is None, reason="needs LibreOffice (soffice)")
def test_a_doc_including_a_file_outside_the_folder_stores_only_its_own_text(work: Path) -> None:
    outside = work / "outside" / "secret.txt"
    outside.parent.mkdir()
    outside.write_text("Placeholder words.\n")
    build = work / "build"
    build.mkdir()
    with zipfile.ZipFile(build / "including.docx", "w") as z:
        for name, xml in {**_DOCX_PARTS, "word/document.xml": _INCLUDING.format(path=outside)}.items():
            z.writestr(name, xml)
    subprocess.run(["soffice", "--headless", "--norestore", f"-env:UserInstallation={(build / 'profile').as_uri()}",
                    "--convert-to", "doc", "--outdir", str(work / "docs"), str(build / "including.docx")],
                   capture_output=True, timeout=300, check=True)
    doc = work / "docs" / "including.doc"
    assert "INCLUDETEXT".encode("utf-16-le") in doc.read_bytes()          # the field survived into the .doc
    outside.write_text("Quokkanumbat saltmarsh lantern: words from outside the folder.\n")
    res = run(work / "docs", work, "--backend", "null")
    assert res.by_path()["including.doc"]["status"] == "ingested", res.stderr
    proc = subprocess.run([sys.executable, "-c", _TEXTS, str(work / "store.db")], env=cli_env(), capture_output=True,
                          text=True, timeout=120)
    text = " ".join(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert "Walruses" in text and "Cached words" in text
    assert "Quokkanumbat" not in text
