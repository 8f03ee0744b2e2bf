"""The chunk step: page text -> chunks measured in the model's own tokens (runs in loader workers).

Uses the fast `tokenizers` library (0.05 s to import) rather than transformers, with
langchain's RecursiveCharacterTextSplitter counting tokens exactly as
`from_huggingface_tokenizer` does; a final guard hard-splits any chunk that would still
exceed the model's max_seq_length, so nothing is silently truncated. Chunks are bounded in
tokens, not bytes, and a run of 100+ letters without a space is a single [UNK] token, so
`page_chunks` also cuts any chunk over the store's text field (65,535 bytes), and counts it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ingest.store import TEXT_MAX as MAX_CHUNK_BYTES


@dataclass(frozen=True)
class PageChunks:
    """One page's chunks; page is 1-based, None for formats without pages."""
    page: int | None
    chunks: tuple[str, ...]
    title: str | None = None
    cut: int = 0                     # chunks over MAX_CHUNK_BYTES, cut at character boundaries


def page_chunks(page: int | None, text: str, spec: ChunkSpec, title: str | None = None) -> PageChunks:
    """The page's chunks, each at most MAX_CHUNK_BYTES of UTF-8 (the store's text field)."""
    chunks, cut = [], 0
    for chunk in split_text(text, spec):
        if len(chunk) * 4 <= MAX_CHUNK_BYTES or len(chunk.encode()) <= MAX_CHUNK_BYTES:
            chunks.append(chunk)
            continue
        cut += 1
        data = chunk.encode()
        while data:
            piece = data[:MAX_CHUNK_BYTES].decode(errors="ignore")     # drops a split character's tail bytes
            chunks.append(piece)
            data = data[len(piece.encode()):]
    return PageChunks(page, tuple(chunks), title, cut)


@dataclass(frozen=True)
class ChunkSpec:
    tokenizer_file: str
    max_seq_length: int
    chunk_tokens: int
    overlap_tokens: int

    @property
    def limit(self) -> int:          # room left after [CLS] and [SEP]
        return min(self.chunk_tokens, self.max_seq_length - 2)


@lru_cache(maxsize=4)
def _tokenizer(path: str):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.no_truncation()
    tok.no_padding()
    return tok


@lru_cache(maxsize=4)
def _splitter(spec: ChunkSpec):
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    tok = _tokenizer(spec.tokenizer_file)
    return RecursiveCharacterTextSplitter(
        chunk_size=spec.limit,
        chunk_overlap=min(spec.overlap_tokens, spec.limit // 2),
        length_function=lambda t: len(tok.encode(t, add_special_tokens=False).ids),
    )


def split_text(text: str, spec: ChunkSpec) -> list[str]:
    """Chunks of `text`, none longer than spec.limit tokens."""
    text = text.strip()
    if not text:
        return []
    tok = _tokenizer(spec.tokenizer_file)
    out: list[str] = []
    for chunk in _splitter(spec).split_text(text):
        enc = tok.encode(chunk, add_special_tokens=False)
        if len(enc.ids) <= spec.limit:
            out.append(chunk)
            continue
        for start in range(0, len(enc.ids), spec.limit):   # hard split on token offsets
            offs = enc.offsets[start:start + spec.limit]
            piece = chunk[offs[0][0]:offs[-1][1]].strip()
            if piece:
                out.append(piece)
    return out
