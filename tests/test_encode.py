"""The encode pool with the real packaged model (no mocks), on CPU workers.

One module-scoped pool (two CPU workers, two tokenizer processes, batches of 4) serves the
in-process tests; the test hook INGEST_FAULT (workers/encode/_worker.py) injects delays, a
hang and an exception into its workers for texts carrying a marker. Spawn safety and
orphans are checked in real subprocesses and a real Jupyter kernel.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"

from ingest.api import EncodeError, EncodePool, IngestEmbeddings  # noqa: E402
from ingest.model_ref import resolve_model  # noqa: E402

DELAY, HANG, BOOM, BOOM_ONCE, EXIT = "⏳", "HANG-ME", "BOOM", "ONCE-FAILS", "EXIT-ME"
TIMEOUT_S = 6.0
WORDS = "river stone light paper garden engine winter signal harbor market violin copper".split()


def sentences(n: int, marker: str = "", seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{marker}{i}: " + " ".join(rng.choice(WORDS, size=int(rng.integers(1, 12)))) for i in range(n)]


def assert_same(ours: np.ndarray, ref: np.ndarray, min_cos: float = 0.9999) -> None:
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= min_cos, cos


@pytest.fixture(scope="module")
def model():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(resolve_model().path, device="cpu")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    rules = [{"match": DELAY, "action": "delay", "seconds": 0.3},
             {"match": HANG, "action": "hang", "once_file": str(tmp_path_factory.mktemp("fault") / "hang")},
             {"match": BOOM, "action": "raise"},
             {"match": BOOM_ONCE, "action": "raise", "once_file": str(tmp_path_factory.mktemp("fault") / "boom")},
             {"match": EXIT, "action": "exit"}]
    os.environ["INGEST_FAULT"] = json.dumps(rules)
    try:
        with EncodePool(devices=["cpu", "cpu"], batch_size=4, tokenizer_workers=2, timeout_s=TIMEOUT_S) as p:
            yield p.wait_ready()
    finally:
        del os.environ["INGEST_FAULT"]


@pytest.mark.slow
def test_matches_sentence_transformers(pool, model):
    texts = ["hello world", "", "  leading and trailing spaces  ", "Ünïcödé — 日本語のテキスト",
             "long " * 400] + sentences(11)        # "long": 400 tokens, truncated to max_seq_length
    assert pool.dim == 384
    assert_same(pool.encode(texts), model.encode(texts))
    assert len(pool.startup_seconds) == 2 and all(0 < s < 120 for s in pool.startup_seconds)
    stats = pool.stats
    assert stats["chunks"] >= len(texts) and stats["tokenize_s"] > 0 and stats["encode_s"] > 0


def test_order_preserved_under_random_worker_delays(pool, model):
    texts = sentences(40, DELAY, seed=1)             # every batch sleeps uniform(0, 0.3) s first
    ref = model.encode(texts)
    assert_same(pool.encode(texts), ref)
    assert_same(np.stack(list(pool.encode_iter(iter(texts)))), ref)


def test_encode_groups_streams_blocking_input_with_empty_groups(pool, model):
    first_back = threading.Event()

    def groups():                                    # blocks like a document loader would
        yield "a", ["first group, alone in its window"]
        assert first_back.wait(30), "the pool waited for more input instead of dispatching"
        yield "empty-1", []
        yield "b", sentences(3, seed=2)
        yield "empty-2", ()
        yield "c", sentences(9, seed=3)

    keys = []
    for key, rows in pool.encode_groups(groups()):
        first_back.set()
        keys.append(key)
        assert rows.shape[1] == 384
        if key.startswith("empty"):
            assert rows.shape == (0, 384)
    assert keys == ["a", "empty-1", "b", "empty-2", "c"]
    [(_, c)] = [(k, r) for k, r in pool.encode_groups([("c", sentences(9, seed=3))])]
    assert_same(c, model.encode(sentences(9, seed=3)))


def test_batches_cross_in_the_shared_area_or_without_one_in_the_pipes(pool, model, monkeypatch):
    from ingest.workers.encode._area import Area

    texts = sentences(10, seed=5)
    assert all(w.area is not None and w.area.slots == 2 for w in pool._engine._coordinator.workers)
    monkeypatch.setattr(Area, "create", classmethod(lambda cls, name: None))     # a system without memfd
    with EncodePool(devices=["cpu"], batch_size=4) as bare:
        assert_same(bare.encode(texts), model.encode(texts))
        assert [w.area for w in bare._engine._coordinator.workers] == [None]


def test_sigkilled_worker_is_replaced_and_results_stay_right(pool, model):
    texts = sentences(24, DELAY, seed=4)
    restarts = pool.stats["worker_restarts"]
    rows = []
    for row in pool.encode_iter(texts):
        if not rows:                                  # mid-run: other batches are in flight
            victim = next(c for c in psutil.Process().children(recursive=True) if c.pid in pool.worker_pids)
            victim.kill()
        rows.append(row)
    assert_same(np.stack(rows), model.encode(texts))
    assert pool.stats["worker_restarts"] == restarts + 1
    assert victim.pid not in pool.worker_pids
    pool.wait_ready()                                 # the replacement starts and serves
    assert_same(pool.encode(texts[:3]), model.encode(texts[:3]))


@pytest.mark.slow
def test_hang_is_timed_out_and_worker_replaced(pool, model):
    pool.wait_ready()
    texts = sentences(6, seed=5) + [f"{HANG} in the middle"] + sentences(5, seed=6)
    restarts, pids = pool.stats["worker_restarts"], set(pool.worker_pids)
    started = time.monotonic()
    out = pool.encode(texts)
    assert time.monotonic() - started >= TIMEOUT_S
    assert_same(out, model.encode(texts))
    assert pool.stats["worker_restarts"] == restarts + 1
    assert len(pids - set(pool.worker_pids)) == 1 and all(psutil.pid_exists(p) for p in pool.worker_pids)


def test_model_exception_reaches_caller_with_traceback(pool, model):
    texts = ["alpha", f"{BOOM} goes the model", "gamma", "delta", "epsilon"]
    with pytest.raises(EncodeError) as info:
        pool.encode(texts)
    message = str(info.value)
    assert "\n" not in message and message.startswith("chunk 1 ('BOOM goes the model'): encode worker cpu")
    assert "RuntimeError: injected fault" in info.value.traceback and info.value.chunk_index == 1
    assert_same(pool.encode(texts[2:]), model.encode(texts[2:]))      # the pool still serves


def test_batch_that_raised_is_split_and_its_halves_succeed(pool, model):
    texts = sentences(3, seed=7) + [f"{BOOM_ONCE} only the first time"]      # one batch of 4
    splits = pool.stats["splits"]
    assert_same(pool.encode(texts), model.encode(texts))
    assert pool.stats["splits"] == splits + 1


def test_chunk_that_keeps_killing_its_worker_is_named(pool):
    # its own pool (the fault rules are in the environment while `pool` lives): max_attempts=1,
    # so the batch of 2 is split at its first crash and the chunk fails at its own first crash
    with EncodePool(devices=["cpu"], batch_size=2, max_attempts=1) as small:
        with pytest.raises(EncodeError) as info:
            small.encode(["fine", f"{EXIT} now", "also fine"])
        assert str(info.value).startswith(f"chunk 1 ('{EXIT} now'): encode worker cpu (pid ")
        assert str(info.value).endswith("exited with code 3 (attempt 1 of 1)")
        assert small.stats["splits"] == 1 and small.stats["worker_restarts"] == 2


def test_langchain_vector_store(pool):
    from langchain_core.vectorstores import InMemoryVectorStore

    store = InMemoryVectorStore(embedding=IngestEmbeddings(pool))
    store.add_texts(["The cat sat on the mat.", "Stock markets fell sharply today.", "A recipe for tomato soup."])
    [hit] = store.similarity_search("How do I cook soup?", k=1)
    assert hit.page_content == "A recipe for tomato soup."


# -- spawn safety and orphans, in real subprocesses --------------------------------------------

TEXTS = ["alpha beta", "the quick brown fox", ""]
SCRIPT = f"""
import sys, time
import numpy as np
from ingest.api import EncodePool, encode_multi_process
TEXTS = {TEXTS!r}
mode, out = sys.argv[1], sys.argv[2]
if mode == "function":                      # at module level: no __main__ guard anywhere
    np.save(out, encode_multi_process(TEXTS, devices=["cpu"]))
