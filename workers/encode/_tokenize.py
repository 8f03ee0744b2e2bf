"""Tokenizer processes of the encode pool: a window of texts in, length-sorted padded batches out;
and TokenizerPool, the parent's pebble pool of them.

The processes use `tokenizers` and numpy, never torch. Truncation matches what
sentence-transformers asks of its Hugging Face fast tokenizer (truncation="longest_first",
max_length=the model's max_seq_length, special tokens added, right side), so the token ids
are the ones SentenceTransformer.encode would feed the model. The tokenizer.json's own
truncation and padding settings are replaced, as the fast tokenizer does per call.

For a tokenizer additive over whitespace (word_cache NOTE), each process keeps a word cache: a window's
ids are gathered word by word, each distinct word tokenized once, the same ids as encode_batch's at
several times its speed (bench/tokenize.py); any other tokenizer, or a window the cache path raises
on, goes through encode_batch.

A text the tokenizer rejects (a lone surrogate such as "\\ud800" is not a Rust string) fails the
whole encode_batch: the window is then tokenized text by text in the same task, and the texts it
rejects come back by position with the error, so each costs only itself. Such an error is
deterministic and never retried; only a process that died or timed out is (TokenizerPool.transient).
"""
from __future__ import annotations

import os
import time
from dataclasses import replace
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from itertools import chain
from typing import Callable

import numpy as np
from pebble import ProcessExpired, ProcessPool

from ..failure import Failure
from ..spawn import SHIELDED, watch_parent
from ._messages import BatchPlan, TokenizedWindow
from ._shapes import bucket_by_length
from .word_cache import exact_words

_tokenizer = None
_pad_id = 0
_words = None                                  # texts -> (flat ids, lengths) from a word cache, or None


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
    global _tokenizer, _pad_id, _words
    watch_parent("tokenize")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    os.environ["RAYON_NUM_THREADS"] = str(threads)       # read when the first batch is encoded
    _tokenizer, _pad_id = load_tokenizer(tokenizer_file, max_length)
    _words = exact_words(tokenizer_file, _tokenizer, max_length)


def tokenize_window(texts: list[str], plan: BatchPlan) -> TokenizedWindow:
    """pebble task: tokenize a window and cut it into batches of similar length."""
    started = time.perf_counter()
    kept, rejected = None, ()
    try:
        flat, lengths = _words(texts)
    except Exception:                           # no word cache (None), or a text it cannot take: the tokenizer
        try:
            ids = [enc.ids for enc in _tokenizer.encode_batch(texts)]
        except Exception:                       # some text is refused: find it (module docstring)
            ids, kept, rejected = _one_by_one(texts)
        lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
    batches = bucket_by_length(flat, lengths, _pad_id, plan)
    if kept is not None:                        # positions among the kept texts -> in the window
        batches = tuple(replace(b, positions=kept[b.positions]) for b in batches)
    return TokenizedWindow(batches, time.perf_counter() - started, rejected)


def _one_by_one(texts: list[str]) -> tuple[list[list[int]], np.ndarray, tuple[tuple[int, str], ...]]:
    """(ids of the texts the tokenizer takes, their positions, (position, error) of those it rejects)."""
    ids, kept, rejected = [], [], []
    for position, text in enumerate(texts):
        try:
            ids.append(_tokenizer.encode(text).ids)
            kept.append(position)
        except Exception as exc:
            rejected.append((position, " ".join(f"{type(exc).__name__}: {exc}".split())[:200]))
    return ids, np.array(kept, dtype=np.int32), tuple(rejected)


class TokenizerPool:
    """The parent's side: a pebble pool of these processes. pebble replaces a process that dies
    or times out in a task; a pool broken by an idle process's death is replaced whole."""

    def __init__(self, tokenizer_file: str, max_length: int, workers: int, threads: int, timeout_s: float):
        self._options = dict(max_workers=workers, initializer=init_tokenizer_process,
                             initargs=(tokenizer_file, max_length, threads), context=SHIELDED)
        self._timeout_s = timeout_s
        self.restarts = 0
        self._pool = ProcessPool(**self._options)

    def submit(self, texts: list[str], plan: BatchPlan, done: Callable[[Future], None]) -> None:
        """Tokenize `texts` in a process; `done(future)` runs in a pebble thread."""
        args = (texts, plan)
        try:
            future = self._pool.schedule(tokenize_window, args=args, timeout=self._timeout_s)
        except RuntimeError:                   # pebble's pool breaks if an idle worker dies: start anew
            self.stop()
            self.restarts += 1
            self._pool = ProcessPool(**self._options)
            future = self._pool.schedule(tokenize_window, args=args, timeout=self._timeout_s)
        future.add_done_callback(done)

    @staticmethod
    def transient(exc: BaseException) -> bool:
        """Whether a failed task may succeed if tried again: its process died or timed out (not: it raised)."""
        return isinstance(exc, (ProcessExpired, TimeoutError, BrokenProcessPool))

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
