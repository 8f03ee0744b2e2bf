"""The HTTP face of `ingest serve` (a Starlette app): POST /search, POST /v1/embeddings (OpenAI's shapes),
GET /v1/models, /status, /healthz and /metrics; the input checks, the API key and the error lines.

Every error is one JSON line, {"error": {"message", "type", "param", "code"}} (OpenAI's shape, for every
route): 400 a request to fix (the message says what), 401 no or a wrong API key, 404 an unknown route or
model, 405 a wrong method, 413 a body over MAX_BODY, 503 the store or the model cannot answer now (why),
500 a fault of ours (logged on one line). The blocking work (search, tokenizing, status) runs in worker
threads (a search waits for the one before it at most serve_state.BUSY_S; the store's calls have [store]
timeout_s; an embeddings request waits for its batch the pool's timeout_s and a margin); the event loop only
parses and answers.
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import json
import math
import sys
import time
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ingest.serve_batch import Closed, TooLong
from ingest.serve_state import State, Unavailable
from ingest.store import MODES

MAX_BODY = 4 * 2**20          # bytes in a request body
MAX_QUERY_CHARS = 4096        # characters in a search query
MAX_K = 100                   # hits a search returns at most
MAX_INPUTS = 2048             # texts in one embeddings request (OpenAI's limit)
MAX_TOKENS = 131072           # tokens in one embeddings request
INLINE_CHARS = 2048            # an embeddings request this short is tokenized on the event loop (~50 us)
_THREADS = 16                 # worker threads for the blocking calls of requests


class ApiError(Exception):
    """An answer other than 200: its status and one line saying what to fix."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def make_app(state: State, api_key: str | None) -> Guard:
    """The ASGI app: the routes behind the Guard (API key, body size, metrics, errors)."""
    limiter = anyio.CapacityLimiter(_THREADS)

    async def blocking(fn: Any, *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)

    async def search(request: Request) -> Response:
        body = await _json_object(request)
        query = _text(body.get("query"), "query")
        if len(query) > MAX_QUERY_CHARS:
            raise ApiError(400, f"query has {len(query)} characters; send at most {MAX_QUERY_CHARS}", "query")
        k = body.get("k", 5)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
            raise ApiError(400, f"k must be an integer from 1 to {MAX_K}, got {json.dumps(k)[:40]}", "k")
        mode = body.get("mode")
        if mode is not None and mode not in MODES:
            raise ApiError(400, f"mode must be one of {', '.join(MODES)}, got {json.dumps(mode)[:40]}", "mode")
        return _ok(await blocking(state.search, query, k, mode))

    async def embeddings(request: Request) -> Response:
        body = await _json_object(request)
        texts = _inputs(body.get("input"))
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise ApiError(400, f"encoding_format must be \"float\" or \"base64\", got {json.dumps(fmt)[:40]}",
                           "encoding_format")
        embedder = state.ready_embedder() or await blocking(state.embedder)
        model = body.get("model")
        if not isinstance(model, str) or model not in embedder.aliases:
            raise ApiError(404 if isinstance(model, str) else 400,
                           f"model {json.dumps(model)[:80]} is not served here; use \"{embedder.name}\" (GET /v1/models)",
                           "model", "model_not_found")
        dims = body.get("dimensions")
        if dims is not None and dims != embedder.dim:
            raise ApiError(400, f"dimensions must be {embedder.dim} (this model's) or left out, got {json.dumps(dims)[:40]}",
                           "dimensions")
        try:                                  # a few short texts tokenize faster than a thread hop
            small = sum(map(len, texts)) <= INLINE_CHARS
            tokens = embedder.tokenize(texts) if small else await blocking(embedder.tokenize, texts)
        except TooLong as exc:
            raise ApiError(400, str(exc), "input") from None
        if tokens.ids.size > MAX_TOKENS:
            raise ApiError(400, f"the inputs hold {tokens.ids.size} tokens; send at most {MAX_TOKENS} a request",
                           "input")
        try:
            future = embedder.batcher.submit(tokens)
            rows = await asyncio.wait_for(asyncio.wrap_future(future), embedder.batcher.timeout_s)
        except (Closed, asyncio.TimeoutError) as exc:
            raise Unavailable(f"the texts were not embedded: {exc or 'timed out'}") from None
        except Exception as exc:             # the pool's EncodeError: one line
            raise Unavailable(f"the encode pool failed: {' '.join(str(exc).split())[:300]}") from None
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(row.astype("<f4").tobytes()).decode() if fmt == "base64" else row.tolist()}
                for i, row in enumerate(rows)]
        n = int(tokens.ids.size)
        return _ok({"object": "list", "data": data, "model": embedder.name,
                    "usage": {"prompt_tokens": n, "total_tokens": n}})

    async def models(request: Request) -> Response:
        embedder = state.ready_embedder() or await blocking(state.embedder)
        return _ok({"object": "list", "data": [{"id": embedder.name, "object": "model", "created": 0,
                                                "owned_by": "ingest"}]})

    async def status(request: Request) -> Response:
        return _ok(json.loads(state.scrub(json.dumps(await blocking(state.status), ensure_ascii=False))))

    async def healthz(request: Request) -> Response:
        return _ok(state.health())

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.text(), media_type="text/plain; version=0.0.4")

    routes = [Route("/search", search, methods=["POST"]), Route("/v1/embeddings", embeddings, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]), Route("/status", status, methods=["GET"]),
              Route("/healthz", healthz, methods=["GET"]), Route("/metrics", metrics, methods=["GET"])]
    handlers = {ApiError: _api_error, Unavailable: _unavailable, HTTPException: _http_error}
    return Guard(Starlette(routes=routes, exception_handlers=handlers), state, api_key)  # type: ignore[arg-type]


