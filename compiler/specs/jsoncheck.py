"""Checking a JSON document against a JSON Schema (jsonschema) with one-line messages that name
the field and the value: profiles and saved schedules. JSON's NaN and Infinity (and 1e400) parse
to floats that every schema bound passes, so they are refused first."""

from __future__ import annotations

import math

import jsonschema


def field_name(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def first_error(validator: jsonschema.protocols.Validator, doc) -> jsonschema.ValidationError | None:
    errors = sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    return errors[0] if errors else None


def schema_message(err: jsonschema.ValidationError) -> tuple[str, str]:
    """(field, message) for one schema violation."""
    path = list(err.absolute_path)
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        return field_name(path + [extra[0]]), f"unknown field (allowed: {', '.join(sorted(err.schema['properties']))})"
    if err.validator == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        return field_name(path + [missing]), "required field is missing"
    if err.validator == "exclusiveMinimum":
        return field_name(path), f"{err.instance!r} must be > {err.validator_value}"
    if err.validator == "minimum":
        return field_name(path), f"{err.instance!r} must be >= {err.validator_value}"
    if err.validator == "maximum":
        return field_name(path), f"{err.instance!r} must be <= {err.validator_value}"
    if err.validator == "type":
        want = err.validator_value if isinstance(err.validator_value, str) else " or ".join(err.validator_value)
        return field_name(path), f"{err.instance!r} is not of type {want}"
    return field_name(path), f"{err.instance!r}: {err.message}"


def not_finite(doc, path=(), skip=frozenset()) -> tuple | None:
    """The path of the first number in `doc` that is NaN or infinite (JSON's NaN and Infinity, or
    1e400, parse to them and pass the schema's minimum and maximum), else None; the paths in
    `skip` (tuples of keys) are not entered."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return path
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    return next((p for k, v in items if path + (k,) not in skip
                 and (p := not_finite(v, path + (k,), skip)) is not None), None)


def schema_violation(doc, schema: dict, checked=frozenset()) -> str | None:
    """"FIELD: MESSAGE" for the first number that is not finite or the first schema violation (in
    field order), else None. checked: paths (tuples of keys) whose contents the caller checks
    itself, not walked for numbers (a 512-GPU schedule's transfers took 5 s to walk)."""
    bad = not_finite(doc, skip=checked)
    if bad is not None:
        value = doc
        for k in bad:
            value = value[k]
        return f"{field_name(bad)}: {value!r} is not a finite number"
    err = first_error(jsonschema.Draft202012Validator(schema), doc)
    if err is None:
        return None
    field, msg = schema_message(err)
    return f"{field}: {msg}"
