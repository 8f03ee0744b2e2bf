"""The encode pool's descriptors and the texts its tokenizer rejects (issue 20, items 8 and 9), through
the public API with real processes: a closed pool writes into no descriptor that reused its numbers,
a worker that stops halfway through a message cannot block the pool, and a text the tokenizer
rejects fails alone, at once."""
from __future__ import annotations

import itertools
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from ingest.api import EncodeError, EncodePool, encode_multi_process

LONE_SURROGATE = "a lone surrogate \ud800 is not a string the Rust tokenizer takes"


def test_a_closed_pool_writes_into_no_reused_descriptor(tmp_path: Path) -> None:
    pool = EncodePool(backend="null", devices=["cpu"])
    stream = pool.encode_iter(f"text {i}" for i in itertools.count())     # a run still open at close()
    assert len(next(stream)) == pool.dim
    pool.close()
    files = [open(tmp_path / f"file{i}", "w+b") for i in range(64)]       # they take the freed numbers
    try:
        stream.close()                        # the caller lets go of the run after the close: it wakes the pool
        for thread in threading.enumerate():  # the run's feeder ends too (it wakes the pool on its way)
            if thread.name == "ingest-encode-feeder":
                thread.join(10)
        written = [f.name for f in files if os.fstat(f.fileno()).st_size]
        assert not written, f"the closed pool wrote into {written}"
    finally:
        for f in files:
            f.close()


def test_a_worker_stalled_halfway_through_a_message_is_replaced(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker sends a message's length and one byte of it, then nothing: the coordinator must not
    wait in recv() for the rest, but see the batch time out, replace the worker and retry."""
    rule = {"match": "STALL", "action": "stall", "once_file": str(tmp_path / "stalled")}
    monkeypatch.setenv("INGEST_FAULT", json.dumps(rule))
    pool = EncodePool(backend="null", devices=["cpu"], timeout_s=3)
    out: list = []
    caller = threading.Thread(target=lambda: out.append(pool.encode(["before", "STALL here", "after"])), daemon=True)
    try:
        caller.start()
        caller.join(120)
        assert out, "the pool hung on half a message"
        assert out[0].shape == (3, pool.dim) and np.isfinite(out[0]).all()
        assert (tmp_path / "stalled").exists() and pool.stats["worker_restarts"] == 1
    finally:
        pool.close()


@pytest.fixture(scope="module")
def torch_pool():
    with EncodePool(devices=["cpu"], batch_size=4) as pool:      # the real model: rows tell the texts apart
        yield pool.wait_ready()


def test_a_text_the_tokenizer_rejects_fails_alone_and_is_not_retried(torch_pool: EncodePool) -> None:
    texts = ["The first text.", LONE_SURROGATE, "A third one, longer than the others around it.", "Fourth."]
    failures: list = []
    [(key, rows)] = list(torch_pool.encode_groups([("doc", texts)], on_failed=lambda *f: failures.append(f)))
    assert key == "doc" and np.isnan(rows[1]).all()
    good = [0, 2, 3]
    np.testing.assert_allclose(rows[good], torch_pool.encode([texts[i] for i in good]), atol=1e-5)
    [(first, count, error)] = failures
    assert (first, count) == (1, 1)
    assert "chunk 1 ('a lone surrogate" in str(error) and "tokenizer rejected it" in str(error)
    assert torch_pool.stats["retries"] == 0 and torch_pool.stats["tokenizer_restarts"] == 0

    with pytest.raises(EncodeError, match=r"chunk 1 \('a lone surrogate.*tokenizer rejected it"):
        encode_multi_process(["fine", LONE_SURROGATE], torch_pool)       # no on_failed: the call fails, naming it
    assert torch_pool.stats["retries"] == 0
    assert np.isfinite(torch_pool.encode(["the pool goes on"])).all()
