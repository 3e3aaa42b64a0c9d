"""Pure-Python reference of `stratad.native` (the contract is docs/native.md).

Every function here mirrors one of the native core and is written for
clarity, not speed: the property tests in this directory hold the Rust
implementation to the same answers. Where the Rust side uses a crate (BLAKE3,
FastCDC, zstd), this module uses the matching PyPI package or, for FastCDC, a
line-by-line port of the crate's `v2020` module.

Chunk sizes have no defaults here on purpose: the defaults belong to the
native module, so callers pass `native.DEFAULT_*` explicitly.
"""

from __future__ import annotations

import hashlib
import math
import re
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import blake3
import zstandard

from stratad.errors import CorruptObjectError, DecompressionLimitError, InvalidArgumentError

# --------------------------------------------------------------------------
# Digests
# --------------------------------------------------------------------------


def digest(data: bytes) -> bytes:
    """32-byte BLAKE3 digest."""
    return blake3.blake3(data).digest()


def digest_hex(data: bytes) -> str:
    """Lowercase hex BLAKE3 digest (64 characters)."""
    return blake3.blake3(data).hexdigest()


# --------------------------------------------------------------------------
# FastCDC 2020: a port of fastcdc 5.0.0 `src/v2020/mod.rs` (normalization 1)
# --------------------------------------------------------------------------

MINIMUM_MIN = 64
MINIMUM_MAX = 1_048_576
AVERAGE_MIN = 256
AVERAGE_MAX = 4_194_304
MAXIMUM_MIN = 1024
MAXIMUM_MAX = 16_777_216
NORMALIZATION_LEVEL = 1

_U64 = (1 << 64) - 1

# `MASKS` of the crate, indexed by the rounded log2 of the average size.
MASKS: tuple[int, ...] = (
    0,
    0,
    0,
    0,
    0,
    0x0000000001804110,
    0x0000000001803110,  # 64B
    0x0000000018035100,  # 128B
    0x0000001800035300,  # 256B
    0x0000019000353000,  # 512B
    0x0000590003530000,  # 1KB
    0x0000D90003530000,  # 2KB
    0x0000D90103530000,  # 4KB
    0x0000D90303530000,  # 8KB
    0x0000D90313530000,  # 16KB
    0x0000D90F03530000,  # 32KB
    0x0000D90303537000,  # 64KB
    0x0000D90703537000,  # 128KB
    0x0000D90707537000,  # 256KB
    0x0000D91707537000,  # 512KB
    0x0000D91747537000,  # 1MB
    0x0000D91767537000,  # 2MB
    0x0000D93767537000,  # 4MB
    0x0000D93777537000,  # 8MB
    0x0000D93777577000,  # 16MB
    0x0000DB3777577000,
)

# The crate's GEAR table is, by its own `examples/table64.rs`, the first 8
# bytes (big-endian) of MD5 over 64 copies of each byte value; GEAR_LS is the
# same table shifted left by one bit. Generating them keeps 512 magic numbers
# out of this file; test_chunking.py checks them against the crate.
GEAR: tuple[int, ...] = tuple(
    int.from_bytes(hashlib.md5(bytes([i]) * 64).digest()[:8], "big") for i in range(256)
)
GEAR_LS: tuple[int, ...] = tuple((g << 1) & _U64 for g in GEAR)


def _logarithm2(value: int) -> int:
    # Rust `(value as f64).log2().round()`: rounds half away from zero.
    return math.floor(math.log2(value) + 0.5)


def select_masks(avg_size: int) -> tuple[int, int]:
    """(mask_s, mask_l) for normalization level 1, as the crate's `select_masks`."""
    bits = _logarithm2(avg_size)
    return MASKS[bits + NORMALIZATION_LEVEL], MASKS[bits - NORMALIZATION_LEVEL]


