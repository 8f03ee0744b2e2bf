"""Tokenizer processes of the encode pool: a window of texts in, length-sorted padded batches out.

They import only `tokenizers` and numpy, never torch. Truncation matches what
sentence-transformers asks of its Hugging Face fast tokenizer (truncation="longest_first",
max_length=the model's max_seq_length, special tokens added, right side), so the token ids
are the ones SentenceTransformer.encode would feed the model. The tokenizer.json's own
truncation and padding settings are replaced, as the fast tokenizer does per call.
"""
from __future__ import annotations

import os
import time
from itertools import chain

import numpy as np

from .encode_protocol import TokenBatch, TokenizedWindow
from .spawn import watch_parent

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
