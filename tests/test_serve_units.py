"""Issue 47, the inner loop's share: `ingest serve`'s app in this process (Starlette's ASGI app through httpx's
ASGI transport, no socket, no model): the health, metrics and error lines, the input checks, a search of an absent
store (503, no password), and the embeddings tokenizer. The real server, clients and store are tests/test_serve.py's."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from ingest.config import load_config
from ingest.model_ref import resolve_model
from ingest.serve_app import make_app
from ingest.serve_batch import Tokenizer, TooLong
from ingest.serve_metrics import Metrics
from ingest.serve_state import State


def _ask(app, method: str, path: str, **kw) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.request(method, path, **kw)
    return asyncio.run(go())


@pytest.fixture
def app(tmp_path: Path):
    cfg = load_config(overrides={"store.uri": str(tmp_path / "absent.db")})
    state = State(cfg, None, False, Metrics(False))
    yield make_app(state, "k3y")
    state.close()


def test_health_metrics_and_the_key(app) -> None:
    assert _ask(app, "GET", "/healthz").status_code == 200                      # no key needed
    assert _ask(app, "POST", "/search", json={"query": "x"}).status_code == 401
    key = {"Authorization": "Bearer k3y"}
    assert _ask(app, "POST", "/search", json={"query": "x"}, headers={"Authorization": "Bearer nope"}).status_code == 401
    metrics = _ask(app, "GET", "/metrics", headers=key).text
    assert "# TYPE" in metrics and "ingest_serve_requests" in metrics


@pytest.mark.parametrize("body, param", [({"query": ""}, "query"), ({"query": 3}, "query"), ({"query": "x", "k": 0}, "k"),
                                         ({"query": "x", "k": 10 ** 6}, "k"), ({"query": "x", "mode": "fuzzy"}, "mode")])
def test_bad_search_input_is_one_json_line_naming_what_to_fix(app, body: dict, param: str) -> None:
    res = _ask(app, "POST", "/search", json=body, headers={"Authorization": "Bearer k3y"})
    assert res.status_code == 400 and res.text.count("\n") == 1 and res.json()["error"]["param"] == param, res.text


def test_malformed_json_and_an_absent_store(app) -> None:
    key = {"Authorization": "Bearer k3y"}
    res = _ask(app, "POST", "/search", content=b"{not json", headers=key)
    assert res.status_code == 400 and res.json()["error"]["message"], res.text
    res = _ask(app, "POST", "/search", json={"query": "lamp"}, headers=key)
    assert res.status_code == 503 and "no store at" in res.json()["error"]["message"], res.text
    res = _ask(app, "POST", "/v1/embeddings", json={"model": "m", "input": []}, headers=key)
    assert res.status_code == 400 and json.loads(res.text)["error"]["param"] == "input", res.text


def test_the_embeddings_tokenizer_refuses_a_text_over_the_models_limit() -> None:
    ref = resolve_model()
    tok = Tokenizer(ref.tokenizer_file, ref.max_seq_length)
    got = tok(["a purple octopus", "the lamp"])
    assert len(got.lengths) == 2 and int(got.lengths.sum()) == got.ids.size
    with pytest.raises(TooLong) as err:
        tok(["short", "word " * 1000])
    assert err.value.index == 1 and "256" in str(err.value)


def test_a_store_error_reads_as_a_clients_advice_without_the_password() -> None:
    uri = "postgresql://ingest:s3cret@127.0.0.1:1/db"
    state = State(load_config(overrides={"store.uri": uri}), None, False, Metrics(False))
    try:
        line = state.scrub(f"store {uri} did not answer within 3 s (trying to search); check the server, then rerun: "
                           "the rerun resumes")
        assert "s3cret" not in line and line.endswith("check the server, then try again"), line
    finally:
        state.close()