def check_chunk_sizes(min_size: int, avg_size: int, max_size: int) -> None:
    """Raise InvalidArgumentError unless the sizes are within the crate's limits."""
    limits = (
        ("min_size", min_size, MINIMUM_MIN, MINIMUM_MAX),
        ("avg_size", avg_size, AVERAGE_MIN, AVERAGE_MAX),
        ("max_size", max_size, MAXIMUM_MIN, MAXIMUM_MAX),
    )
    for name, value, low, high in limits:
        if not low <= value <= high:
            raise InvalidArgumentError(f"{name} {value} outside {low}..={high}")
        # The crate scans two bytes per step and debug-asserts even sizes.
        if value % 2:
            raise InvalidArgumentError(f"{name} {value} must be even")
    if not min_size <= avg_size <= max_size:
        raise InvalidArgumentError("need min_size <= avg_size <= max_size")


@dataclass(frozen=True)
class _Cutter:
    """The per-call constants of the crate's `FastCDC` struct."""

    min_size: int
    avg_size: int
    max_size: int
    mask_s: int
    mask_l: int

    @classmethod
    def new(cls, min_size: int, avg_size: int, max_size: int) -> _Cutter:
        mask_s, mask_l = select_masks(avg_size)
        return cls(min_size, avg_size, max_size, mask_s, mask_l)

    def cut(self, data: bytes, start: int, remaining: int) -> tuple[int, int]:
        """`cut_gear_arr` over data[start:start+remaining]: (hash, chunk length)."""
        if remaining <= self.min_size:
            return 0, remaining
        center = self.avg_size
        if remaining > self.max_size:
            remaining = self.max_size
        elif remaining < center:
            center = remaining
        h = 0
        index = self.min_size // 2
        # Strict mask below the average size, loose mask above it.
        for limit, mask in ((center // 2, self.mask_s), (remaining // 2, self.mask_l)):
            mask_ls = mask << 1
            while index < limit:
                a = start + index * 2
                h = ((h << 2) + GEAR_LS[data[a]]) & _U64
                if not h & mask_ls:
                    return h, index * 2
                h = (h + GEAR[data[a + 1]]) & _U64
                if not h & mask:
                    return h, index * 2 + 1
                index += 1
        if remaining % 2 == 1:
            h = ((h << 1) + GEAR[data[start + remaining - 1]]) & _U64
        return h, remaining


def chunk_hashes(
    data: bytes, min_size: int, avg_size: int, max_size: int
) -> list[tuple[int, int, int]]:
    """(offset, length, gear hash) of every chunk, as the crate's iterator yields them."""
    check_chunk_sizes(min_size, avg_size, max_size)
    cutter = _Cutter.new(min_size, avg_size, max_size)
    out: list[tuple[int, int, int]] = []
    offset = 0
    while offset < len(data):
        h, length = cutter.cut(data, offset, len(data) - offset)
        out.append((offset, length, h))
        offset += length
    return out


def chunk_boundaries(
    data: bytes, min_size: int, avg_size: int, max_size: int
) -> list[tuple[int, int]]:
    """FastCDC 2020 cut points as (offset, length); [] for empty input."""
    return [(off, length) for off, length, _ in chunk_hashes(data, min_size, avg_size, max_size)]


# --------------------------------------------------------------------------
# zstd
# --------------------------------------------------------------------------

# libzstd's ZSTD_minCLevel() and ZSTD_maxCLevel().
ZSTD_MIN_LEVEL = -(1 << 17)
ZSTD_MAX_LEVEL = 22

# How much compressed input the reference feeds zstd at a time while
# watching the output size (bounds memory on a decompression bomb).
_FEED = 4096


def check_level(level: int) -> None:
    if not ZSTD_MIN_LEVEL <= level <= ZSTD_MAX_LEVEL:
        raise InvalidArgumentError(
            f"zstd level {level} outside {ZSTD_MIN_LEVEL}..={ZSTD_MAX_LEVEL}"
        )


def compress(data: bytes, level: int = 3) -> bytes:
    """One zstd frame with its content size recorded."""
    check_level(level)
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(data)


def decompress(data: bytes, max_size: int) -> bytes:
    """Decompress one zstd frame, refusing to produce more than max_size bytes."""
    if max_size < 0:
        raise InvalidArgumentError("max_size must be >= 0")
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise CorruptObjectError(f"not a zstd frame: {exc}") from exc
    if declared > max_size:  # -1 when the frame does not record its size
        raise DecompressionLimitError(f"frame declares {declared} bytes > {max_size}")
    dobj = zstandard.ZstdDecompressor().decompressobj()
    out = bytearray()
    try:
        for pos in range(0, len(data), _FEED):
            out += dobj.decompress(data[pos : pos + _FEED])
            if len(out) > max_size:
                raise DecompressionLimitError(f"output exceeds {max_size} bytes")
    except zstandard.ZstdError as exc:  # includes data after the end of the frame
        raise CorruptObjectError(f"bad zstd frame: {exc}") from exc
    if not dobj.eof or dobj.unused_data:
        raise CorruptObjectError("truncated zstd frame or trailing data")
    return bytes(out)


# --------------------------------------------------------------------------
# Object frame
# --------------------------------------------------------------------------

MAGIC = b"STRD"
FORMAT_VERSION = 1
FRAME_HEADER_SIZE = 52
CODEC_RAW = 0
CODEC_ZSTD = 1
_HEADER_CHECKED = 48  # the header check covers bytes 0..48


def frame_header(codec: int, data: bytes) -> bytes:
    """The 52-byte header of a frame holding data with the given codec."""
    head = (
        MAGIC
        + bytes([FORMAT_VERSION, codec])
        + (0).to_bytes(2, "little")
        + len(data).to_bytes(8, "little")
        + digest(data)
    )
    return head + digest(head)[:4]


def encode_frame(data: bytes, level: int = 3) -> bytes:
    """Frame data: zstd when that makes it smaller, raw otherwise."""
    packed = compress(data, level)
    if len(packed) < len(data):
        return frame_header(CODEC_ZSTD, data) + packed
    return frame_header(CODEC_RAW, data) + data


@dataclass(frozen=True)
class FrameHeader:
    codec: int
    length: int
    digest: bytes


def parse_header(frame: bytes) -> FrameHeader:
    """Check and decode a frame's header; CorruptObjectError on any mismatch."""
    if len(frame) < FRAME_HEADER_SIZE:
        raise CorruptObjectError("frame shorter than its header")
    if frame[:4] != MAGIC:
        raise CorruptObjectError("bad magic")
    if frame[4] != FORMAT_VERSION:
        raise CorruptObjectError(f"unknown format version {frame[4]}")
    if frame[5] not in (CODEC_RAW, CODEC_ZSTD):
        raise CorruptObjectError(f"unknown codec {frame[5]}")
    if frame[6:8] != b"\0\0":
        raise CorruptObjectError("unknown flags")
    if digest(frame[:_HEADER_CHECKED])[:4] != frame[_HEADER_CHECKED:FRAME_HEADER_SIZE]:
        raise CorruptObjectError("header check mismatch")
    length = int.from_bytes(frame[8:16], "little")
    return FrameHeader(frame[5], length, frame[16:48])


def decode_frame(frame: bytes, max_size: int) -> bytes:
    """The bytes framed, verified against the header's length and digest."""
    if max_size < 0:
        raise InvalidArgumentError("max_size must be >= 0")
    header = parse_header(frame)
    if header.length > max_size:
        raise DecompressionLimitError(f"frame holds {header.length} bytes > {max_size}")
    payload = frame[FRAME_HEADER_SIZE:]
    if header.codec == CODEC_RAW:
        data = payload
    else:
        try:
            data = decompress(payload, header.length)
        except DecompressionLimitError as exc:
            # The header was checked: a payload longer than it is corruption.
            raise CorruptObjectError("payload longer than the header says") from exc
    if len(data) != header.length:
        raise CorruptObjectError("payload length does not match the header")
    if digest(data) != header.digest:
        raise CorruptObjectError("digest mismatch")
    return bytes(data)


def verify_frame(frame: bytes, max_size: int) -> str:
    """As decode_frame, but return only the digest hex."""
    return digest_hex(decode_frame(frame, max_size))


def frame_digest_hex(frame: bytes) -> str:
    """The digest recorded in the (checked) header; the payload is not read."""
    return parse_header(frame).digest.hex()


# --------------------------------------------------------------------------
# Tokens and the crystal index
# --------------------------------------------------------------------------

# Only A-Z: str.lower() would also map non-ASCII letters (the Kelvin sign to
# "k", "İ" to "i" plus a combining dot) and so invent ASCII tokens.
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_TOKEN = re.compile(r"\{[a-z0-9_]+\}|[a-z0-9_]+")


def tokenize(text: str) -> list[str]:
    """Keyword tokens, unique, in order of first appearance."""
    return list(dict.fromkeys(_TOKEN.findall(text.translate(_ASCII_LOWER))))


def _jaccard_sets(a: set[str] | frozenset[str], b: set[str] | frozenset[str]) -> float:
    inter = len(a & b)
    union = len(a) + len(b) - inter
    return inter / union if union else 0.0


class CrystalIndex:
    """Brute-force reference of the native crystal index (docs/native.md).

    Slots are allocated as the native index does: the most recently freed
    one, else the next new one.
    """

    def __init__(self) -> None:
        # slot -> (order, goal set, tool set, effectiveness, reuse_count)
        self._entries: dict[int, tuple[int, frozenset[str], frozenset[str], float, int]] = {}
        self._free: list[int] = []
        self._next = 0

    @staticmethod
    def _check(effectiveness: float) -> float:
        if not 0.0 <= effectiveness <= 1.0:
            raise InvalidArgumentError("effectiveness must be in [0, 1]")
        return effectiveness + 0.0

    def add(
        self,
        order: int,
        goal_tokens: Iterable[str],
        tools: Iterable[str],
        effectiveness: float,
        reuse_count: int,
    ) -> int:
        effectiveness = self._check(effectiveness)
        if self._free:
            slot = self._free.pop()
        else:
            slot, self._next = self._next, self._next + 1
        entry = (order, frozenset(goal_tokens), frozenset(tools), effectiveness, reuse_count)
        self._entries[slot] = entry
        return slot

    def update(self, slot: object, effectiveness: float, reuse_count: int) -> bool:
        effectiveness = self._check(effectiveness)
        if not isinstance(slot, int) or slot not in self._entries:
            return False
        order, goal, tools, _, _ = self._entries[slot]
        self._entries[slot] = (order, goal, tools, effectiveness, reuse_count)
        return True

    def remove(self, slot: object) -> bool:
        if not isinstance(slot, int) or slot not in self._entries:
            return False
        del self._entries[slot]
        self._free.append(slot)
        return True

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, slot: object) -> bool:
        return slot in self._entries

    def top_k(self, query_tokens: Iterable[str], k: int) -> list[tuple[int, float, float]]:
        """score = similarity * (0.5 + 0.5 * effectiveness); score desc, order, slot."""
        if k < 0:
            raise InvalidArgumentError("k must be >= 0")
        q = set(query_tokens)
        hits = []
        for slot, (order, goal, _, eff, _) in self._entries.items():
            similarity = _jaccard_sets(q, goal)
            if similarity > 0:
                hits.append((-(similarity * (0.5 + 0.5 * eff)), order, slot, similarity))
        hits.sort()
        return [(slot, -neg, sim) for neg, _, slot, sim in hits[:k]]

    def find_similar(
        self,
        goal_tokens: Iterable[str],
        tools: Iterable[str],
        goal_threshold: float,
        tool_threshold: float,
    ) -> tuple[int, float, float] | None:
        """Goal and tool Jaccard both strictly above their thresholds; the most similar."""
        for threshold in (goal_threshold, tool_threshold):
            if not 0.0 <= threshold <= 1.0:
                raise InvalidArgumentError("thresholds must be in [0, 1]")
        g, t = set(goal_tokens), set(tools)
        found = []
        for slot, (order, goal, tool_set, _, _) in self._entries.items():
            gs, ts = _jaccard_sets(g, goal), _jaccard_sets(t, tool_set)
            if gs > goal_threshold and ts > tool_threshold:
                found.append((-gs, -ts, order, slot))
        if not found:
            return None
        neg_g, neg_t, _, slot = min(found)
        return slot, -neg_g, -neg_t

    def least_effective(self, exclude: int | None = None) -> int | None:
        """Least effective, then fewest reuses, then lowest order, then lowest slot."""
        keys = [
            (eff, reuses, order, slot)
            for slot, (order, _, _, eff, reuses) in self._entries.items()
            if slot != exclude
        ]
        return min(keys)[3] if keys else None

    def stats(self, effective_threshold: float) -> tuple[int, int, int, float]:
        entries = [self._entries[slot] for slot in sorted(self._entries)]
        total = 0.0
        for entry in entries:
            total += entry[3]
        return (
            len(entries),
            sum(1 for e in entries if e[3] >= effective_threshold),
            sum(e[4] for e in entries),
            total,
        )


# --------------------------------------------------------------------------
# Goal generalization and entity types
# --------------------------------------------------------------------------

_EXTENSION_TYPES: dict[str, tuple[str, ...]] = {
    "python_file": ("py", "pyi", "ipynb"),
    "javascript_file": ("js", "jsx", "mjs", "cjs"),
    "typescript_file": ("ts", "tsx"),
    "config_file": ("json", "yaml", "yml", "toml", "ini", "cfg", "conf", "env"),
    "document_file": ("md", "rst", "txt", "pdf"),
    "data_file": ("csv", "tsv", "parquet", "xlsx", "db", "sqlite"),
    "shell_script": ("sh", "bash"),
    "sql_file": ("sql",),
    "source_file": (
        *("go", "rs", "java", "kt", "c", "h", "cc", "cpp", "hpp", "cs", "rb", "php", "swift"),
    ),
}
TYPE_BY_EXTENSION: dict[str, str] = {
    ext: kind for kind, exts in _EXTENSION_TYPES.items() for ext in exts
}
# The known list of docs/native.md: the typed extensions plus these.
KNOWN_EXTENSIONS: frozenset[str] = frozenset(TYPE_BY_EXTENSION) | {
    *("html", "css", "xml", "log", "lock", "png", "jpg", "jpeg", "gif", "svg"),
    *("zip", "tar", "gz"),
}

# Unicode White_Space, exactly what Rust's char::is_whitespace accepts.
# (Python's str.isspace() also counts U+001C..U+001F, so `\s` is not used.)
WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"  # noqa: E501
_NON_WS_RUN = re.compile("[^" + re.escape(WHITESPACE) + "]+")
_WORD = frozenset(string.ascii_letters + string.digits + "_")
_LETTER_OR_UNDERSCORE = frozenset(string.ascii_letters + "_")
_LEADING_PUNCT = frozenset("\"'([{<`")
_TRAILING_PUNCT = frozenset(".,;:!?)]}>'\"`")

PLACEHOLDER = re.compile(r"\{[A-Za-z0-9_]+\}")
_QUOTED = re.compile(r'"[^"]+"')
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^" + re.escape(WHITESPACE) + "]*")
_NUMBER = re.compile(r"[0-9]+(?:[.,][0-9]+)*")
_VERSION_SEGMENT = re.compile(r"v[0-9]+")
_API_ROOTS = frozenset({"api", "rest", "graphql", "rpc"})
_BARE_FILE = re.compile(r"[A-Za-z0-9_.\-]+")
_PATH_SEPARATORS = re.compile(r"[/\\]")


