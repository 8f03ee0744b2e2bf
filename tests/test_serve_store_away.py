"""Issue 47: a server store that goes away while `ingest serve` runs: searches answer 503 with the reason (no
password in it), then 200 again once the store is back, without a restart of the server (the reconnect
protocol of issue 40), each search within [store] timeout_s. The session's real PostgreSQL, stalled with SIGSTOP
past that timeout."""
from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from conftest import ingest
from pg_server import signal_all
from test_serve import DOCS, start, stop


@pytest.mark.slow
def test_a_stalled_server_store_answers_503_then_200_once_it_is_back(pg_server, tmp_path: Path) -> None:
    uri = pg_server.database("serve_away")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text(DOCS["lighthouse.txt"])
    (tmp_path / "pg.toml").write_text("[store]\ntimeout_s = 3\n")
    assert ingest("run", "docs", "--store", uri, "--config", "pg.toml", "--quiet", cwd=tmp_path).rc == 0
    srv = start(tmp_path, "--store", uri, "--config", "pg.toml")
    body = {"query": "lighthouse lamp", "k": 1}
    try:
        assert httpx.post(srv.url + "/search", json=body, timeout=60).status_code == 200
        signal_all(pg_server, signal.SIGSTOP)
        try:
            t = time.monotonic()
            res = httpx.post(srv.url + "/search", json=body, timeout=120)
            assert res.status_code == 503 and "did not answer" in res.text, res.text
            assert time.monotonic() - t < 30          # within [store] timeout_s (3 s) and its retries, not 60 s
            message = res.json()["error"]["message"]
            assert message and pg_server.password not in res.text and "\n" not in message, res.text
            assert "rerun" not in message, message                  # a client's advice, not a run's
            assert httpx.get(srv.url + "/healthz", timeout=10).status_code == 200     # the server itself lives
        finally:
            signal_all(pg_server, signal.SIGCONT)
        deadline, res = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            res = httpx.post(srv.url + "/search", json=body, timeout=60)
            if res.status_code == 200:
                break
            time.sleep(0.5)
        assert res is not None and res.status_code == 200 and res.json()["hits"][0]["source"] == "a.txt", res.text
    finally:
        assert stop(srv) == 143, srv.log()
    assert pg_server.password not in srv.log()
