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


DEEP = 500  # levels of nesting named in the error of a document too deep for json's reader


def loads(text: str | bytes, **kwargs):
    """json.loads, where a document nested too deeply for the reader (its C scanner recurses, and
    '[' * 100000 was a RecursionError: an internal error, not a line naming the file) is a
    json.JSONDecodeError at the bracket that passes DEEP levels, as every other unreadable text is."""
    import json
    try:
        return json.loads(text, **kwargs)
    except RecursionError:
        doc = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        raise json.JSONDecodeError(f"arrays or objects nested more than {DEEP} deep", doc, _deep_at(doc)) from None


def _deep_at(doc: str) -> int:
    depth, in_string, escaped = 0, False, False
    for i, c in enumerate(doc):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > DEEP:
                return i
        elif c in "]}":
            depth -= 1
    return 0
