"""Wake-ups sent after a commit (PostgreSQL NOTIFY): for enqueues, and for jobs made claimable again.

Kept apart from enqueue and modify so that both (and the pause switches) send them one way.
"""

from __future__ import annotations

import functools

from django.db import connections, transaction

from ..conf import get_settings
from ..dialects import get_dialect, wake_payload

#: The attribute of a connection (Django's, one per thread and alias) holding the queues its current
#: transaction enqueued to that no wake-up has named yet.
_PENDING = "_sqlqueue_pending_wakeup"


def notify_on_commit(alias: str, channel: str, queues: set[str]) -> None:
    """Wake idle workers once the caller's transaction commits: one notification per transaction.

    Why after the commit, not inside it: PostgreSQL serialises the commits of transactions that
    notified (one global lock, held through the WAL flush), so a notification inside every enqueuing
    transaction keeps concurrent writers from sharing flushes. Sent from an ``on_commit`` hook, in
    autocommit, it names every queue the transaction enqueued to. Each enqueue registers a hook, so a
    savepoint rolled back drops only its own; the first hook to run sends, the others find nothing
    pending. A rolled-back transaction sends nothing; its queues, if still pending, only widen the
    next transaction's notification (a worker woken for nothing claims nothing).
    """
    connection = connections[alias]
    pending = getattr(connection, _PENDING, None)
    if pending is None:
        pending = set()
        setattr(connection, _PENDING, pending)
    pending.update(queues)
    transaction.on_commit(functools.partial(_send_pending_wakeup, alias, channel), using=alias, robust=True)


def wake_on_commit(alias: str, queues: set[str]) -> None:
    """Wake the idle workers of ``queues`` once the caller's transaction commits (at once in autocommit),
    where the vendor can notify: for jobs made claimable with a due time already past (a hand-back, a
    workflow release, an operator's retry, a resumed queue or type), which the fleet's look, reading
    only the jobs that came due lately, does not name."""
    channel = get_settings().NOTIFY_CHANNEL
    connection = connections[alias]
    notify = get_dialect(connection).notify_sql()
    if not (channel and queues and notify):
        return
    if connection.get_autocommit() or (connection.in_atomic_block and connection.commit_on_exit):
        notify_on_commit(alias, channel, queues)
    else:
        # AUTOCOMMIT off (no atomic() of Django's, or one entered with it off): Django runs no on_commit
        # hook there, so the notification rides in the caller's transaction, delivered at its commit.
        with connection.cursor() as cursor:
            cursor.execute(notify, [channel, wake_payload(queues)])


def _send_pending_wakeup(alias: str, channel: str) -> None:
    connection = connections[alias]
    pending = getattr(connection, _PENDING, None)
    if not pending:
        return
    queues = wake_payload(pending)
    pending.clear()
    with connection.cursor() as cursor:
        get_dialect(connection).notify_after_commit(cursor, channel, queues)
