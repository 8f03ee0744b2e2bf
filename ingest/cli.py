"""The `ingest` command line: `ingest run PATH...`, `ingest search TEXT`, `ingest status`, `ingest watch FOLDER`,
`ingest serve` (ingest/serve.py) and `ingest eval QUESTIONS.jsonl`.

Exit codes of `ingest run`: 0 every supported file was ingested (or unchanged; unsupported
files are skipped), 1 at least one file failed, 2 the run could not start or stopped on an
error (bad config, store in use, model mismatch), 128 + the signal when stopped by one: 130 Ctrl-C
(SIGINT), 143 SIGTERM (systemctl stop, docker stop, Kubernetes); the report says which.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ingest.backends import CHOICES as BACKEND_CHOICES

EXIT_ERROR = 2
SEARCH_MODES = ("dense", "bm25", "hybrid")     # ingest.store.MODES, without importing the store here


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ingest", description="Documents -> chunks -> embeddings -> Milvus.")
    p.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="config.toml to use (default: ./config.toml if present)")
    common.add_argument("--store", help="store URI: a Milvus Lite file (./ingest.db) or http://host:19530")
    common.add_argument("--collection", help="collection name")
    common.add_argument("--model", help="model name or local path")
    engine = argparse.ArgumentParser(add_help=False)        # how the files are ingested: run and watch
    engine.add_argument("--backend", choices=BACKEND_CHOICES,
                        help="encode backend (default: [model] backend, \"auto\")")
    engine.add_argument("--devices", help='encode devices: "auto", or a comma list such as cuda:0,cuda:1 or cpu,cpu')
    engine.add_argument("--engine", choices=("local", "ray"),
                        help="local processes, or Ray on [ray] address (default: [run] engine, \"local\")")
    run = sub.add_parser("run", parents=[common, engine], help="ingest files and folders")
    run.add_argument("paths", nargs="+", type=_path, metavar="PATH",
                     help="files and folders (each file's name in the store is its path from the deepest folder "
                          "holding them all), or one URL of a folder in object storage (s3://bucket/prefix)")
    run.add_argument("--report", type=Path, help="per-file JSON report (default: next to the store)")
    run.add_argument("--quiet", action="store_true", help="no progress bars or summary")
    run.add_argument("--json", action="store_true", help="at the end, print the report's totals as one JSON object")
    run.add_argument("--prune", action="store_true",
                     help="remove chunks of files that no longer exist (under the PATHs)")
    run.add_argument("--reembed", action="store_true",
                     help="drop the collection and re-embed everything (after a model or chunking change)")
    search = sub.add_parser("search", parents=[common], help="search the store")
    search.add_argument("query")
    search.add_argument("-k", type=int, default=5, help="number of hits (default 5)")
    search.add_argument("--json", action="store_true", help="print a JSON list of hits")
    search.add_argument("--mode", choices=SEARCH_MODES,
                        help="dense (embeddings; the default), bm25 (words) or hybrid (both, rank-fused)")
    search.add_argument("--no-doc-rank", dest="doc_rank", action="store_false",
                        help="dense hits in plain similarity order, not ranked towards the documents a query names")
    status = sub.add_parser("status", parents=[common], help="what the store holds and how its last run went")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    watch = sub.add_parser("watch", parents=[common, engine], help="keep the store in sync with a folder")
    watch.add_argument("folder", type=Path, help="the folder to watch")
    watch.add_argument("--report", type=Path, help="per-file JSON report of each sync (default: next to the store)")
    watch.add_argument("--quiet", action="store_true", help="no progress bars or summaries")
    watch.add_argument("--debounce", type=float, default=2.0, metavar="SECONDS",
                       help="a changed file is ingested once it has not changed for this long (default 2)")
    from ingest.serve import add_parser as add_serve      # the arguments only: the server's imports come with `serve`

    add_serve(sub, [common])
    ev = sub.add_parser("eval", parents=[common], help="score search against questions with known sources and pages")
    ev.add_argument("questions", type=Path, help="JSONL: question, source, optional pages (1-based) per line")
    ev.add_argument("-k", type=int, default=10, help="also report hit@k (always @5 and @10; default 10)")
    ev.add_argument("--mode", choices=SEARCH_MODES, help="search mode (default: as ingest search)")
    ev.add_argument("--json", action="store_true", help="print one JSON object: metrics and per-question results")
    ev.add_argument("--no-doc-rank", dest="doc_rank", action="store_false",
                    help="dense hits in plain similarity order, not ranked towards the documents a query names")
    ev.add_argument("--no-card-rank", dest="card_rank", action="store_false",
                    help="rank towards the documents a query names by their file names only, not their cards")
    ev.add_argument("--no-term-rank", dest="term_rank", action="store_false",
                    help="leave out the ranking by the question's rare words in each hit's text and headings")
    ev.add_argument("--no-statement-rank", dest="statement_rank", action="store_false",
                    help="leave out the ranking towards the tables of the financial statements a question names")
    ev.add_argument("--hide-names", action="store_true",
                    help="the store holds the documents under meaningless names (ingest.evaluate.hide_names): "
                         "map each question's source to its hidden name")
    ev.add_argument("--compare", type=Path, metavar="OTHER.json",
                    help="also show each metric's and each question's rank change since an earlier --json output")
    return p


class _Version(argparse.Action):
    """--version: `ingest <version>` from the installed package's metadata (read only when asked: 30 ms)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"ingest {version('ingest')}")
        except PackageNotFoundError:
            print("ingest (version unknown: not installed; pip install -e .)")
        parser.exit()


