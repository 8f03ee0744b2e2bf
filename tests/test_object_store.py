"""Issue 22 item 6: `ingest run s3://bucket/prefix` against a real S3-compatible server on loopback (moto's
standalone server, started once for the session): the same rows as the same files in a local folder, reruns
that fetch nothing unchanged, changes and deletions, one unreadable object failing alone, start errors in
one line, and the Ray engine over the same bucket. Credentials and endpoint go the way a user sets them:
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL. GETs of objects are counted in the server's
request log."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from conftest import cli_env, ingest, ray_config, run, server_rows
from docs import make_docx, make_pdf

pytest.importorskip("s3fs")
pytest.importorskip("moto")

NULL = '[model]\nbackend = "null"\n'
TEXTS = {
    "notes.txt": "Copper kettles whistle at dawn in the harbour town.",
    "guide.md": "# Travel guide\n\nGlacier trains climb slowly through alpine tunnels.",
    "deep/owls.txt": "Barn owls hunt voles over the meadow at dusk.",
    "deep/er/badgers.txt": "Badgers dig setts with many entrances under old oaks.",
}


@dataclass
class S3:
    endpoint: str
    log: Path

    def client(self):                                   # noqa: ANN201 (boto3's client)
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint)

    def object_gets(self, bucket: str) -> list[str]:
        """The keys of every GET of an object of `bucket` so far (listings have a query, objects none)."""
        return re.findall(rf"GET /{bucket}/([^ ?]+) HTTP", self.log.read_text(errors="replace"))


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """moto's S3 server on 127.0.0.1 (a free port), with this process's AWS_* settings pointing at it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("moto") / "requests.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=out, stderr=subprocess.STDOUT, env=cli_env())
    settings = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    old = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        deadline = time.monotonic() + 120
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's server did not start; see {log}")
            time.sleep(0.2)
        yield S3(settings["AWS_ENDPOINT_URL"], log)
    finally:
        server.terminate()
        server.wait(timeout=30)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def build(folder: Path) -> None:
    """txt, md, pdf and docx files, two folders deep."""
    for name, text in TEXTS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text + "\n", encoding="utf-8")
    make_pdf(folder / "report.pdf", ["Introduction to the annual report.",
                                     "Quarterly revenue from solar panels doubled in March."])
    make_docx(folder / "deep/memo.docx", ["The violin workshop restores antique instruments every winter."],
              heading="Workshop memo", table_rows=[["Item", "Count"], ["Violin", "3"]])


def upload(s3: S3, bucket: str, folder: Path, prefix: str) -> None:
    client = s3.client()
    client.create_bucket(Bucket=bucket)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(folder).as_posix()}", Body=path.read_bytes())


_DUMP = """
import json, sys
from ingest.store import Store
store = Store(sys.argv[1], "documents")
print(json.dumps(store.rows(["id", "source", "file_hash", "page", "chunk", "text", "headings"])))
"""


