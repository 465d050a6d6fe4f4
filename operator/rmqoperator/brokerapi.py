"""Client of the brokers' admin HTTP endpoint: ``GET /status``, ``POST /ha/master``, ``POST /ha/fence``,
``POST /role``.

Every call carries the group's bearer token. Timeouts are short for status polls (an
unreachable broker must not delay the others) and longer for role changes (a promotion may
truncate a partial record and fsync the epoch file).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

STATUS_TIMEOUT = aiohttp.ClientTimeout(total=2.0, sock_connect=1.0)
CONTROL_TIMEOUT = aiohttp.ClientTimeout(total=15.0, sock_connect=2.0)
# A second look at a master about to be replaced: one that is still hung must not delay the promotion.
RECHECK_TIMEOUT = aiohttp.ClientTimeout(total=0.5, sock_connect=0.5)


class AdminError(Exception):
    """An admin call failed: ``status`` 0 when unreachable, else the HTTP status and the broker's reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class BrokerAdmin:
    """One shared HTTP session for all brokers of all groups."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._closed:
            # A call after close() would open a session nobody closes.
            raise AdminError(0, "the operator is stopping")
        if self._session is None or self._session.closed:
            # No connection reuse across pods that may change IPs; brokers are few per group.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        return self._session

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, method: str, url: str, token: str, body: dict[str, Any] | None,
                    timeout: aiohttp.ClientTimeout) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"}
        try:
            async with self.session.request(method, url, json=body, headers=headers, timeout=timeout) as resp:
                text = await resp.text()
                try:
                    obj = json.loads(text) if text else {}
                except ValueError:
                    obj = {"error": text[:300]}
                if resp.status >= 400:
                    raise AdminError(resp.status, str(obj.get("error", text[:300])))
                if not isinstance(obj, dict):
                    raise AdminError(resp.status, "answer is not a JSON object")
                return obj
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise AdminError(0, f"{type(exc).__name__}: {exc}") from exc

    async def status(self, host: str, port: int, token: str,
                     timeout: aiohttp.ClientTimeout = STATUS_TIMEOUT) -> dict[str, Any]:
        return await self._call("GET", f"http://{host}:{port}/status", token, None, timeout)

    async def repoint(self, host: str, port: int, token: str, ha_address: str, broker_address: str | None,
                      epoch: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {"haAddress": ha_address}
        if broker_address:
            body["brokerAddress"] = broker_address
        if epoch is not None:
            body["epoch"] = epoch
        return await self._call("POST", f"http://{host}:{port}/ha/master", token, body, CONTROL_TIMEOUT)

    async def fence(self, host: str, port: int, token: str, epoch: int) -> dict[str, Any]:
        return await self._call("POST", f"http://{host}:{port}/ha/fence", token, {"epoch": epoch}, CONTROL_TIMEOUT)

    async def set_role(self, host: str, port: int, token: str, role: str, broker_id: int,
                       epoch: int, *, drain_millis: int = 0, drain_for: str | None = None,
                       metadata_from: str | None = None, not_after_ms: int | None = None) -> dict[str, Any]:
        """``drain_millis``: a master's demotion waits that long for its slaves to take its last
        bytes (only for the slave connected from ``drain_for``, when given); ``metadata_from``: a
        slave's promotion first takes the metadata of the master at that broker address (a
        hand-over); ``not_after_ms``: the broker refuses the change once that Unix time (ms) has
        passed."""
        body: dict[str, Any] = {"role": role, "brokerId": broker_id, "epoch": epoch}
        if drain_millis:
            body["drainMillis"] = drain_millis
            if drain_for:
                body["drainFor"] = [drain_for]
        if metadata_from:
            body["syncMetadata"] = True
            body["metadataSource"] = metadata_from
        if not_after_ms is not None:
            body["notAfterMillis"] = not_after_ms
        return await self._call("POST", f"http://{host}:{port}/role", token, body, CONTROL_TIMEOUT)
