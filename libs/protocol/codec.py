"""msgpack encoding of protocol Structs, with cached typed decoders."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


@lru_cache(maxsize=None)
def _decoder(kind: Any) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(kind)


def decode(data: bytes, kind: type[T]) -> T:
    """Decode ``data`` as ``kind``; raises msgspec.ValidationError/DecodeError."""
    return _decoder(kind).decode(data)
