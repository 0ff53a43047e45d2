"""CRC-32 (zlib's) of a concatenation from the CRCs of its parts, without reading the
bytes again: ``crc(a + b) = advance(crc(a), len(b)) ^ crc(b)``, where ``advance`` is a
linear map over GF(2) (zlib's crc32_combine, which Python's zlib does not expose).

So a chunked transfer checksums every byte once: each chunk's CRC is checked against its
data, and the whole payload's CRC follows from them (equal to one more pass, for free).
"""

from __future__ import annotations

from functools import lru_cache

_POLY = 0xEDB88320  # reflected CRC-32 polynomial
_IDENTITY = tuple(1 << n for n in range(32))


def _apply(op: tuple[int, ...], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= op[i]
        vec >>= 1
        i += 1
    return out


def _compose(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The map ``a after b`` (each a tuple of 32 columns)."""
    return tuple(_apply(a, col) for col in b)


@lru_cache(maxsize=256)
def _advance_op(nbytes: int) -> tuple[int, ...]:
    """The map that appends ``nbytes`` zero bytes to a CRC (lengths repeat: cached)."""
    one_bit = (_POLY, *(1 << (n - 1) for n in range(1, 32)))
    power = _compose(one_bit, one_bit)  # 2 zero bits
    power = _compose(power, power)  # 4
    power = _compose(power, power)  # 8 = one byte
    op = _IDENTITY
    while nbytes:
        if nbytes & 1:
            op = _compose(power, op)
        nbytes >>= 1
        if nbytes:
            power = _compose(power, power)
    return op


def crc32_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """zlib.crc32(a + b) from zlib.crc32(a), zlib.crc32(b) and len(b)."""
    return _apply(_advance_op(len_b), crc_a) ^ crc_b if len_b else crc_a


def crc32_tail(crc_ab: int, crc_a: int, len_b: int) -> int:
    """zlib.crc32(b) from zlib.crc32(a + b), zlib.crc32(a) and len(b) (the map is linear)."""
    return crc_ab ^ _apply(_advance_op(len_b), crc_a) if len_b else 0
