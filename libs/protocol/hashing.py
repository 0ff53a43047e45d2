"""Chained block hashes of token pages: the one function everyone who hashes uses.

Page i's hash covers page i's tokens and page i-1's hash; the first page's
parent is the hash of the namespace (cache salt / tenant), so identical tokens
in two namespaces never share a hash. The tokenizer (for routing), the
scheduler (for KV events) and the cache index all agree through this module.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

_MASK = (1 << 63) - 1


def _h(parent: int, payload: bytes) -> int:
    digest = hashlib.blake2b(payload, digest_size=8, key=parent.to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little") & _MASK


def namespace_hash(namespace: str) -> int:
    return _h(0, b"ns:" + namespace.encode())


def block_hashes(tokens: Sequence[int] | np.ndarray, page_size: int, namespace: str = "",
                 parent: int | None = None) -> list[int]:
    """Hashes of every full page of ``tokens`` (a trailing partial page is ignored).

    ``parent`` continues a chain (the hash of the page before ``tokens[0]``);
    by default the chain starts at the namespace.
    """
    if page_size < 1:
        raise ValueError("page_size must be >= 1")
    data = np.asarray(tokens, dtype=np.int64).astype("<i4", copy=False).tobytes()
    prev = namespace_hash(namespace) if parent is None else parent
    out = []
    step = 4 * page_size
    for start in range(0, len(data) - step + 1, step):
        prev = _h(prev, data[start : start + step])
        out.append(prev)
    return out
