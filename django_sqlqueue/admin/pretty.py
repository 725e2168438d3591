"""Payloads and responses as indented, escaped JSON on the admin's pages (job and schedule pages)."""

from __future__ import annotations

import json
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString

#: Payload / response larger than this (as pretty JSON) are cut on the job page.
PRETTY_JSON_LIMIT = 200_000
#: Nesting indented on the job page; deeper values are written compactly on one line. Indenting is
#: recursive (Python's encoder, or ours): a response nested ~990 deep raised RecursionError on the page.
PRETTY_JSON_DEPTH = 20


def pretty_json(value: Any) -> SafeString:
    """Indented JSON in a <pre>, HTML-escaped (a payload holding ``<script>`` shows as text).

    Indented to :data:`PRETTY_JSON_DEPTH` levels, compact below; written piece by piece and stopped at
    :data:`PRETTY_JSON_LIMIT` characters, so a large value costs the page that much, not its whole size
    several times over.
    """
    if value is None:
        return format_html('<span class="quiet">{}</span>', "—")
    parts: list[str] = []
    size = 0
    for chunk in _pretty_chunks(value, 0):
        parts.append(chunk)
        size += len(chunk)
        if size > PRETTY_JSON_LIMIT:
            break
    text = "".join(parts)
    note = ""
    if size > PRETTY_JSON_LIMIT:
        note = f"\n… cut at {PRETTY_JSON_LIMIT} characters"
        text = text[:PRETTY_JSON_LIMIT]
    return format_html('<pre class="sqlqueue-json">{}{}</pre>', text, note)


def _pretty_chunks(value: Any, depth: int) -> Any:
    """``json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)`` as pieces, indented to
    :data:`PRETTY_JSON_DEPTH` levels (then compact: C code, no Python recursion per level)."""
    if not isinstance(value, dict | list) or not value or depth >= PRETTY_JSON_DEPTH:
        yield json.dumps(value, ensure_ascii=False, sort_keys=True)
        return
    pad, inner = "  " * depth, "  " * (depth + 1)
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    yield opening
    items = sorted(value.items()) if isinstance(value, dict) else enumerate(value)
    for i, (key, item) in enumerate(items):
        yield ("," if i else "") + "\n" + inner
        if isinstance(value, dict):
            yield json.dumps(key, ensure_ascii=False) + ": "
        yield from _pretty_chunks(item, depth + 1)
    yield "\n" + pad + closing
