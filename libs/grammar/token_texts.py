"""The text of every token id as it appears inside a generation (for regex masks)."""

from __future__ import annotations

import json
import re

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_decoder() -> dict[int, str]:
    """str.translate table undoing GPT-2's bytes -> printable unicode map."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable}
    table.update({256 + i: chr(b) for i, b in enumerate(shifted)})
    return table


def piece_bytes(decoder):
    """A function: vocabulary piece -> its bytes inside a generation (None: a piece of a
    byte-level vocabulary outside its byte alphabet). ``decoder``: the tokenizers decoder."""
    spec = json.loads(decoder.__getstate__()) if decoder is not None else {"type": None}
    steps = spec["decoders"] if spec["type"] == "Sequence" else [spec]
    byte_level = byte_fallback = False
    replaces: list[tuple[str, str]] = []
    for st in steps:
        kind = st["type"]
        if kind == "ByteLevel":
            byte_level = True
        elif kind == "ByteFallback":
            byte_fallback = True
        elif kind == "Replace" and "String" in st["pattern"]:
            replaces.append((st["pattern"]["String"], st["content"]))
        elif kind == "Metaspace":
            replaces.append((st.get("replacement", "\u2581"), " "))
        elif kind not in ("Fuse", "Strip"):  # NOTE: Strip only trims the start of a whole decode
            raise ValueError(f"token_texts: unsupported tokenizer decoder {kind!r}")
    to_bytes = _byte_level_decoder()

    def raw(piece: str) -> bytes | None:
        if byte_fallback and (m := _BYTE_PIECE.fullmatch(piece)):
            return bytes([int(m.group(1), 16)])
        for old, new in replaces:
            piece = piece.replace(old, new)
        if not byte_level:
            return piece.encode()
        try:
            return piece.translate(to_bytes).encode("latin-1")
        except UnicodeError:
            return None

    return raw


def _piece_decoder(decoder):
    """A function: vocabulary piece -> its text inside a generation (None: not whole UTF-8 chars)."""
    raw = piece_bytes(decoder)

    def decode(piece: str) -> str | None:
        data = raw(piece)
        try:
            return (data.decode("utf-8") or None) if data is not None else None
        except UnicodeDecodeError:  # NOTE: a lone byte >= 0x80 is never a whole char
            return None

    return decode


def token_texts(tokenizer, vocab_size: int) -> list[str | None]:
    """Text of every id 0..vocab_size-1 as it appears inside a generation (leading spaces kept).

    None for special/added tokens, ids >= len(tokenizer), empty texts and pieces that are not whole
    UTF-8 chars. Needs an HF fast tokenizer (ByteLevel, SentencePiece-style Replace/ByteFallback or
    Metaspace decoders); raises ValueError otherwise.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("token_texts needs a fast (tokenizers-backed) tokenizer")
    decode = _piece_decoder(backend.decoder)
    skip = set(tokenizer.added_tokens_decoder) | set(tokenizer.all_special_ids)
    n = min(vocab_size, len(tokenizer))
    texts: list[str | None] = [None] * vocab_size
    for i in range(n):
        if i not in skip and (piece := backend.id_to_token(i)) is not None:
            texts[i] = decode(piece)
    return texts