@dataclass(frozen=True)
class Placeholder:
    """A placeholder in the text; entity is None for those already in the input."""

    text: str
    entity: str | None = None


Part = str | Placeholder
Span = tuple[int, int, Placeholder]


def _split_spans(text: str, spans: Iterable[Span]) -> list[Part]:
    """Replace non-overlapping, ordered (start, end) spans of text by placeholders."""
    parts: list[Part] = []
    pos = 0
    for start, end, placeholder in spans:
        if start > pos:
            parts.append(text[pos:start])
        parts.append(placeholder)
        pos = end
    if pos < len(text):
        parts.append(text[pos:])
    return parts


def _strip_trailing(text: str, start: int, end: int) -> int:
    while end > start and text[end - 1] in _TRAILING_PUNCT:
        end -= 1
    return end


def _quoted_spans(text: str) -> list[Span]:
    # Rule 1 keeps the quotes and replaces what is between them.
    value = Placeholder("{value}", "quoted_value")
    return [(m.start() + 1, m.end() - 1, value) for m in _QUOTED.finditer(text)]


def _url_spans(text: str) -> list[Span]:
    spans = []
    for m in _URL.finditer(text):
        end = _strip_trailing(text, m.start(), m.end())
        if end > text.index("://", m.start()) + 3:
            spans.append((m.start(), end, Placeholder("{url}", "url")))
    return spans