def _path(arg: str) -> Path | str:
    """A PATH of `ingest run`: a local file or folder, or a URL (kept as given: ingest/remote.py)."""
    from ingest import remote

    return arg if remote.is_url(arg) else Path(arg)


def _config_path(args: argparse.Namespace) -> str | None:
    return args.config or ("config.toml" if Path("config.toml").is_file() else None)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    from ingest.config import load_config

    path = _config_path(args)
    overrides = {"store.uri": args.store, "store.collection": args.collection, "model.name": args.model,
                 "model.backend": getattr(args, "backend", None), "run.engine": getattr(args, "engine", None)}
    if getattr(args, "devices", None):
        overrides["model.devices"] = "auto" if args.devices == "auto" else args.devices.split(",")
    return load_config(path, {k: v for k, v in overrides.items() if v is not None})


def _run(args: argparse.Namespace) -> int:
    from ingest import remote
    from ingest.config import ConfigError
    from ingest.engines import engine_for
    from ingest.engines.run import RunError

    cfg, paths = None, args.paths
    try:
        if urls := [p for p in paths if isinstance(p, str)]:
            if len(paths) > 1:
                raise _UserError(f"{urls[0]} is a URL, which is ingested alone; run ingest once for it and once "
                                 "for the other paths")
            if error := remote.unreadable(urls[0]):
                raise _UserError(error)
        elif missing := [p for p in paths if not os.path.lexists(p)]:
            raise _UserError(f"{missing[0]} not found; pass existing files or folders to ingest")
        cfg = _config(args)
        engine = engine_for(cfg)
    except (ConfigError, RunError, _UserError) as exc:
        unwritten = _report_unstarted(args, cfg, str(exc))
        if unwritten:
            raise _UserError(f"{exc}{unwritten}") from None
        raise
    run = engine(cfg, urls[0] if urls else paths, quiet=args.quiet, prune=args.prune, reembed=args.reembed,
                 report_path=args.report)
    global _handed_over
    _handed_over = True
    try:
        return run.execute()
    finally:
        if args.json and run.totals is not None:       # a run that could not start has none: its one line says why
            print(json.dumps(run.totals, ensure_ascii=False))


def _report_unstarted(args: argparse.Namespace, cfg: dict[str, Any] | None, error: str, code: int = EXIT_ERROR,
                      **totals: Any) -> str:
    """The report of a run stopped before the engine began (no folder, bad config, a stop signal): at --report,
    else beside the store if its URI is known (the config, --store, or the [store] uri of a config file that
    is still TOML); else none. "" or why it was not written (report.write_unstarted)."""
    from ingest.report import default_report_path, write_unstarted
    from ingest.store.base import redact

    uri = cfg["store"]["uri"] if cfg else args.store or _configured_uri(args)
    path = args.report or (default_report_path(uri) if uri else None)
    if path is None:
        return ""
    return write_unstarted(path, error, code, 0.0, {
        "store": redact(uri) if uri else uri, "collection": cfg["store"]["collection"] if cfg else args.collection,
        "model": cfg["model"]["name"] if cfg else args.model, "backend": None, **totals})


def _configured_uri(args: argparse.Namespace) -> str | None:
    """The store URI a config that failed to load names: its [store] uri, or the default; None if the
    file cannot be read as TOML."""
    from ingest.config import DEFAULTS, tomllib

    path, default = _config_path(args), DEFAULTS["store"]["uri"]
    try:
        store = tomllib.loads(Path(path).read_text(encoding="utf-8")).get("store") if path else None
    except (OSError, ValueError):
        return None
    uri = store.get("uri", default) if isinstance(store, dict) else default
    return uri if isinstance(uri, str) else None


