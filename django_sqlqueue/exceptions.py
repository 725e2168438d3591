"""One exception hierarchy. Each class's docstring is its default message."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class SqlQueueError(Exception):
    """A django-sqlqueue error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class SqlQueueConfigError(SqlQueueError, ImproperlyConfigured):
    """django-sqlqueue is not configured correctly."""

    def __init__(self, message: str | None = None, *, problems: list[str] | None = None) -> None:
        super().__init__(message)
        #: Each problem found, when several were (the settings are checked whole: all reported at once).
        self.problems = list(problems or [str(self)])


class WorkerNameInUse(SqlQueueConfigError):
    """A live worker already runs under this name; two would run each other's jobs twice."""


class UnsupportedDatabase(SqlQueueConfigError):
    """This database vendor is not supported (SQL Server, PostgreSQL and SQLite are)."""


class UnknownJobType(SqlQueueError, LookupError):
    """No job type with that name is registered."""


class InvalidPayload(SqlQueueError, ValueError):
    """The payload cannot be stored: it must be JSON-serialisable and within the size limit."""


class InvalidArgument(SqlQueueError, ValueError):
    """An argument is out of range."""


class IllegalTransition(SqlQueueError):
    """That status change is not allowed by the transition table."""


class StaleJob(SqlQueueError):
    """The job changed since its concurrency token was read; nothing was written."""


class JobNotFound(SqlQueueError, LookupError):
    """No job with that id."""


class SubtypeMismatch(SqlQueueError, ValueError):
    """That subtype row does not belong to a job of this type."""


class CancelTooLate(IllegalTransition):
    """The job finished before the cancel reached it (e.g. Completed first): nothing was changed."""
