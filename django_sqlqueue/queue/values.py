"""What the queue accepts and stores: checks and conversions of callers' values, shared by the
manager's parts."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from .. import bounds
from ..bounds import unstorable
from ..conf import get_settings
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
    why = response_too_large(encode_json(value, "response"))
    if why:
        raise InvalidPayload(f"response cannot be stored: {why}")


def storable_key(value: Any, what: str) -> None:
    """Queue names and dedupe keys: text every vendor stores (PostgreSQL refuses NUL in text)."""
    why = unstorable(value)
    if why:
        raise InvalidArgument(f"{what} cannot be stored: {why}")


# ----- responses -----------------------------------------------------------------------------------------
def response_too_large(text: str) -> str | None:
    """Why a handler's response, serialised as ``text``, is refused for its size, or None.

    Mirrors the payload limit: a response is stored in the job row and shown on the job page, so one
    of many megabytes costs every read of the row and the page's memory many times its size.
    """
    limit = get_settings().MAX_RESPONSE_BYTES
    size = len(text.encode("utf-8"))
    if size > limit:
        return f"it is {size} bytes; the limit is {limit} (SQLQUEUE['MAX_RESPONSE_BYTES'])"
    return None


def response_problem(value: Any) -> str | None:
    """Why a handler's return value cannot be stored as the job's response, or None.

    For the worker, before it records a success: JSON-serialisable values only (NaN, sets refused), no
    NUL or lone surrogate (PostgreSQL cannot store them), and within ``MAX_RESPONSE_BYTES``.
    """
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        return f"it is not JSON-serialisable ({type(exc).__name__}: {exc})"
    return unstorable(value) or response_too_large(text)
