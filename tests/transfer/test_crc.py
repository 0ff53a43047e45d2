"""CRC-32 of a concatenation from its parts' CRCs equals zlib's over the bytes."""

from __future__ import annotations

import random
import zlib

import pytest

from libs.transfer.crc import crc32_combine, crc32_tail


@pytest.mark.parametrize("len_a,len_b", [(0, 0), (1, 1), (5, 0), (0, 7), (100, 1000), (28, 12345),
                                         (1 << 20, (1 << 20) - 4096)])
def test_combine_and_tail_match_zlib(len_a, len_b):
    rng = random.Random(len_a * 31 + len_b)
    a, b = rng.randbytes(len_a), rng.randbytes(len_b)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len_b) == zlib.crc32(a + b)
    assert crc32_tail(zlib.crc32(a + b), zlib.crc32(a), len_b) == zlib.crc32(b)


def test_a_fold_over_many_parts_is_the_whole_crc():
    rng = random.Random(0)
    parts = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(40)]
    crc = 0
    for p in parts:
        crc = crc32_combine(crc, zlib.crc32(p), len(p))
    assert crc == zlib.crc32(b"".join(parts))
