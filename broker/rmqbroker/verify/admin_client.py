"""Blocking client of a broker's admin endpoint, as used by the verification driver and its tasks.

``http.client`` with one kept-alive connection per (process, endpoint): Spark runs tasks in
long-lived Python workers, so a worker re-uses its connections across chunks.  Bodies are read
straight into one preallocated buffer (the commitlog ranges are tens of MB).
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any


class AdminError(Exception):
    """The endpoint could not be reached or answered with an error."""


@dataclass(frozen=True, slots=True)
class QueueInfo:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int


_local = threading.local()


class AdminClient:
    """GET /status, /metadata, /commitlog and /consumequeue of one broker."""

    def __init__(self, url: str, token: str, timeout: float = 120.0) -> None:
        parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"not an http(s) admin URL: {url!r}")
        self.url = url
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port or (443 if self._https else 80)
        self._prefix = parsed.path.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout

    # -- connection handling ------------------------------------------------------------------
    def _conn(self) -> http.client.HTTPConnection:
        # Per thread: the driver may fetch from several replicas concurrently.
        conns: dict[tuple[str, int, bool], http.client.HTTPConnection] = getattr(_local, "conns", None) or {}
        _local.conns = conns
        key = (self._host, self._port, self._https)
        conn = conns.get(key)
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = conns[key] = cls(self._host, self._port, timeout=self._timeout)
        return conn

    def _drop(self) -> None:
        conns: dict[tuple[str, int, bool], http.client.HTTPConnection] = getattr(_local, "conns", {})
        conn = conns.pop((self._host, self._port, self._https), None)
        if conn is not None:
            conn.close()

    def _get(self, path: str, query: dict[str, str | int] | None = None,
             ) -> tuple[http.client.HTTPResponse, bytes | bytearray]:
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        # One retry on a fresh connection: a kept-alive connection may have been closed by the server.
        for attempt in (0, 1):
            conn = self._conn()
            try:
                conn.request("GET", target, headers=self._headers)
                resp = conn.getresponse()
                length = resp.getheader("Content-Length")
                if length is not None and resp.status == 200:
                    buf = bytearray(int(length))
                    view = memoryview(buf)
                    got = 0
                    while got < len(buf):
                        n = resp.readinto(view[got:])
                        if not n:
                            raise AdminError(f"{self.url}{path}: body ended after {got} of {len(buf)} bytes")
                        got += n
                    body: bytes | bytearray = buf  # no copy: callers only read it
                else:
                    body = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                if attempt:
                    raise AdminError(f"{self.url}{path}: {exc}") from exc
                continue
            if resp.status != 200:
                raise AdminError(f"{self.url}{path}: HTTP {resp.status}: {body[:300]!r}")
            return resp, body
        raise AssertionError("unreachable")

    def _json(self, path: str) -> Any:
        _resp, body = self._get(path)
        try:
            return json.loads(body)
        except ValueError as exc:
            raise AdminError(f"{self.url}{path}: not JSON: {exc}") from exc

    # -- endpoints -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        obj = self._json("/status")
        if not isinstance(obj, dict):
            raise AdminError(f"{self.url}/status: not a JSON object")
        return obj

    def metadata(self) -> dict[str, Any]:
        obj = self._json("/metadata")
        if not isinstance(obj, dict):
            raise AdminError(f"{self.url}/metadata: not a JSON object")
        return obj

    def queues(self) -> list[QueueInfo]:
        obj = self._json("/consumequeue")
        if not isinstance(obj, list):
            raise AdminError(f"{self.url}/consumequeue: not a JSON list")
        return [QueueInfo(str(q["topic"]), int(q["queueId"]), int(q["minOffset"]), int(q["maxOffset"])) for q in obj]

    def commitlog(self, offset: int, length: int) -> tuple[int, bytes | bytearray]:
        """Committed bytes from ``offset`` (clipped to what the broker has): ``(first offset, bytes)``."""
        if length <= 0:
            return offset, b""
        resp, body = self._get("/commitlog", {"offset": offset, "length": length})
        return int(resp.getheader("X-Commitlog-Offset") or offset), body

    def consume_queue(self, topic: str, queue_id: int, offset: int, count: int) -> bytes | bytearray:
        """Raw 20-byte units from logical ``offset`` (fewer when the queue is shorter)."""
        if count <= 0:
            return b""
        _resp, body = self._get("/consumequeue", {"topic": topic, "queueId": queue_id, "offset": offset,
                                                  "count": count})
        return body
