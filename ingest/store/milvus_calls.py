"""Milvus calls: each with the store's timeout, a failure classed as refused or unreachable, a server's retried
on a new client (a mixin of `ingest.store.milvus.Store`, which gives it `client`, `_drop_client`, `_host`,
`_opening`)."""
from __future__ import annotations

import re
from typing import Any, Callable

from ingest.store.errors import Disconnected, StoreError, StoreRejected, one_line, refused, retry

_RELEASED = re.compile(r"in state 'released'|not loaded", re.I)
_TIMED_OUT = re.compile(r"deadline.?exceeded|timed? ?out", re.I)   # the call's own timeout ran out: not a refusal


def is_local(uri: str) -> bool:
    """A Milvus Lite path (not a server URI)."""
    return "://" not in uri


class MilvusCalls:
    """NOTE (timeouts): every call on the client goes through `call` (or, for the column upsert's
    gRPC call, the same `_guard`), with timeout=timeout_s. A call that fails is classified by a
    short ping: if the server still answers, and the call did not run out of its own timeout (a stalled server
    may answer again by the time of the ping), the call was refused (StoreRejected, charged to the
    rows' files by the writer); if not, the store is unreachable or stalled (StoreError: the run
    stops with one line, exit 2, and a rerun resumes from the manifest); a server's
    Disconnected is retried first (ingest.store.errors NOTE: reconnect protocol). An upsert answered with
    a non-zero status, or with a value its field cannot hold, is refused too."""

    def call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """client.method(*args, **kwargs, timeout=timeout_s); a failure becomes StoreRejected or StoreError
        (`what` says what was being done, for the message)."""
        def once() -> Any:
            run = lambda: getattr(self.client, method)(*args, timeout=self.timeout_s, **kwargs)    # noqa: E731
            try:
                return self._guard(what, run)
            except StoreRejected as exc:      # a restarted server has every collection released: load, once
                if method not in ("query", "get", "search") or not _RELEASED.search(str(exc)):
                    raise
                self._guard("load the collection", lambda: self.client.load_collection(args[0], timeout=self.timeout_s))
                return self._guard(what, run)
        return self._retry(once)

    def _retry(self, call: Callable[[], Any]) -> Any:
        """call() again on a new client while a server does not answer (ingest.store.errors NOTE: reconnect
        protocol; a server's lease keeps this run's hold meanwhile: ingest.store.server_manifest NOTE)."""
        return retry(call, self.timeout_s, self.reconnect)

    def reconnect(self) -> None:
        """A server: drop the client (gRPC's own reconnect backs off for minutes); the next call makes one."""
        if not is_local(self.uri):
            with self._opening:
                self._drop_client()

    def _guard(self, what: str, fn: Callable[[], Any]) -> Any:
        """fn(), its failure classed as refused (the server answers a ping) or unreachable."""
        try:
            return fn()
        except Disconnected:
            raise                             # no client: the server is unreachable (Store._connect)
        except Exception as exc:
            if not _TIMED_OUT.search(str(exc)) and self._answers():   # refused; a Lite full disk: DiskFull
                raise refused(what, one_line(exc), self.local_path) from None
            host = self._host
            why = f"its Milvus Lite host process is gone ({host.describe_exit()})" if host and not host.alive() \
                else one_line(exc)
            message = (f"store {self.uri} did not answer within {self.timeout_s:g} s (trying to {what}): {why}; "
                       "check the server, then rerun: the rerun resumes")
            if is_local(self.uri):
                raise StoreError(message) from None
            raise Disconnected(message, f"did not answer within {self.timeout_s:g} s") from None    # may come back

    def _answers(self) -> bool:
        try:
            self.client.has_collection(self.collection, timeout=min(5.0, self.timeout_s))
            return True
        except Exception:
            return False

