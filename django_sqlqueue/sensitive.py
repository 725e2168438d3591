"""Sensitive job data: payload / response keys and subtype fields the admin masks.

A password-reset code, a token or an address may travel in a job. Who may *see* the queue (view-only
staff, on-call engineers) need not see those. Mark them once, next to the handler or the subtype::

    from django_sqlqueue.sensitive import mark_sensitive

    mark_sensitive("ResetPassword", "otp", "body")   # keys, at any depth of payload and response
    mark_sensitive("*", "password")                  # every job type

    class ResetPassword(JobData):
        sensitive_fields = ("otp",)                  # subtype columns

The admin then shows ``••••••`` in their place, unless the user holds the
``django_sqlqueue.view_sensitive_job`` permission ("Can view sensitive job data"; superusers hold every
permission). Masking is for display: the stored job is unchanged and workers read it whole.
"""

from __future__ import annotations

from typing import Any

#: The permission that shows sensitive values in the admin.
PERMISSION = "django_sqlqueue.view_sensitive_job"
#: What a masked value shows.
MASK = "•••••• (hidden)"
#: Nesting masked key by key; a deeper value is hidden whole (masking must not recurse without bound).
MAX_DEPTH = 100

_keys: dict[str, set[str]] = {}


def mark_sensitive(type_name: str, *keys: str) -> None:
    """Mask these payload / response keys of jobs of ``type_name`` (``"*"``: of every type)."""
    if not isinstance(type_name, str) or not type_name:
        raise ValueError("mark_sensitive needs a job type name (or '*')")
    for key in keys:
        if not isinstance(key, str) or not key:
            raise ValueError(f"mark_sensitive({type_name!r}): keys are non-empty strings, not {key!r}")
    _keys.setdefault(type_name, set()).update(keys)


def sensitive_keys(type_name: str) -> frozenset[str]:
    return frozenset(_keys.get(type_name, set()) | _keys.get("*", set()))


def all_sensitive_keys() -> frozenset[str]:
    """Every key marked sensitive for any type (what the payload search refuses to probe)."""
    return frozenset(k for keys in _keys.values() for k in keys)


def can_view(user: Any) -> bool:
    return bool(user is not None and user.has_perm(PERMISSION))


def mask(value: Any, keys: frozenset[str] | set[str], depth: int = 0) -> Any:
    """A copy of ``value`` with the value of every dict key in ``keys`` replaced by :data:`MASK`."""
    if not keys:
        return value
    if depth >= MAX_DEPTH and isinstance(value, dict | list):
        return MASK
    if isinstance(value, dict):
        return {k: (MASK if k in keys else mask(v, keys, depth + 1)) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v, keys, depth + 1) for v in value]
    return value


def sensitive_fields(model: Any) -> tuple[str, ...]:
    """The subtype columns ``model`` marks sensitive (``JobData.sensitive_fields``)."""
    return tuple(getattr(model, "sensitive_fields", ()) or ())
