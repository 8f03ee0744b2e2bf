"""Issue 23 item 2: `ingest --version`; `ingest run PATH...` takes files and folders (a file's source is its
path from the deepest folder holding every PATH; prune and its hint only look under the PATHs); a missing
PATH is one line naming it; `ingest run --json` prints the report's totals on stdout."""
from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest

from conftest import Result, ingest

NULL = '[model]\nbackend = "null"\n'


def _run(work: Path, *paths: str, quiet: bool = True) -> Result:
    (work / "report.json").unlink(missing_ok=True)
    return ingest("run", *paths, "--store", "store.db", "--report", "report.json", *(["--quiet"] if quiet else []),
                  cwd=work, config=NULL)


def _files(res: Result) -> dict[str, str]:
    assert res.rc == 0, res.stderr
    return {f["path"]: f["status"] for f in res.report["files"]}


def test_version_and_paths_that_cannot_be_ingested(work: Path) -> None:
    res = ingest("--version", cwd=work)
    assert (res.rc, res.stdout) == (0, f"ingest {version('ingest')}\n"), res.stderr
    (work / "docs" / "report.pdf").write_bytes(b"%PDF-1.4\n")
    for paths, line in ((["docs/reprot.pdf"], "ingest: error: docs/reprot.pdf not found; pass existing files or "
                                              "folders to ingest\n"),
                        (["docs", "nowhere"], "ingest: error: nowhere not found"),
                        (["docs", "s3://bucket/prefix"], "ingest: error: s3://bucket/prefix is a URL, which is "
                                                         "ingested alone")):
        res = _run(work, *paths)
        assert res.rc == 2 and res.stderr.startswith(line) and res.stderr.count("\n") == 1, res.stderr
        assert res.report["totals"]["exit_code"] == 2                  # a run that cannot start still reports
    assert not (work / "store.db").exists()


@pytest.mark.slow
def test_files_and_folders_keep_the_folders_sources(work: Path) -> None:
    docs, other = work / "docs", work / "other"
    for path in (docs / "a.txt", docs / "b.txt", docs / "sub" / "c.txt", other / "y.txt"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"Penguins of {path.name} huddle together through the long polar night.\n")

    one = _run(work, "docs/a.txt")                       # a file alone: its name from its folder
    assert _files(one) == {"a.txt": "ingested"}
    res = ingest("run", "docs/a.txt", "--store", "store.db", "--report", "report.json", "--quiet", "--json",
                 cwd=work)
    totals = json.loads(res.stdout)                      # --json: the report's totals, one object on stdout
    assert totals == res.report["totals"] and totals["by_status"] == {"unchanged": 1}, res.stdout
    assert _files(_run(work, "docs")) == {"a.txt": "unchanged", "b.txt": "ingested", "sub/c.txt": "ingested"}

    (docs / "b.txt").unlink()
    nested = _run(work, "docs/sub", "docs/a.txt", "docs/sub/c.txt", "--prune")    # each file once; b.txt not named
    assert _files(nested) == {"a.txt": "unchanged", "sub/c.txt": "unchanged"}
    assert nested.report["totals"]["pruned"] == 0
    assert "no longer exist" not in _run(work, "docs/a.txt", quiet=False).stderr
    assert "1 file(s) in the store no longer exist" in _run(work, "docs", quiet=False).stderr
    assert _run(work, "docs", "--prune").report["totals"]["pruned"] == 1

    both = _run(work, "other", "docs/sub/c.txt")         # ROOT: work; the earlier sources are not under these
    assert _files(both) == {"docs/sub/c.txt": "ingested", "other/y.txt": "ingested"}
    assert [f["path"] for f in _run(work, "docs").report["files"]] == ["a.txt", "sub/c.txt"]