def _store_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config of a command that reads or keeps a store: a store whose client package is not installed is
    one line naming what to install (a StoreError), before anything is opened or created. `ingest run` learns it
    from its start (the report of a run that could not start)."""
    from ingest.store.factory import check_client

    cfg = _config(args)
    check_client(cfg["store"]["uri"])
    return cfg


def _search(args: argparse.Namespace) -> int:
    from ingest.search import DEFAULT_MODE, Searcher

    cfg = _store_config(args)
    if args.k < 1:
        raise _UserError(f"-k must be at least 1, got {args.k}")
    with Searcher(cfg["store"]["uri"], cfg["store"]["collection"], args.model, timeout_s=cfg["store"]["timeout_s"]) as searcher:
        mode, note = searcher.mode(args.mode or DEFAULT_MODE)
        if note:
            print(note, file=sys.stderr)
        hits = searcher.search([args.query], args.k, mode, args.doc_rank)[0]
    if args.json:
        print(json.dumps(hits, ensure_ascii=False, indent=1))
        return 0
    for rank, h in enumerate(hits, 1):
        page = f"p.{h['page']}" if h["page"] else "-"
        where = h["title"] + (f"  [{h['headings']}]" if h["headings"] else "")
        snippet = " ".join(h["text"].split())
        print(f"{rank:>2}. {h['score']:.4f}  {h['source']}  {page}  {where}")
        print(f"    {snippet[:200]}{'...' if len(snippet) > 200 else ''}")
    if not hits:
        print("no hits", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    from ingest.status import status

    return status(_store_config(args), as_json=args.json)


def _watch(args: argparse.Namespace) -> int:
    from ingest.watch import watch

    if not args.folder.is_dir():
        raise _UserError(f"folder {args.folder} not found; pass an existing folder to watch")
    return watch(_store_config(args), args.folder, quiet=args.quiet, report_path=args.report, debounce_s=args.debounce)


def _serve(args: argparse.Namespace) -> int:
    from ingest.serve import serve

    return serve(_store_config(args), args)


def _eval(args: argparse.Namespace) -> int:
    from ingest.evaluate import compare, compare_report, evaluate, report
    from ingest.search import DEFAULT_MODE

    cfg = _store_config(args)
    if args.k < 1:
        raise _UserError(f"-k must be at least 1, got {args.k}")
    result, note = evaluate(cfg["store"]["uri"], cfg["store"]["collection"], args.questions, args.mode or DEFAULT_MODE,
                            args.k, model=args.model, doc_rank=args.doc_rank, hide_names=args.hide_names,
                            cards=args.card_rank, terms=args.term_rank, statements=args.statement_rank)
    change = compare(result, args.compare) if args.compare else None
    if note:
        print(note, file=sys.stderr)
    if args.json:
        print(json.dumps({**result, **({"compare": change} if change else {})}, ensure_ascii=False, indent=1))
    else:
        print(report(result) + (f"\n{compare_report(change)}" if change else ""))
    return 0


class _UserError(Exception):
    pass


_decided: int | None = None     # the command's exit code once it has one (a run's report is written)
_handed_over = False            # a run's engine handles the stop signals from here on (and writes its report)


def _stop(signum: int, frame: object) -> None:
    """SIGINT or SIGTERM outside a run's own handling. Before the run: exit 130 or 143. After the command
    decided its exit code (the interpreter is closing threads and children): exit with that code at once,
    so the exit status stays what the report says."""
    if _decided is not None:
        os._exit(_decided)
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None, *, entry: bool = False) -> int:
    """The command; `entry`: this is the process's entry point, whose signal handlers stay until it exits."""
    global _decided
    in_main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
    try:
        code = _main(argv)
        sys.stdout.flush()
        sys.stderr.flush()
        _decided = code
        return code
    finally:
        if not entry:
            for s, handler in old.items():
                signal.signal(s, handler)


def entry() -> None:
    """The `ingest` command (console script and python -m ingest.cli)."""
    sys.exit(main(entry=True))


def _main(argv: list[str] | None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # No gRPC fork handlers: with a store connection open, they made children of a fork (the processes
    # a local Ray starts) abort now and then (10 in 600 forks here); our own processes are spawned.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    args = _parser().parse_args(argv)
    from ingest.backends import BackendError
    from ingest.config import ConfigError
    from ingest.model_ref import ModelNotFound
    from ingest.store import StoreError

    errors: tuple[type[Exception], ...] = (ConfigError, StoreError, ModelNotFound, BackendError, _UserError)
    try:
        if args.command in ("run", "watch", "serve"):
            from ingest.engines.run import RunError    # not for search: ingest.engines.run's imports cost time

            errors += (RunError,)
        if args.command == "eval":
            from ingest.evaluate import EvalError

            errors += (EvalError,)
        if args.command == "serve":
            from ingest.serve import ServeError

            errors += (ServeError,)
        return {"run": _run, "search": _search, "eval": _eval, "status": _status, "watch": _watch,
                "serve": _serve}[args.command](args)
    except errors as exc:
        print(f"ingest: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except SystemExit as exc:       # _stop: a stop signal before a run took its signals over; the report says so
        if args.command == "run" and not _handed_over and exc.code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
            name = signal.Signals(exc.code - 128).name
            _report_unstarted(args, None, f"{name} while the run was starting", exc.code, interrupted=True,
                              signal=name)
        raise


if __name__ == "__main__":
    entry()