def rows(db: Path) -> list[tuple]:
    proc = subprocess.run([sys.executable, "-c", _DUMP, str(db)], capture_output=True, text=True, env=cli_env(),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return sorted(tuple(r.values()) for r in json.loads(proc.stdout.strip().splitlines()[-1]))


def statuses(res) -> dict[str, tuple]:                   # noqa: ANN001 (conftest.Result)
    return {p: (f["status"], f["chunks"], f.get("error")) for p, f in res.by_path().items()}


def test_listing_order_sizes_and_times(s3: S3, tmp_path: Path) -> None:
    from ingest.remote import scan_url

    folder = tmp_path / "f"
    for name in ("b.txt", "a.txt", "a/z.txt", "a/b/c.txt", "a0.txt"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(name * 3)
    upload(s3, "order", folder, "p")
    order = ["a/b/c.txt", "a/z.txt", "a.txt", "a0.txt", "b.txt"]   # a folder's entries by name, subfolders in place
    for url in (f"file://{folder}", "s3://order/p/"):
        listed = list(scan_url(url))
        assert [ref.source for ref, _ in listed] == order and [ref.seq for ref, _ in listed] == list(range(5))
        assert all(problem is None and ref.size == len(ref.source) * 3 and ref.mtime_ns > 0 for ref, problem in listed)
        assert listed[0][0].path == url.rstrip("/") + "/a/b/c.txt"


def test_same_rows_as_a_local_folder_incremental_and_pruned(s3: S3, work: Path, tmp_path: Path, short_tmp: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    build(work / "docs")
    upload(s3, "same", work / "docs", "team/docs")
    temp = short_tmp
    monkeypatch.setenv("TMPDIR", str(temp))               # where the run's fetch dir goes: gone after every run
    local = run(work / "docs", work, config=NULL)
    assert local.rc == 0, local.stderr
    remote_work = tmp_path / "remote"
    remote_work.mkdir()
    first = run("s3://same/team/docs", remote_work, config=NULL)   # type: ignore[arg-type]
    assert first.rc == 0, first.stderr
    assert statuses(first) == statuses(local) and len(statuses(first)) == 6
    assert rows(remote_work / "store.db") == rows(work / "store.db")      # ids, sources, hashes, pages, texts
    assert not list(temp.glob("ingest-fetch-*"))

    gets = len(s3.object_gets("same"))
    again = run("s3://same/team/docs", remote_work, config=NULL)   # type: ignore[arg-type]
    assert again.rc == 0, again.stderr
    assert again.report["totals"]["by_status"] == {"unchanged": 6}
    assert len(s3.object_gets("same")) == gets                      # nothing fetched, nothing even sniffed

    client = s3.client()
    client.put_object(Bucket="same", Key="team/docs/notes.txt", Body=b"Copper kettles were replaced by electric ones.\n")
    client.delete_object(Bucket="same", Key="team/docs/deep/owls.txt")
    changed = run("s3://same/team/docs", remote_work, "--prune", config=NULL)   # type: ignore[arg-type]
    assert changed.rc == 0, changed.stderr
    assert changed.by_path()["notes.txt"]["status"] == "ingested" and changed.report["totals"]["pruned"] == 1
    assert set(s3.object_gets("same")[gets:]) == {"team/docs/notes.txt"}      # the changed object only
    texts = {(r[1], r[5]) for r in rows(remote_work / "store.db")}
    assert ("notes.txt", "Copper kettles were replaced by electric ones.") in texts
    assert not any(source in ("deep/owls.txt",) for source, _ in texts)
    assert not list(temp.glob("ingest-fetch-*"))


@pytest.mark.slow
def test_an_unreadable_object_fails_alone_and_start_errors_are_one_line(s3: S3, work: Path) -> None:
    client = s3.client()
    client.create_bucket(Bucket="cold")
    client.put_object(Bucket="cold", Key="in/good.txt", Body=b"Otters juggle pebbles on the river bank.\n")
    client.put_object(Bucket="cold", Key="in/frozen.txt", Body=b"Archived text nobody can read now.\n",
                      StorageClass="GLACIER")               # GET refused until restored: unreadable
    res = run("s3://cold/in", work, config=NULL)            # type: ignore[arg-type]
    assert res.rc == 1, res.stderr
    files = res.by_path()
    assert files["good.txt"]["status"] == "ingested"
    assert files["frozen.txt"]["status"] == "failed" and "storage class" in files["frozen.txt"]["error"]

    with socket.socket() as s:                               # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}"}
    for url, endpoint, expected in (("s3://cold/in", env, "cannot reach s3://cold/in"),
                                    ("s3://no-such-bucket/in", {}, "folder s3://no-such-bucket/in not found")):
        proc = subprocess.run([sys.executable, "-m", "ingest.cli", "run", url, "--store", str(work / "x.db"), "--quiet"],
                              cwd=work, capture_output=True, text=True, timeout=300, env={**cli_env(), **endpoint})
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert expected in lines[0] and "AWS_ENDPOINT_URL" in lines[0], lines[0]


def test_the_fetch_dir_is_removed_on_sigterm(s3: S3, work: Path, short_tmp: Path) -> None:
    s3.client().create_bucket(Bucket="stop")
    s3.client().put_object(Bucket="stop", Key="in/a.txt", Body=b"Herons stand still in the shallow water.\n")
    temp = short_tmp
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "s3://stop/in", "--store", str(work / "store.db"),
                             "--quiet", "--backend", "null"], cwd=work, env={**cli_env(), "TMPDIR": str(temp)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(temp.glob("ingest-fetch-*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 143, proc.stderr.read() if proc.stderr else ""
    assert not list(temp.glob("ingest-fetch-*"))


@pytest.mark.slow
def test_ray_engine_over_a_bucket(s3: S3, milvus_uri: str, ray_address: str, work: Path) -> None:
    build(work / "docs")
    upload(s3, "rayed", work / "docs", "docs")
    args = ("--store", milvus_uri, "--report", "report.json", "--quiet")
    (work / "report.json").unlink(missing_ok=True)
    local = ingest("run", "s3://rayed/docs", "--collection", "s3_local", *args, cwd=work, config=NULL)
    (work / "report.json").unlink()
    ray = ingest("run", "s3://rayed/docs", "--collection", "s3_ray", *args, cwd=work,
                 config=NULL + ray_config(ray_address))
    assert local.rc == 0 and ray.rc == 0, (statuses(local), statuses(ray) if ray.report else ray.stderr)
    assert ray.report["totals"]["engine"] == "ray"
    assert statuses(ray) == statuses(local)
    key = lambda rows: sorted((r["id"], r["source"], r["file_hash"]) for r in rows)
    assert key(server_rows(milvus_uri, "s3_ray")) == key(server_rows(milvus_uri, "s3_local"))
    gets = len(s3.object_gets("rayed"))
    (work / "report.json").unlink()
    again = ingest("run", "s3://rayed/docs", "--collection", "s3_ray", *args, cwd=work,
                   config=NULL + ray_config(ray_address))
    assert again.rc == 0 and again.report["totals"]["by_status"] == {"unchanged": 6}, again.stderr
    assert len(s3.object_gets("rayed")) == gets
