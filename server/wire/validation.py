"""msgspec's validation errors in the wire's words: the field at fault, as a path, and a message
that says what it must be (or, for a field it does not know, what is close)."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from server.errors import did_you_mean

_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<name>[^`]*)`")
_CONSTRAINT = re.compile(r"^Expected `\w+` (?:[<>]=?|matching regex|of length)")
_UNION = re.compile(r"^Expected `[^`]*\|[^`]*`")  # a union's types (`bool | str`): say its values instead
_MISSING = re.compile(r"Object missing required field `(?P<name>[^`]*)`")


def field_names(target: type, path: str) -> list[str]:
    """The field names of the struct at `path` (dotted, with list indexes: `lines[0]`; "" for
    `target` itself) inside `target`."""
    info: Any = msgspec.inspect.type_info(target)
    for part in filter(None, re.split(r"\.|(?=\[)", path)):
        info = _struct(info)
        if part.startswith("["):
            info = info.item_type if isinstance(info, (msgspec.inspect.ListType, msgspec.inspect.VarTupleType)) \
                else None
        elif isinstance(info, msgspec.inspect.StructType):
            info = next((f.type for f in info.fields if f.name == part), None)
        else:
            return []
    info = _struct(info)
    return [f.name for f in info.fields] if isinstance(info, msgspec.inspect.StructType) else []


def _struct(info: Any) -> Any:
    """A union's struct member (an optional struct), else `info` as it is."""
    if isinstance(info, msgspec.inspect.UnionType):
        return next((t for t in info.types if isinstance(t, (msgspec.inspect.StructType, msgspec.inspect.ListType))),
                    None)
    return info


def describe_validation_error(exc: msgspec.ValidationError, rules: dict[str, str],
                              target: type | None = None) -> tuple[str | None, str]:
    """msgspec's `Expected ... - at $.options.denoise` as (`options.denoise`,
    `options.denoise: expected `bool`, got `str``): the field at fault and the message. With
    `target` (the struct decoded), an unknown field's message names the closest known one."""
    match = _AT.match(str(exc))
    assert match is not None
    msg, path = match.group("msg"), (match.group("path") or "").lstrip(".")
    if found := _UNKNOWN.match(msg):
        name = f"{path}.{found.group('name')}" if path else found.group("name")
        close = did_you_mean(found.group("name"), field_names(target, path)) if target is not None else ""
        return name, f"{name}: unknown field{close}"
    if found := _MISSING.match(msg):
        name = f"{path}.{found.group('name')}" if path else found.group("name")
        return name, f"{name}: required"
    rule = rules.get(path)
    if "got `null`" in msg:
        return path or None, f"{path}: must not be null"
    if rule is not None and (_CONSTRAINT.search(msg) or msg.startswith("Invalid enum") or _UNION.match(msg)):
        return path, f"{path}: {rule}"
    text = msg[0].lower() + msg[1:] if msg else "invalid"
    return (path, f"{path}: {text}") if path else (None, text)
