"""A TCP proxy in front of PostgreSQL that loses the reply of a claim after the claim committed.

Used by tests/test_hostile_worker.py and by the soak's "connection cut after commit" fault. It forwards
bytes both ways. After a client sends a claim (``SKIP LOCKED`` in its text) while the proxy is armed,
the server's answer is held back until a ReadyForQuery message says the session is idle again, i.e.
the claim's transaction committed (a claim sent alone runs in autocommit and has committed by then; a
claim sent with completions inside a transaction gets its rows through, and the reply of the COMMIT
that follows is the one held), and then both sockets are closed without a byte of it reaching the
client: exactly a reply lost by a pooler restart or a network cut. Each :meth:`arm` cuts
one claim reply. Standard library only.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

CLAIM_MARK = b"SKIP LOCKED"


class CuttingProxy:
    """Listen on 127.0.0.1 (``port``), forward to ``127.0.0.1:upstream_port``; cut armed claim replies."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self.listener = socket.create_server((host, 0))
        self.port: int = self.listener.getsockname()[1]
        self.cuts = 0
        self._armed = 0
        self._lock = threading.Lock()
        self.cut = threading.Event()  # set once a reply was cut (and stays set)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="faultproxy-accept").start()

    def arm(self, times: int = 1) -> None:
        """Cut the replies of the next ``times`` claims (counted when a claim is sent)."""
        with self._lock:
            self._armed += times

    def _take_arm(self) -> bool:
        with self._lock:
            if self._armed <= 0:
                return False
            self._armed -= 1
            return True

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            state: dict[str, Any] = {"cut_next": False}
            threading.Thread(target=self._pump_up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(server, client, state), daemon=True).start()

    def _pump_up(self, src: socket.socket, dst: socket.socket, state: dict[str, Any]) -> None:
        try:
            while data := src.recv(65536):
                if CLAIM_MARK in data and not state["cut_next"] and self._take_arm():
                    state["cut_next"] = True
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src, dst)

    def _pump_down(self, src: socket.socket, dst: socket.socket, state: dict[str, Any]) -> None:
        held = b""
        try:
            while data := src.recv(65536):
                if state["cut_next"]:
                    held += data
                    held, cut = self._hold(held, dst, state)
                    if cut:
                        return  # both closed in finally: the committed claim's reply is never delivered
                    continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src, dst)

    def _hold(self, held: bytes, dst: socket.socket, state: dict[str, Any]) -> tuple[bytes, bool]:
        """Walk the held reply message by message (type byte, then a length that counts itself).

        At a ReadyForQuery: idle (``I``) means the claim's transaction committed: cut (True). In a
        transaction (``T``): the claim's rows go through, and the COMMIT's reply is the one held next.
        After an ErrorResponse, or in a failed transaction (``E``), nothing committed: the reply goes
        through and the cut waits for the next claim. Returns what is still held (a partial message).
        """
        at = 0
        while len(held) - at >= 5:
            kind = held[at:at + 1]
            length = int.from_bytes(held[at + 1:at + 5], "big")
            end = at + 1 + length
            if len(held) < end:
                break
            if kind == b"E":
                state["error"] = True
            elif kind == b"Z":
                status = held[end - 1:end]
                if status == b"I" and not state.get("error"):
                    with self._lock:
                        self.cuts += 1
                    self.cut.set()
                    return b"", True
                dst.sendall(held[:end])
                held, at = held[end:], 0
                if status != b"T" or state.get("error"):
                    state["cut_next"] = state["error"] = False
                    self.arm()  # this claim committed nothing: cut the next one instead
                continue
            at = end
        return held, False

    def close(self) -> None:
        self._closed = True
        self.listener.close()


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