def _is_endpoint(candidate: str) -> bool:
    path = re.split(r"[?#]", candidate, maxsplit=1)[0]
    segments = path[1:].split("/")
    first, last = segments[0], segments[-1]
    root_ok = first in _API_ROOTS or _VERSION_SEGMENT.fullmatch(first) is not None
    return root_ok and "." not in last


def _endpoint_spans(text: str) -> list[Span]:
    spans = []
    pos = 0
    while (slash := text.find("/", pos)) >= 0:
        pos = slash + 1
        if slash > 0 and (text[slash - 1] in _WORD or text[slash - 1] in "/."):
            continue
        token_end = _NON_WS_RUN.match(text, slash)
        assert token_end is not None  # "/" itself is not whitespace
        end = _strip_trailing(text, slash, token_end.end())
        if _is_endpoint(text[slash:end]):
            spans.append((slash, end, Placeholder("{api_endpoint}", "api_endpoint")))
            pos = end
    return spans


def _file_type(path: str) -> str:
    last = _PATH_SEPARATORS.split(path)[-1]
    ext = last.rsplit(".", 1)[1].lower() if "." in last else ""
    return TYPE_BY_EXTENSION.get(ext, "file")


def _is_file_path(token: str) -> bool:
    if "/" in token or "\\" in token:
        return any(ch not in "/\\" for ch in token)
    if _BARE_FILE.fullmatch(token) is None or "." not in token:
        return False
    name, ext = token.rsplit(".", 1)
    return bool(name) and ext.lower() in KNOWN_EXTENSIONS


