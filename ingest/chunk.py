"""The chunk step: page text -> chunks measured in the model's own tokens, with each chunk's token ids
(runs in loader and OCR workers, so the encode pool need not tokenize again).

NOTE (chunks): exactly what langchain's RecursiveCharacterTextSplitter gave with a token-counting
length_function (`from_huggingface_tokenizer`), then a guard. The separators "\\n\\n", "\\n", " ", ""
are tried in turn, each kept at the start of the piece it begins; a piece under spec.limit tokens is
merged with its neighbours up to spec.limit (a token count is the sum of the pieces' counts), a
chunk starts again with up to the overlap's worth of the previous chunk's pieces, and every chunk is
stripped; a bigger piece is split at the next separator. The guard hard-splits a chunk still over
spec.limit at token offsets. Chunks are bounded in tokens, not bytes, and a run of 100+ letters
without a space is a single [UNK] token, so a chunk over the store's text field (65,535 bytes) is
cut at character boundaries, and counted. Each chunk's ids are what the encode pool's tokenizer
(`load_tokenizer(...).encode(text).ids`: [CLS] ... [SEP], truncated to max_seq_length) gives; with a
context line (`section_chunks`, see ingest.sections) the ids are those of "<context line>\n<chunk>",
the line cut at a token's end to `spec.context_room` tokens, while the chunk's text stays the chunk.
A table section is split by rows (separator "\n", no overlap) within what its header rows leave of
spec.limit, and each chunk starts with the header rows.

NOTE (tokenize once): a page is tokenized once, with each token's start: when the tokenizer is
additive over whitespace (its pre-tokenizer splits at whitespace, its normalizer works character by
character, its added tokens hold no whitespace, its post-processor only adds a prefix and a suffix:
`_Tokens.additive`), word by word from a cache of each word's tokens (workers/encode/word_cache.py), and
a span that touches whitespace (or the page's edge) at both ends has exactly the page's tokens
that start inside it: counts are two binary searches and a chunk's ids a slice of the page's.
Anything else (a span cut inside a word at the "" level, the guard's and the byte cut's pieces,
every span of another tokenizer) is tokenized for real.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from ingest.junk import drop_controls, is_junk
from ingest.sections import Box, Doc, Section, context_line, joined_headings, union_box
from ingest.store.schema import TEXT_MAX as MAX_CHUNK_BYTES
from ingest.workers.encode.word_cache import WHITESPACE, WordTokens, additive, template

SEPARATORS = ("\n\n", "\n", " ", "")
JUNK_SAMPLE_CHARS = 40                              # of a skipped chunk, in the report (repr: controls escaped)
_PATTERNS = tuple(re.compile(re.escape(s)) for s in SEPARATORS[:-1])
_EMPTY = np.zeros(0, dtype=np.int32)
_RULE = re.compile(r"^\|(?: *:?-+:? *\|)+\n?", re.M)      # a Markdown table's header rule
_PIPES = re.compile(r"(?<!\\)\|")                         # its cell separators (not an escaped \| in a cell)


@dataclass(frozen=True, eq=False)
class PageChunks:
    """One section's chunks; page is 1-based, None for formats without pages."""
    page: int | None
    chunks: tuple[str, ...]
    ids: np.ndarray                  # int32: every chunk's embedded token ids, [CLS] ... [SEP], chunk after chunk
    lengths: np.ndarray              # int32: tokens per chunk
    title: str | None = None
    cut: int = 0                     # chunks over MAX_CHUNK_BYTES, cut at character boundaries
    segment: int = 0                 # position of its section in its page
    headings: str = ""               # the heading path, joined by " > " (ingest.sections.joined_headings)
    element: str = "text"            # "text" | "table"
    bboxes: tuple[str, ...] = ()     # each chunk's "x0,y0,x1,y1" on its page (PDF points), or () when unknown
    junk: int = 0                    # chunks skipped as non-language text (ingest.junk.is_junk)
    junk_sample: str = ""            # the start of the first of them, escaped: the report shows what was skipped
    keys: bytes = b""                # each chunk's reuse key, 16 bytes each (ChunkSpec.key_secret), or b""

    def __reduce__(self) -> tuple:
        """Pickled with its two arrays as bytes (an ndarray's own pickling costs ~13 us, and a loader's answer
        holds two a section, which the supervisor unpickles), the ids in 16 bits where they fit (a vocabulary
        under 65,536, as MiniLM's: a fifth of the answer's bytes)."""
        fields = dict(self.__dict__)
        ids = np.ascontiguousarray(self.ids, dtype=np.int32)
        narrow = bool(len(ids)) and int(ids.min()) >= 0 and int(ids.max()) <= np.iinfo(np.uint16).max
        fields["ids"] = (ids.astype(np.uint16) if narrow else ids).tobytes()
        fields["lengths"] = np.ascontiguousarray(self.lengths, dtype=np.int32).tobytes()
        return _page_chunks, (fields, narrow)


