"""The chunk step: page text -> chunks measured in the model's own tokens (runs in loader workers).

Uses the fast `tokenizers` library (0.05 s to import) rather than transformers, with
langchain's RecursiveCharacterTextSplitter counting tokens exactly as
`from_huggingface_tokenizer` does; a final guard hard-splits any chunk that would still
exceed the model's max_seq_length, so nothing is silently truncated.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class PageChunks:
    """One page's chunks; page is 1-based, None for formats without pages."""
    page: int | None
    chunks: tuple[str, ...]
    title: str | None = None


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
