"""JSON files users write (profiles, demands, jobs) read with every key once: json keeps the last
of a key given twice without a word (a link with two bandwidth_GBps, a job with two sizes)."""

from __future__ import annotations


class DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(f"key {key!r} appears twice in one object (JSON keeps only the last; give it once)")


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json's object_pairs_hook: the object as a dict, or DuplicateKey."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out
