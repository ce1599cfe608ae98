"""Damage a stopped store on disk, as a failing disk would, for the integrity tests."""
from __future__ import annotations

import os


def flip_body_byte(store_root, body: bytes) -> None:
    """Flip the first byte of every copy of ``body`` in the store's data file (LMDB's copy-on-write may have left
    older page versions of it there too). The store must be closed."""
    path = os.path.join(store_root, "lmdb", "data.mdb")
    with open(path, "r+b") as f:
        data = f.read()
        at = data.find(body)
        assert at >= 0, f"{body!r} is not in {path}"
        while at >= 0:
            f.seek(at)
            f.write(bytes([data[at] ^ 0xFF]))
            at = data.find(body, at + 1)
