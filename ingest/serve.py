"""`ingest serve`: the store as a warm search service and its model as an OpenAI-compatible embeddings endpoint,
kept current by `--watch FOLDER` (docs/serve.md). The app is ingest/serve_app.py, what it keeps warm
ingest/serve_state.py, the embeddings batcher ingest/serve_batch.py, the metrics ingest/serve_metrics.py; this
module is the command: its arguments, the API key rule, the socket, the threads and the stop signals.

NOTE (threads, signals, shutdown):
- The HTTP server (uvicorn, one asyncio loop) runs in the thread ingest-serve-http, on a socket bound here
  first (a port in use is one line, exit 2). Blocking work runs in worker threads (serve_app NOTE), the
  embeddings in the batcher's (serve_batch NOTE). Nothing starts at import.
- Without --watch the main thread waits for a stop signal (its handler records it and tells uvicorn to
  stop), joining the HTTP thread with a timeout.
- With --watch the main thread runs `ingest watch` itself (its syncs' stop handling needs the main thread:
  ingest/watch.py NOTE), and its report is written as `ingest watch` writes it. A signal still stops the
  HTTP server at once: the signal's byte on `signal.set_wakeup_fd`'s pipe is read by the thread
  ingest-serve-stop, which tells uvicorn, whatever Python handler watch or its sync has installed.
- Stopping: uvicorn closes the socket (no new connection), lets the requests in flight finish for at most
  GRACE_S, then ends; then the batcher, the encode pool and the store are closed. The exit code is 128 + the
  first signal (130 SIGINT, 143 SIGTERM); with --watch, watch's.
- The API key (an --api-key-file's first line, else $INGEST_API_KEY) is required unless the host is a
  loopback address, and compared in constant time (hmac.compare_digest) to the request's
  `Authorization: Bearer KEY`; GET /healthz needs none.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import select
import signal
import socket
import sys
import threading
from importlib.util import find_spec
from pathlib import Path
from typing import Any

ENV_KEY = "INGEST_API_KEY"
GRACE_S = 10.0            # requests in flight at a stop signal get this long to finish
JOIN_S = GRACE_S + 5.0    # the HTTP thread is waited for this long after it was told to stop
POLL_S = 0.5
EXTRA = "pip install 'ingest[serve]'"


class ServeError(Exception):
    """The server cannot start: one line (exit 2)."""


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """`ingest serve`'s arguments (ingest/cli.py's subcommand)."""
    p = sub.add_parser("serve", parents=parents, help="answer searches and embeddings over HTTP (docs/serve.md)")
    p.add_argument("--watch", type=Path, metavar="FOLDER", help="also keep the store in sync with FOLDER, as "
                   "ingest watch does, in the same process")
    p.add_argument("--debounce", type=float, default=2.0, metavar="SECONDS",
                   help="with --watch: a changed file is ingested once quiet this long (default 2)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                   f"needs an API key: --api-key-file or ${ENV_KEY})")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    p.add_argument("--api-key-file", type=Path, metavar="FILE", help="a file whose first line is the API key "
                   "clients send as \"Authorization: Bearer KEY\"")
    p.add_argument("--quiet", action="store_true", help="with --watch: no progress bars or sync lines")


def serve(cfg: dict[str, Any], args: argparse.Namespace) -> int:
    """Serve until a stop signal: 130 or 143 (NOTE). ServeError: one line why it cannot start."""
    if missing := [m for m in ("uvicorn", "starlette") if not _installed(m)]:
        raise ServeError(f"ingest serve needs the package {missing[0]}, which is not installed; {EXTRA}")
    key = api_key(args.host, args.api_key_file)
    if args.watch is not None and not args.watch.is_dir():
        raise ServeError(f"folder {args.watch} not found; pass an existing folder to --watch")
    from ingest.store import kind, redact

    if args.watch is not None and kind(cfg["store"]["uri"]) == "qdrant-local":
        raise ServeError("--watch cannot share a Qdrant local-mode store (one process opens it at a time); use a "
                         "Qdrant server, Milvus Lite or LanceDB, or serve without --watch")
    import uvicorn

    from ingest.serve_app import make_app
    from ingest.serve_metrics import Metrics
    from ingest.serve_state import State

    sock = _listen(args.host, args.port)
    state = State(cfg, args.model, args.watch is not None, Metrics(args.watch is not None))
    server = uvicorn.Server(uvicorn.Config(make_app(state, key), log_level="warning", access_log=False, lifespan="off",
                                           timeout_graceful_shutdown=int(GRACE_S)))
    http = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="ingest-serve-http", daemon=True)
    http.start()
    host, port = sock.getsockname()[:2]
    print(f"serve: listening on http://{_url_host(host)}:{port} (store {redact(cfg['store']['uri'])}, collection "
          f"{cfg['store']['collection']}{', API key required' if key else ''}); Ctrl-C stops", file=sys.stderr, flush=True)
    try:
        if args.watch is None:
            threading.Thread(target=state.warm, name="ingest-serve-warm", daemon=True).start()
            return _wait(server, http)
        return _watch(cfg, args, server, state)
    finally:
        server.should_exit = True
        http.join(JOIN_S)
        state.close()
        sock.close()


def _installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it."""
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def api_key(host: str, path: Path | None) -> str | None:
    """The API key (NOTE), or None on a loopback host without one; ServeError if one is needed and missing."""
    key = None
    if path is not None:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ServeError(f"cannot read the API key file {path}: {getattr(exc, 'strerror', None) or exc}") from None
        key = lines[0].strip() if lines else ""
        if not key:
            raise ServeError(f"the API key file {path} is empty; put the key on its first line")
    elif os.environ.get(ENV_KEY, "").strip():
        key = os.environ[ENV_KEY].strip()
    if key is None and not _loopback(host):
        raise ServeError(f"--host {host} is reachable from other machines: give an API key (--api-key-file FILE, or "
                         f"the environment variable {ENV_KEY}), or listen on 127.0.0.1")
    return key


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port; ServeError (one line) if it cannot be had."""
    try:
        family, kind_, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind_, proto)
    except (OSError, OverflowError) as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}; choose "
                         "another --host or --port") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --host or "
                         "--port") from None
    return sock


def _wait(server: Any, http: threading.Thread) -> int:
    """Without --watch: wait for a stop signal, tell uvicorn (NOTE); 128 + the signal."""
    got: list[int] = []

    def handle(signum: int, frame: Any) -> None:
        got.append(signum)
        server.should_exit = True
    old = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while http.is_alive():
            http.join(POLL_S)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if not got:
        raise ServeError("the HTTP server stopped on its own; the lines above say why")
    return 128 + got[0]


def _watch(cfg: dict[str, Any], args: argparse.Namespace, server: Any, state: Any) -> int:
    """With --watch: `ingest watch` in this (the main) thread; a signal also stops the HTTP server (NOTE)."""
    from ingest.watch import watch

    read, write = os.pipe()
    os.set_blocking(write, False)
    old = signal.set_wakeup_fd(write)
    done = threading.Event()

    def stop_on_signal() -> None:
        while not done.is_set():
            if select.select([read], [], [], POLL_S)[0]:
                if {signal.SIGINT, signal.SIGTERM} & set(os.read(read, 64)):
                    server.should_exit = True
    stopper = threading.Thread(target=stop_on_signal, name="ingest-serve-stop", daemon=True)
    stopper.start()
    first = threading.Event()

    def synced(totals: dict[str, Any]) -> None:
        state.synced(totals)
        if not first.is_set():                        # the store is open now: load the models
            first.set()
            threading.Thread(target=state.warm, name="ingest-serve-warm", daemon=True).start()
    try:
        return watch(cfg, args.watch, quiet=args.quiet, debounce_s=args.debounce, on_sync=synced)
    finally:
        signal.set_wakeup_fd(old)
        done.set()
        stopper.join(POLL_S * 2)
        os.close(read)
        os.close(write)