def _page_chunks(fields: dict, narrow: bool = False) -> PageChunks:
    """A PageChunks from its pickled fields (PageChunks.__reduce__), its ids int32 again; made without the
    frozen dataclass's __init__ (a setattr a field)."""
    ids = np.frombuffer(fields["ids"], dtype=np.uint16 if narrow else np.int32)
    fields["ids"] = ids.astype(np.int32) if narrow else ids
    fields["lengths"] = np.frombuffer(fields["lengths"], dtype=np.int32)
    page = object.__new__(PageChunks)
    page.__dict__.update(fields)
    return page


@dataclass(frozen=True)
class ChunkSpec:
    tokenizer_file: str
    max_seq_length: int
    chunk_tokens: int
    overlap_tokens: int
    context_tokens: int = 0          # the context line's tokens embedded before each chunk (0: none)
    skip_junk: bool = False          # skip non-language chunks (ingest.junk.is_junk)
    card_context: bool = True        # the document card's label in the context line (ingest/doc_card.py)
    key_secret: bytes = b""          # the run's reuse secret (ingest/reuse.py): each chunk's key made here, in
    #                                  the loader, not in the supervisor; b"": none made

    @property
    def limit(self) -> int:          # room left after [CLS] and [SEP]
        return min(self.chunk_tokens, self.max_seq_length - 2)

    @property
    def context_room(self) -> int:   # the context line's tokens: what the chunk leaves of max_seq_length
        return max(0, min(self.context_tokens, self.max_seq_length - 2 - self.limit))


def page_chunks(page: int | None, text: str, spec: ChunkSpec, title: str | None = None,
                segment: int = 0) -> PageChunks:
    """The page's chunks and their token ids, each chunk at most MAX_CHUNK_BYTES of UTF-8, with no
    context line: the plain langchain split (see the module's NOTE)."""
    return section_chunks(Section(page, segment, text), spec, None, title)


def section_chunks(section: Section, spec: ChunkSpec, doc: Doc | None, title: str | None = None) -> PageChunks:
    """The section's chunks, each embedded under `doc`'s context line for the section's headings (none
    when `doc` is None); a table's chunks are whole rows, each starting with its header rows."""
    tokens = _tokens(spec.tokenizer_file, spec.max_seq_length)
    text = section.text.strip()
    lead = len(section.text) - len(section.text.lstrip())
    context = _context_ids(tokens, doc, section.headings, spec.context_room) if doc and text else None
    header = section.header.strip()
    split_spec = spec
    if header:
        room = spec.limit - tokens.count(header) - tokens.empty
        if room >= spec.limit // 4:
            split_spec = replace(spec, chunk_tokens=room, overlap_tokens=0)
        else:
            header = ""                               # too big to repeat: the table's rows alone
    chunks: list[str] = []
    ids: list[np.ndarray] = []
    boxes: list[str] = []
    cut = junk = 0
    sample = ""
    for chunk, raw, a, b in _pieces(text, tokens, split_spec):
        if chunk is None:
            cut += 1
            continue
        if spec.skip_junk and is_junk(chunk):
            junk += 1
            sample = sample or repr(chunk[:JUNK_SAMPLE_CHARS])
            continue
        if spec.skip_junk and (clean := drop_controls(chunk)) is not chunk:    # artefacts (junk.py NOTE)
            chunk, raw = clean, None
        if header:
            chunk = f"{header}\n{chunk}"
            ids.append(tokens.final(embedded_table(chunk), None, context))
        else:
            ids.append(tokens.final(chunk, raw, context))
        chunks.append(chunk)
        if section.boxes:
            boxes.append(_union(section.boxes, a + lead, b + lead))
    lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
    flat = np.concatenate(ids).astype(np.int32, copy=False) if ids else _EMPTY
    keys = b"".join(chunk_keys(spec.key_secret, flat, lengths)) if spec.key_secret else b""
    return PageChunks(section.page, tuple(chunks), flat, lengths, doc.title if doc else title, cut, section.index,
                      joined_headings(section.headings), section.element, tuple(boxes) if section.boxes else (), junk,
                      sample, keys)


