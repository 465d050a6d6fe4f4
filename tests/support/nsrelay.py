"""A TCP relay in front of a real nameserver that records the REGISTER_BROKER requests passing
through it: what a nameserver receives from a broker pointed at the relay, byte for byte.

Each accepted connection gets its own upstream connection, and either side closing closes the
other, so the nameserver sees a broker's connection close as it would without the relay.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

from rmqbroker.namesrv.processor import decode_register_body
from rmqbroker.remoting.codes import RequestCode
from rmqbroker.remoting.frame import FrameError, decode_frame_payload
from rmqbroker.remoting.wire import BROKER_ADDR, BROKER_ID, COMPRESSED
from tests.support.procs import free_port


@dataclass(frozen=True)
class Registration:
    at: float  # time.monotonic() when the relay read it
    broker_addr: str
    broker_id: int
    body_bytes: int
    topics: int
    data_version: dict[str, object] | None


class NamesrvRelay:
    """Forwards ``127.0.0.1:<port>`` to ``target`` and keeps every registration it saw."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.port = free_port()
        self._lock = threading.Lock()
        self._registrations: list[Registration] = []
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> NamesrvRelay:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, name="ns-relay-accept", daemon=True).start()
        return self

    def stop(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
            listener, self._listener = self._listener, None
        for s in [*sockets, *([listener] if listener is not None else [])]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not connected, or already closed by its peer
            s.close()

    def registrations(self, broker_addr: str | None = None, since: float = float("-inf")) -> list[Registration]:
        with self._lock:
            return [r for r in self._registrations
                    if (broker_addr is None or r.broker_addr == broker_addr) and r.at >= since]

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while True:
            try:
                down, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                up = socket.create_connection(self.target, timeout=5)
            except OSError:
                down.close()
                continue
            up.settimeout(None)
            with self._lock:
                self._sockets += [down, up]
            threading.Thread(target=self._pump, args=(down, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        buf = b""
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
                if requests:
                    buf = self._record(buf + chunk)
        except OSError:
            pass  # the other pump closed both
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def _record(self, buf: bytes) -> bytes:
        """Record each whole registration frame in ``buf``; the bytes of an unfinished frame."""
        while len(buf) >= 4:
            length = int.from_bytes(buf[:4], "big")
            if len(buf) < 4 + length:
                break
            payload, buf = buf[4:4 + length], buf[4 + length:]
            try:
                cmd = decode_frame_payload(payload)
            except FrameError:
                continue
            if cmd.code != RequestCode.REGISTER_BROKER or cmd.is_response:
                continue
            body = bytes(cmd.body)
            version, topics = decode_register_body(body, cmd.ext_fields.get(COMPRESSED) == "true")
            with self._lock:
                self._registrations.append(Registration(
                    time.monotonic(), cmd.ext_fields.get(BROKER_ADDR, ""), int(cmd.ext_fields.get(BROKER_ID, "-1")),
                    len(body), len(topics), version))
        return buf