else:
    pool = EncodePool(devices=["cpu"])
    np.save(out, pool.encode(TEXTS))
    print("READY", flush=True)
    sys.stdin.readline()
    if mode == "raise":
        raise RuntimeError("the caller failed with the pool open")
    time.sleep(600)                         # mode "kill": the test SIGKILLs this process
"""


def child_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("INGEST_FAULT", None)
    return env


def run_watched(argv: list[str], cwd: Path, kill_when_ready: bool = False) -> tuple[subprocess.Popen, str, set[int]]:
    """Run argv, recording every descendant it ever has; answer its READY, or SIGKILL it then."""
    proc = subprocess.Popen(argv, cwd=cwd, env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()

    def watch() -> None:
        while proc.poll() is None:
            try:
                seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
            except psutil.Error:
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    line = proc.stdout.readline()
    if line.strip() == "READY":
        seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
        if kill_when_ready:
            proc.send_signal(signal.SIGKILL)
        else:
            proc.stdin.write("go\n")
            proc.stdin.flush()
    _, err = proc.communicate(timeout=120)
    watcher.join(5)
    return proc, err, seen


def assert_all_gone(pids: set[int], within_s: float = 5.0) -> None:
    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "orphaned processes"


def test_unguarded_script_file_and_no_orphans_after_normal_exit(tmp_path, model):
    script = tmp_path / "unguarded.py"
    script.write_text(SCRIPT)
    proc, err, seen = run_watched([sys.executable, str(script), "function", str(tmp_path / "out.npy")], tmp_path)
    assert proc.returncode == 0, err
    assert len(seen) >= 2                             # an encode worker and a tokenizer process at least
    assert_all_gone(seen)
    assert_same(np.load(tmp_path / "out.npy"), model.encode(TEXTS))


def test_python_c_and_no_orphans_after_an_exception(tmp_path, model):
    proc, err, seen = run_watched([sys.executable, "-c", SCRIPT, "raise", str(tmp_path / "out.npy")], tmp_path)
    assert proc.returncode == 1 and "the caller failed with the pool open" in err, err
    assert len(seen) >= 2
    assert_all_gone(seen)
    assert_same(np.load(tmp_path / "out.npy"), model.encode(TEXTS))


def test_no_orphans_after_parent_is_sigkilled(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(SCRIPT)
    proc, err, seen = run_watched([sys.executable, str(script), "kill", str(tmp_path / "out.npy")], tmp_path,
                                  kill_when_ready=True)
    assert proc.returncode == -signal.SIGKILL, err
    assert len(seen) >= 2
    assert_all_gone(seen)


def test_jupyter_kernel(tmp_path, model):
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path), env=child_env())
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        out: list[str] = []

        def collect(msg: dict) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        code = ("from ingest.api import encode_multi_process\n"
                f"v = encode_multi_process({TEXTS!r}, devices=['cpu'])\n"
                "print('VECTORS', v.tolist())\n")
        reply = kc.execute_interactive(code, timeout=180, output_hook=collect)
        assert reply["content"]["status"] == "ok", "".join(out)
        printed = "".join(out)
        vectors = np.array(json.loads(printed.split("VECTORS", 1)[1].strip()), dtype=np.float32)
        assert_same(vectors, model.encode(TEXTS))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
