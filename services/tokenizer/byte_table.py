"""Token id -> bytes for byte-level BPE tokenizers, so detokenization needs no decode call.

With a GPT-2-style ``ByteLevel`` decoder alone, the text of any ids is the lossy UTF-8
decoding of their tokens' bytes joined: each token's bytes are fixed, whatever surrounds
it. The table is checked against the tokenizer's own decode of every id at load; a
decoder of another kind (SentencePiece's leading space needs context) gets None and the
detokenizer decodes windows instead.
"""

from __future__ import annotations

import json
from typing import Any

from libs.grammar.token_texts import piece_bytes


def byte_table(backend: Any) -> dict[int, bytes] | None:
    """id -> bytes of every id the tokenizer knows, or None where that is not exact."""
    if backend is None or backend.decoder is None:
        return None
    if json.loads(backend.decoder.__getstate__()).get("type") != "ByteLevel":
        return None
    raw = piece_bytes(backend.decoder)
    ids = range(backend.get_vocab_size(with_added_tokens=True))
    table: dict[int, bytes] = {}
    for i in ids:
        piece = backend.id_to_token(i)
        data = raw(piece) if piece is not None else None
        if data is None:
            data = piece.encode() if piece is not None else b""
        table[i] = data
    texts = backend.decode_batch([[i] for i in ids], skip_special_tokens=False)
    if any(table[i].decode("utf-8", "replace") != t for i, t in zip(ids, texts)):
        return None  # NOTE: a piece whose decode is not its bytes: windows stay exact
    return table