def chunk_keys(secret: bytes, ids: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    """Each chunk's reuse key (ingest/reuse.py): its token ids (`ids`, one chunk's after another; `lengths`)
    hashed under the settings' secret, 16 bytes."""
    data = memoryview(np.ascontiguousarray(ids, dtype=np.int32).tobytes())
    ends = (np.cumsum(lengths, dtype=np.int64) * 4).tolist()
    blake = hashlib.blake2b
    return [blake(data[a:b], digest_size=16, key=secret).digest() for a, b in zip([0, *ends], ends)]


def _pieces(text: str, tokens: _Tokens, spec: ChunkSpec):
    """(chunk, its ids without special tokens or None, start, end) for every chunk of `text`; a chunk over
    MAX_CHUNK_BYTES comes as its pieces cut at character boundaries, after one (None, None, 0, 0) marking the cut."""
    if not text:
        return
    for chunk, raw, a, b in _Splitter(text, tokens, spec).chunks():
        if len(chunk) * 4 <= MAX_CHUNK_BYTES or len(chunk.encode()) <= MAX_CHUNK_BYTES:
            yield chunk, raw, a, b
            continue
        yield None, None, 0, 0
        data = chunk.encode()
        while data:
            piece = data[:MAX_CHUNK_BYTES].decode(errors="ignore")     # drops a split character's tail bytes
            yield piece, None, a, b
            data = data[len(piece.encode()):]


def embedded_table(chunk: str) -> str:
    """What the model sees of a table chunk: its cells without the Markdown pipes and header rule, which
    would be a third of its tokens, all alike (every table would look like every other to the model)."""
    return "\n".join(" ".join(_PIPES.sub(" ", row).split()) for row in _RULE.sub("", chunk).splitlines())


def _context_ids(tokens: _Tokens, doc: Doc, headings: tuple[str, ...], room: int) -> tuple[str, np.ndarray] | None:
    """The context line within `room` tokens, with its ids; None when there is no room. Over budget, the
    title goes first, then the outermost headings: the innermost heading says most about the chunk; a
    line still too long is cut at a token's end."""
    if room <= 0:
        return None
    title, path = doc.title, headings
    while True:
        line = context_line(doc.source, title, path, doc.label, doc.named)
        enc = tokens.plain.encode(line, add_special_tokens=False)
        if len(enc.ids) <= room or (not title and len(path) <= 1):
            break
        title, path = ("", path) if title else ("", path[1:])
    if len(enc.ids) > room:
        line = line[:enc.offsets[room - 1][1]]
    return line, np.asarray(enc.ids[:room], dtype=np.int32)


def _union(boxes: tuple[tuple[int, int, Box], ...], a: int, b: int) -> str:
    """The bounding box of the blocks whose spans meet [a, b), as "x0,y0,x1,y1"."""
    x0, y0, x1, y1 = union_box([box for start, end, box in boxes if start < b and end > a] or [boxes[0][2]])
    return f"{x0:.1f},{y0:.1f},{x1:.1f},{y1:.1f}"


class _Tokens:
    """A spec's two tokenizers: `plain` (no truncation, no special tokens added) counts and slices,
    `exact` is the encode pool's own; and whether the shortcuts of the module's NOTE hold."""

    def __init__(self, tokenizer_file: str, max_length: int):
        from tokenizers import Tokenizer

        from ingest.workers.encode import load_tokenizer

        self.exact = load_tokenizer(tokenizer_file, max_length)[0]
        self.plain = Tokenizer.from_file(tokenizer_file)
        self.plain.no_truncation()
        self.plain.no_padding()
        self._char_counts: dict[str, int] = {}
        self.empty = self.count("")
        specials = template(self.exact, self.plain, max_length)
        self.prefix, self.suffix = specials or (np.zeros(0, np.int32), np.zeros(0, np.int32))
        self.keep = max_length - len(self.prefix) - len(self.suffix)
        self.additive = specials is not None and additive(json.loads(self.plain.to_str()))
        self.words = WordTokens(self.plain) if self.additive else None

    def count(self, text: str) -> int:
        return len(self.plain.encode(text, add_special_tokens=False).ids)

    def char_count(self, char: str) -> int:
        n = self._char_counts.get(char)
        if n is None:
            n = self._char_counts[char] = self.count(char)
        return n

    def _template(self, raw) -> np.ndarray:
        return np.concatenate([self.prefix, np.asarray(raw[:self.keep], dtype=np.int32), self.suffix])

    def final(self, text: str, raw, context: tuple[str, np.ndarray] | None = None) -> np.ndarray:
        """The encode pool's ids of `text` (after the context line and a newline, when given); `raw`,
        when known, the ids of `text` without special tokens."""
        if not self.additive:
            return np.asarray(self.exact.encode(f"{context[0]}\n{text}" if context else text).ids, dtype=np.int32)
        if raw is None:
            raw = self.plain.encode(text, add_special_tokens=False).ids
        return self._template(np.concatenate([context[1], np.asarray(raw, dtype=np.int32)]) if context else raw)


@lru_cache(maxsize=4)
def _tokens(tokenizer_file: str, max_length: int) -> _Tokens:
    return _Tokens(tokenizer_file, max_length)


class _Splitter:
    """One page's text split the langchain way on character spans (see the module's NOTE)."""

    def __init__(self, text: str, tokens: _Tokens, spec: ChunkSpec):
        self.text, self.tokens = text, tokens
        self.size, self.limit = spec.limit, spec.limit
        self.overlap = min(spec.overlap_tokens, spec.limit // 2)
        self._counted: dict[tuple[int, int], int] = {}
        if tokens.words is not None:
            self.ids, self.starts = tokens.words.tokens(text)

    def chunks(self):
        """(chunk, its ids without special tokens or None, start, end) for every chunk of the text, in order."""
        spans: list[tuple[int, int]] = []
        self._split(0, len(self.text), 0, spans)
        for a, b in spans:
            chunk = self.text[a:b]
            if self.tokens.additive and self._clean(a) and self._clean(b):
                lo, hi = np.searchsorted(self.starts, (a, b)).tolist()
                if hi - lo <= self.limit:
                    yield chunk, self.ids[lo:hi], a, b
                    continue
            enc = self.tokens.plain.encode(chunk, add_special_tokens=False)
            if len(enc.ids) <= self.limit:
                yield chunk, enc.ids, a, b
                continue
            for start in range(0, len(enc.ids), self.limit):   # hard split on token offsets
                offs = enc.offsets[start:start + self.limit]
                piece = chunk[offs[0][0]:offs[-1][1]].strip()
                if piece:
                    yield piece, None, a + offs[0][0], a + offs[-1][1]

    def _clean(self, i: int) -> bool:
        """Whether no word crosses position i (whitespace on one side, or the page's edge)."""
        text = self.text
        return i == 0 or i == len(text) or text[i - 1] in WHITESPACE or text[i] in WHITESPACE

    def _counts(self, points: list[int]) -> list[int]:
        """Tokens of each span between consecutive points (at separators: whitespace)."""
        if self.tokens.additive:
            return np.diff(np.searchsorted(self.starts, points)).tolist()
        counted, text = self._counted, self.text
        out = []
        for a, b in zip(points, points[1:]):
            n = counted.get((a, b))
            if n is None:
                n = counted[(a, b)] = self.tokens.count(text[a:b])
            out.append(n)
        return out

    def _split(self, a: int, b: int, level: int, out: list[tuple[int, int]]) -> None:
        """langchain's _split_text of text[a:b] with SEPARATORS[level:]: chunk spans onto `out`."""
        text = self.text
        while SEPARATORS[level] and text.find(SEPARATORS[level], a, b) < 0:
            level += 1
        if SEPARATORS[level]:
            points = [a, *(m.start() for m in _PATTERNS[level].finditer(text, a, b)), b]
            if points[1] == a:                        # the text starts with the separator: no empty piece
                del points[0]
            counts = self._counts(points)
        else:
            points = list(range(a, b + 1))
            counts = [self.tokens.char_count(c) for c in text[a:b]]
        good = -1                                     # first of the run of pieces under the size
        for j, n in enumerate(counts):
            if n < self.size:
                if good < 0:
                    good = j
                continue
            if good >= 0:
                self._merge(points[good:j + 1], counts[good:j], out)
                good = -1
            if SEPARATORS[level]:
                self._split(points[j], points[j + 1], level + 1, out)
            else:
                self._emit(points[j], points[j + 1], out)
        if good >= 0:
            self._merge(points[good:], counts[good:], out)

    def _merge(self, points: list[int], counts: list[int], out: list[tuple[int, int]]) -> None:
        """langchain's _merge_splits of the consecutive pieces between `points` (separator ""):
        the current chunk is pieces i..j-1, `total` their tokens."""
        size, overlap, sep = self.size, self.overlap, self.tokens.empty
        i, total = 0, 0
        for j, n in enumerate(counts):
            if total + n + (sep if j > i else 0) > size and j > i:
                self._emit(points[i], points[j], out)
                while total > overlap or (total + n + (sep if j > i else 0) > size and total > 0):
                    total -= counts[i] + (sep if j - i > 1 else 0)
                    i += 1
            total += n + (sep if j > i else 0)
        self._emit(points[i], points[-1], out)

    def _emit(self, a: int, b: int, out: list[tuple[int, int]]) -> None:
        """The span of text[a:b].strip(), unless that is empty (langchain's _join_docs)."""
        chunk = self.text[a:b]
        lead = len(chunk) - len(chunk.lstrip())
        size = len(chunk.strip())
        if size:
            out.append((a + lead, a + lead + size))