class Guard:
    """Pure ASGI around the app: the API key (all but /healthz), a declared body over MAX_BODY, the request's
    metrics, and a fault of ours as one 500 line."""

    def __init__(self, app: Any, state: State, api_key: str | None):
        self.app, self.state = app, state
        self._key = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, seen = time.perf_counter(), {"status": 0}

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            await send(message)
        headers = dict(scope["headers"])
        try:
            if self._key is not None and scope["path"] != "/healthz" and not hmac.compare_digest(
                    headers.get(b"authorization", b""), self._key):
                await _send(sending, ApiError(401, "missing or wrong API key: send the header "
                                                   "\"Authorization: Bearer KEY\"", code="invalid_api_key"))
            elif _declared(headers) > MAX_BODY:
                await _send(sending, _too_big())
            else:
                await self.app(scope, receive, sending)
        except Exception as exc:                      # a fault of ours: one line, the server goes on
            print(self.state.scrub(f"serve: error: {scope['method']} {scope['path']}: {type(exc).__name__}: "
                                   f"{' '.join(str(exc).split())[:300]}"), file=sys.stderr, flush=True)
            if not seen["status"]:
                await _send(sending, ApiError(500, f"internal error ({type(exc).__name__}); the server log has it"))
        finally:
            self.state.metrics.request(scope["path"], seen["status"] or 500, time.perf_counter() - started)


def _declared(headers: dict[bytes, bytes]) -> int:
    try:
        return int(headers.get(b"content-length", b"0"))
    except ValueError:
        return 0


def _too_big() -> ApiError:
    return ApiError(413, f"the body is over {MAX_BODY} bytes; send fewer or shorter texts")


async def _json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object, read up to MAX_BODY bytes."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise _too_big()
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"the body is not JSON ({' '.join(str(exc).split())[:120]}); send a JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body is a JSON {type(body).__name__}; send a JSON object")
    return body


def _text(value: Any, param: str) -> str:
    """A non-empty string that is valid Unicode."""
    if not isinstance(value, str):
        raise ApiError(400, f"{param} must be a string, got {'nothing' if value is None else type(value).__name__}", param)
    if not value.strip():
        raise ApiError(400, f"{param} is empty; send some text", param)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{param} is not valid Unicode (a lone surrogate); send UTF-8 text", param) from None
    return value


def _inputs(value: Any) -> list[str]:
    """`input`: a string or a list of 1 to MAX_INPUTS strings (token ids are refused: the model has its own)."""
    if isinstance(value, str):
        return [_text(value, "input")]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "input must be a string or a non-empty list of strings", "input")
    if len(value) > MAX_INPUTS:
        raise ApiError(400, f"input has {len(value)} texts; send at most {MAX_INPUTS} a request", "input")
    if any(isinstance(v, (int, list)) and not isinstance(v, bool) for v in value):
        raise ApiError(400, "input holds token ids; send text (this model tokenizes itself; LangChain: "
                            "OpenAIEmbeddings(check_embedding_ctx_length=False))", "input")
    return [_text(v, f"input[{i}]") for i, v in enumerate(value)]


def _ok(payload: Any) -> Response:
    return Response(json.dumps(payload, ensure_ascii=False, allow_nan=False, default=_plain), media_type="application/json")


def _plain(value: Any) -> Any:
    """JSON for what json does not know (numpy scalars in a hit)."""
    if hasattr(value, "item"):
        item = value.item()
        return None if isinstance(item, float) and not math.isfinite(item) else item
    raise TypeError(f"{type(value).__name__} is not JSON")


def _error(exc: ApiError) -> Response:
    kind = {401: "authentication_error", 404: "not_found_error", 503: "service_unavailable"}.get(
        exc.status, "invalid_request_error" if exc.status < 500 else "server_error")
    line = json.dumps({"error": {"message": exc.message, "type": kind, "param": exc.param, "code": exc.code}},
                      ensure_ascii=False)
    return Response(line + "\n", exc.status, media_type="application/json")


async def _send(send: Any, exc: ApiError) -> None:
    response = _error(exc)
    await send({"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


async def _api_error(request: Request, exc: Exception) -> Response:
    return _error(exc)  # type: ignore[arg-type]


async def _unavailable(request: Request, exc: Exception) -> Response:
    return _error(ApiError(503, str(exc)))


async def _http_error(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    what = {404: f"no route {request.url.path}; the routes are POST /search, POST /v1/embeddings, GET /v1/models, "
                 "GET /status, GET /healthz, GET /metrics",
            405: f"{request.method} is not allowed on {request.url.path}"}.get(status, str(getattr(exc, "detail", "")))
    return _error(ApiError(status, what))