def _file_spans(text: str) -> list[Span]:
    spans = []
    for m in _NON_WS_RUN.finditer(text):
        start, end = m.start(), m.end()
        while start < end and text[start] in _LEADING_PUNCT:
            start += 1
        end = _strip_trailing(text, start, end)
        token = text[start:end]
        if token and _is_file_path(token):
            spans.append((start, end, Placeholder("{file_path}", _file_type(token))))
    return spans


def _number_spans(text: str) -> list[Span]:
    spans = []
    for m in _NUMBER.finditer(text):
        before = text[m.start() - 1] if m.start() > 0 else ""
        after = text[m.end()] if m.end() < len(text) else ""
        if before not in _LETTER_OR_UNDERSCORE and after not in _LETTER_OR_UNDERSCORE:
            spans.append((m.start(), m.end(), Placeholder("{N}", "number")))
    return spans


Rule = Callable[[str], list[Span]]

_RULES: tuple[Rule, ...] = (_quoted_spans, _url_spans, _endpoint_spans, _file_spans, _number_spans)


def _apply_rule(parts: list[Part], rule: Rule) -> list[Part]:
    """Apply one rule to every stretch of free text, leaving placeholders alone."""
    out: list[Part] = []
    for part in parts:
        new = [part] if isinstance(part, Placeholder) else _split_spans(part, rule(part))
        for piece in new:
            # Keep free text maximal, so a stretch is all text between placeholders.
            if isinstance(piece, str) and out and isinstance(out[-1], str):
                out[-1] += piece
            else:
                out.append(piece)
    return out


def generalize_parts(goal: str) -> list[Part]:
    """The goal as free text and placeholders after all five rules."""
    existing = ((m.start(), m.end(), Placeholder(m[0])) for m in PLACEHOLDER.finditer(goal))
    parts = _split_spans(goal, existing)
    for rule in _RULES:
        parts = _apply_rule(parts, rule)
    return parts


def generalize_goal(goal: str) -> str:
    """Replace specific values by placeholders (docs/native.md, "Goal generalization")."""
    return "".join(p.text if isinstance(p, Placeholder) else p for p in generalize_parts(goal))


def detect_entity_types(text: str) -> list[str]:
    """Entity types of the placeholders generalize_goal inserts, unique, in order."""
    kinds = (p.entity for p in generalize_parts(text) if isinstance(p, Placeholder))
    return list(dict.fromkeys(k for k in kinds if k is not None))
