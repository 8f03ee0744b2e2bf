"""Issue 30 item 10: a `file://` URL obeys `[run] follow_symlinks` as the same folder given as a path does (one
rule: the scan's). A folder with a link to a file outside it, one to a file inside it, and one to a folder."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import run

NULL = '[model]\nbackend = "null"\n'


def build(work: Path) -> Path:
    """work/docs: plain.txt, inner.txt -> plain.txt, outer.txt -> work/outside/secret.txt, sub -> work/outside."""
    outside = work / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("Saffron ledgers from the hidden archive of the lighthouse keeper.\n")
    docs = work / "docs"
    docs.mkdir(exist_ok=True)
    (docs / "plain.txt").write_text("Quartz pebbles line the stream bed below the mill.\n")
    os.symlink(docs / "plain.txt", docs / "inner.txt")
    os.symlink(outside / "secret.txt", docs / "outer.txt")
    os.symlink(outside, docs / "sub")
    return docs


EXPECTED = {          # follow_symlinks -> the statuses of inner.txt and outer.txt (sub: never followed)
    "none": ("skipped", "skipped"),
    "inside": ("ingested", "skipped"),
    "all": ("ingested", "ingested"),
}


@pytest.mark.parametrize("follow", sorted(EXPECTED))
def test_scan_url_of_a_file_url_is_the_scan(tmp_path: Path, follow: str) -> None:
    from ingest.remote import scan_url
    from ingest.scan import scan

    docs = build(tmp_path)
    local = [(ref.source, ref.size, ref.mtime_ns, ref.path, problem) for ref, problem in scan(docs, follow)]
    remote = [(ref.source, ref.size, ref.mtime_ns, ref.path, problem) for ref, problem in scan_url(f"file://{docs}", follow)]
    assert [r[:3] + r[4:] for r in remote] == [r[:3] + r[4:] for r in local]
    assert [r[3] for r in remote] == [f"file://{r[3]}" for r in local]           # a followed link: its target
    problems = {source: problem for source, _, _, _, problem in remote}
    assert problems["sub"] is not None and problems["sub"].status == "skipped"
    inner, outer = EXPECTED[follow]
    assert (problems["inner.txt"] is None) == (inner == "ingested")
    assert (problems["outer.txt"] is None) == (outer == "ingested")


@pytest.mark.slow
@pytest.mark.parametrize("follow", ["inside", "all"])
def test_run_of_a_file_url_and_of_the_path_agree(work: Path, tmp_path: Path, follow: str) -> None:
    docs = build(work)
    config = f'{NULL}[run]\nfollow_symlinks = "{follow}"\n'
    local = run(docs, work, config=config)
    assert local.rc == 0, local.stderr
    other = tmp_path / "url"
    other.mkdir()
    remote = run(f"file://{docs}", other, config=config)          # type: ignore[arg-type]
    assert remote.rc == 0, remote.stderr

    def statuses(res) -> dict[str, tuple]:              # noqa: ANN001 (conftest.Result)
        return {p: (f["status"], f["chunks"], f.get("error")) for p, f in res.by_path().items()}

    assert statuses(remote) == statuses(local)
    inner, outer = EXPECTED[follow]
    assert (statuses(remote)["inner.txt"][0], statuses(remote)["outer.txt"][0]) == (inner, outer)
