"""What runs inside a slot process: the supervisor starts :func:`slot_main`, which runs a Worker.

The shared memory a slot uses to talk to the supervisor (:class:`SlotChannel`) is part of the worker's
contract (:mod:`django_sqlqueue.worker_contract`); it is importable from here too.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from typing import Any

from .contract import EXIT_FATAL, EXIT_ORPHANED, Flag, SlotChannel, WorkerConfig
from .support import one_line

#: Longest a slot waits for the supervisor's first connect attempt (its connect timeout, and a margin).
GO_WAIT_SECONDS = 10.0


def slot_main(config: WorkerConfig, channel: SlotChannel, log_level: str | None, go: Any = None) -> None:
    """Entry point of a slot process (spawned, or forked by the supervisor with Django set up).

    ``go``: the supervisor's start gate (a contract.Flag), set once its own first connect attempt
    is over; the slot connects after that (or after GO_WAIT_SECONDS), so a role short of connections
    runs fewer slots. Not an Event: see contract.Flag for the hang an Event caused.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the worker installs its own handlers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked slot has the supervisor's handler
    _die_with_parent()
    if os.getppid() != channel.supervisor_pid:
        # The supervisor was gone before the line above could tie this process to it (a slot started
        # while it stopped): nobody would stop this slot, which would claim and run jobs on its own.
        os._exit(EXIT_ORPHANED)
    from django.apps import apps

    if not apps.ready:  # spawned: a fresh interpreter (forked: the supervisor's, set up already)
        import django

        django.setup()
    from .loop import Worker
    from .support import configure_logging

    configure_logging(log_level)
    if go is not None:
        wait_for_go(go, channel)
    try:
        code = Worker(config, channel).run()
    except Exception as exc:
        from django.core.exceptions import ImproperlyConfigured

        from ..exceptions import UnknownJobType

        if isinstance(exc, ImproperlyConfigured | UnknownJobType):
            logging.getLogger("django_sqlqueue.worker").error("worker_fatal worker=%s error=%s", config.name,
                                                              one_line(exc))
            code = EXIT_FATAL
        else:
            raise
    channel.declared.value = code
    sys.exit(code)


def wait_for_go(go: Flag, channel: SlotChannel | None) -> None:
    """Until the supervisor sets its start gate (a contract.Flag), its stop is asked, or GO_WAIT_SECONDS
    pass: polled, so that a slot killed here leaves nothing held."""
    deadline = time.monotonic() + GO_WAIT_SECONDS
    while not go.is_set() and not (channel is not None and channel.stop.is_set()) and time.monotonic() < deadline:
        time.sleep(0.01)


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when the supervisor dies (kill -9 included)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere the heartbeat thread notices the parent is gone within a beat


__all__ = ["SlotChannel", "slot_main"]
