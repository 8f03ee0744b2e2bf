"""Tokenizer processes of the encode pool: a window of texts in, length-sorted padded batches out;
and TokenizerPool, the parent's pebble pool of them.

The processes use `tokenizers` and numpy, never torch. Truncation matches what
sentence-transformers asks of its Hugging Face fast tokenizer (truncation="longest_first",
max_length=the model's max_seq_length, special tokens added, right side), so the token ids
are the ones SentenceTransformer.encode would feed the model. The tokenizer.json's own
truncation and padding settings are replaced, as the fast tokenizer does per call.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import Future
from itertools import chain
from typing import Callable

import numpy as np
from pebble import ProcessExpired, ProcessPool

from ..failure import Failure
from ..spawn import SPAWN, watch_parent
from ._messages import TokenBatch, TokenizedWindow

_tokenizer = None
_pad_id = 0


def load_tokenizer(tokenizer_file: str, max_length: int):
    """(tokenizer, pad id) configured like sentence-transformers' tokenizer call."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    padding = tok.padding
    pad_id = padding["pad_id"] if padding else (tok.token_to_id("[PAD]") or tok.token_to_id("<pad>") or 0)
    tok.enable_truncation(max_length=max_length, stride=0, strategy="longest_first", direction="right")
    tok.no_padding()
    return tok, pad_id


def init_tokenizer_process(tokenizer_file: str, max_length: int, threads: int) -> None:
    """pebble initializer of each tokenizer process. threads > 1 lets encode_batch run on that
    many cores (feeding a GPU needs several: one core tokenizes ~3,500 chunks of 183 tokens
    a second); 1 when the encode workers compute on the CPU, to leave the cores to them."""
    global _tokenizer, _pad_id
    watch_parent()
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    os.environ["RAYON_NUM_THREADS"] = str(threads)       # read when the first batch is encoded
    _tokenizer, _pad_id = load_tokenizer(tokenizer_file, max_length)


def tokenize_window(texts: list[str], batch_size: int) -> TokenizedWindow:
    """pebble task: tokenize a window and cut it into batches of similar length."""
    started = time.perf_counter()
    ids = [enc.ids for enc in _tokenizer.encode_batch(texts)]
    batches = bucket_by_length(ids, batch_size, _pad_id)
    return TokenizedWindow(batches, time.perf_counter() - started)


def bucket_by_length(ids: list[list[int]], batch_size: int, pad_id: int) -> tuple[TokenBatch, ...]:
    """Sort rows longest first (stable) and pad each batch only to its own longest row."""
    lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
    order = np.argsort(-lengths, kind="stable").astype(np.int32)
    flat = np.fromiter(chain.from_iterable(ids[i] for i in order), dtype=np.int32, count=int(lengths.sum()))
    batches, offset = [], 0
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        row_lengths = lengths[rows]
        longest = int(row_lengths[0])
        padded = np.full((len(rows), longest), pad_id, dtype=np.int32)
        mask = np.arange(longest) < row_lengths[:, None]
        used = int(row_lengths.sum())
        padded[mask] = flat[offset:offset + used]     # row-major fill = row after row
        offset += used
        batches.append(TokenBatch(positions=rows, ids=padded, lengths=row_lengths))
    return tuple(batches)


class TokenizerPool:
    """The parent's side: a pebble pool of these processes. pebble replaces a process that dies
    or times out in a task; a pool broken by an idle process's death is replaced whole."""

    def __init__(self, tokenizer_file: str, max_length: int, workers: int, threads: int, timeout_s: float):
        self._options = dict(max_workers=workers, initializer=init_tokenizer_process,
                             initargs=(tokenizer_file, max_length, threads), context=SPAWN)
        self._timeout_s = timeout_s
        self.restarts = 0
        self._pool = ProcessPool(**self._options)

    def submit(self, texts: list[str], batch_size: int, done: Callable[[Future], None]) -> None:
        """Tokenize `texts` in a process; `done(future)` runs in a pebble thread."""
        args = (texts, batch_size)
        try:
            future = self._pool.schedule(tokenize_window, args=args, timeout=self._timeout_s)
        except RuntimeError:                   # pebble's pool breaks if an idle worker dies: start anew
            self.stop()
            self.restarts += 1
            self._pool = ProcessPool(**self._options)
            future = self._pool.schedule(tokenize_window, args=args, timeout=self._timeout_s)
        future.add_done_callback(done)

    def failure(self, exc: BaseException) -> Failure:
        """What a failed task's exception means, as a Failure (its error: one line)."""
        what = (f"killed ({Failure.describe_exit(exc.exitcode)})" if isinstance(exc, ProcessExpired)
                else f"timed out after {self._timeout_s:g} s" if isinstance(exc, TimeoutError)
                else f"raised {type(exc).__name__}: {exc}")
        return Failure("tokenizer process", what, pid=getattr(exc, "pid", None),
                       traceback=str(exc.__cause__ or "") or None)

    def stop(self) -> None:
        self._pool.stop()
        self._pool.join(5)
