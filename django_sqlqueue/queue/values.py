"""What the queue accepts and stores: checks and conversions of callers' values, shared by the
manager's parts."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from .. import bounds
from ..exceptions import InvalidArgument, InvalidPayload

#: ``response`` not given to modify (None is a response: JSON null).
UNSET: Any = object()
#: Longest error text stored (the rest is cut).
MAX_ERROR_CHARS = 65_536


#: Longest delay or retry a caller may ask for (a century; see :mod:`.limits`).
MAX_DELAY_SECONDS = bounds.MAX_DELAY_SECONDS


def new_incarnation() -> str:
    """A fresh worker incarnation id (see ``Worker.incarnation``): random, 32 hex characters."""
    return uuid.uuid4().hex


def unstorable(value: Any) -> str | None:
    """Why ``value`` (JSON-serialisable) cannot be stored on every vendor, or None.

    PostgreSQL's jsonb and text refuse the NUL character, and no UTF-8 column holds a lone surrogate;
    SQLite stores both. Refused everywhere so that what works on SQLite works on PostgreSQL too.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "it contains a NUL character (\\u0000), which PostgreSQL cannot store"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "it contains a lone surrogate, which is not valid UTF-8"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def finite_seconds(value: Any) -> bool:
    """A non-negative, finite number of seconds within :data:`MAX_DELAY_SECONDS`."""
    return bounds.is_seconds(value, MAX_DELAY_SECONDS)


def duration_ms(seconds: float | None) -> int | None:
    """A handler's measured run time (seconds, or None: not measured) as the ``duration_ms`` column holds it."""
    if seconds is None:
        return None
    if not finite_seconds(seconds):
        raise InvalidArgument(f"duration must be a non-negative number of seconds, got {seconds!r}")
    return round(seconds * 1000)


def storable_error(text: str) -> str:
    """Error text as every vendor can store it (NUL and lone surrogates escaped), truncated."""
    return text[:MAX_ERROR_CHARS].replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def offending_path(value: Any) -> str:
    """Where in ``value`` the first item JSON cannot hold sits, as ``['order']['items'][1]`` ('' for
    ``value`` itself or when nothing is found), so an error names the key instead of only the type."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if len(path) > 300:
            return path[:300] + "..."
        if isinstance(item, dict):
            for key in reversed(list(item)):
                if not isinstance(key, str | int | float | bool) and key is not None:
                    return f"{path}[{key!r}]"
                stack.append((item[key], f"{path}[{key!r}]"))
        elif isinstance(item, list | tuple):
            stack.extend((item[i], f"{path}[{i}]") for i in reversed(range(len(item))))
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path
        elif not (item is None or isinstance(item, str | int | bool)):
            return path
    return ""


def encode_json(value: Any, what: str, limit: int | None = None) -> str:
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        # Name the offending key (not for a cycle or a too-deep value: no key is at fault there).
        where = "" if isinstance(exc, RecursionError) or "Circular" in str(exc) else offending_path(value)
        raise InvalidPayload(f"{what} must be JSON-serialisable: {f'{what}{where}: ' if where else ''}{exc}") from exc
    why = unstorable(value)
    if why:
        raise InvalidPayload(f"{what} cannot be stored: {why}")
    if limit is not None and len(text.encode()) > limit:
        raise InvalidPayload(f"{what} is {len(text.encode())} bytes; the limit is {limit} (SQLQUEUE['MAX_PAYLOAD_BYTES'])")
    return text


def check_response(value: Any) -> None:
    """A response the queue may store: JSON, storable on every vendor, within ``MAX_RESPONSE_BYTES``."""
    why = bounds.response_too_large(encode_json(value, "response"))
    if why:
        raise InvalidPayload(f"response cannot be stored: {why}")


def storable_key(value: Any, what: str) -> None:
    """Queue names and dedupe keys: text every vendor stores (PostgreSQL refuses NUL in text)."""
    why = unstorable(value)
    if why:
        raise InvalidArgument(f"{what} cannot be stored: {why}")
