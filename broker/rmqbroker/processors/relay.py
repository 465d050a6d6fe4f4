"""Relaying a slave's writes to its master (sends, sends back, transaction ends).

Clients route writes by brokerName to brokerId 0 and learn a new master only from their next
route refresh (the C++ client's runs every 30 s). After a hand-over or a failover the old
master, now a slave of the same group, still gets their writes; RocketMQ refuses them, and with a
single broker group every send fails until the refresh. Here a slave that streams from a master
forwards such a request there and hands back the master's answer: the client sees SEND_OK. A
broker demoted moments ago (a hand-over under way) waits briefly for its new master rather than
refusing at once, so a planned hand-over pauses sends instead of failing them.

The forwarded request is the client's own (its ACL signature still verifies: the markers added
are not signed) and carries :data:`~rmqbroker.remoting.wire.RELAYED_BY`, so a broker that gets it
while being a slave itself refuses it instead of forwarding again: no loops. The ACL check ran
here first, with the client's own address. :data:`~rmqbroker.remoting.wire.RELAYED_FOR` names the
client's address, which the master stores as the message's born host when the request comes from
one of the slaves it streams to (anyone else's claim is ignored).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from rmqbroker.remoting import wire
from rmqbroker.remoting.client import RemotingClient, RemotingError
from rmqbroker.remoting.codes import FLAG_ONEWAY, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand

log = logging.getLogger(__name__)

# How long a relayed request may take here, the wait for a master included: under the clients'
# usual 3 s send timeout (a client that timed out sends again what the master may have stored).
RELAY_TIMEOUT_SECONDS = 2.5
# What a relay found its master late still gives the master to answer.
RELAY_MIN_SECONDS = 0.5
# A broker demoted less than this ago waits for its new master (a hand-over's promotion and
# re-point) for at most RELAY_WAIT_SECONDS; any other slave without a master refuses at once.
RELAY_WAIT_AFTER_DEMOTION_SECONDS = 30.0
RELAY_WAIT_SECONDS = 2.0
_POLL_SECONDS = 0.02


class WriteRelay:
    """Forwards writes a slave receives to the master it follows."""

    def __init__(self, client: RemotingClient, master: Callable[[], str | None],
                 demoted_at: Callable[[], float | None], own_addr: str) -> None:
        """``master``: the broker address of the master this slave streams from now, or None;
        ``demoted_at``: when (monotonic) this broker last stopped being a master, or None."""
        self.client = client
        self._master = master
        self._demoted_at = demoted_at
        self._own_addr = own_addr
        self.relayed = 0
        self.failed = 0

    def forward(self, cmd: RemotingCommand, client: str) -> Awaitable[RemotingCommand | None] | None:
        """The master's answer to ``cmd`` from ``client`` (host:port), or None to handle it here
        (it was relayed to us)."""
        if wire.RELAYED_BY in cmd.ext_fields:
            return None
        return self._forward(cmd, client)

    def _target(self) -> str | None:
        master = self._master()
        # A former master may still hold its own address as the last master it learned.
        return None if master == self._own_addr else master

    async def _forward(self, cmd: RemotingCommand, client: str) -> RemotingCommand | None:
        started = time.monotonic()
        master = self._target()
        if master is None:
            demoted = self._demoted_at()
            if demoted is not None and started - demoted < RELAY_WAIT_AFTER_DEMOTION_SECONDS:
                deadline = started + RELAY_WAIT_SECONDS
                while master is None and time.monotonic() < deadline:
                    await asyncio.sleep(_POLL_SECONDS)
                    master = self._target()
        if master is None:
            return self._refused(cmd, "this broker is a SLAVE following no master now")
        relayed = RemotingCommand(cmd.code, ext_fields={**cmd.ext_fields, wire.RELAYED_BY: self._own_addr,
                                                        wire.RELAYED_FOR: client},
                                  body=cmd.body, language=cmd.language, version=cmd.version)
        try:
            if cmd.flag & FLAG_ONEWAY:
                await self.client.invoke_oneway(master, relayed)
                self.relayed += 1
                return None
            timeout = max(started + RELAY_TIMEOUT_SECONDS - time.monotonic(), RELAY_MIN_SECONDS)
            answer = await self.client.invoke(master, relayed, timeout)
        except RemotingError as exc:
            self.failed += 1
            log.warning("relaying request code %d to the master %s failed: %s", cmd.code, master, exc)
            return self._refused(cmd, f"this broker is a SLAVE and its master {master} did not answer: {exc}")
        self.relayed += 1
        answer.opaque = cmd.opaque
        answer.serialize_type = cmd.serialize_type
        return answer

    @staticmethod
    def _refused(cmd: RemotingCommand, why: str) -> RemotingCommand | None:
        if cmd.flag & FLAG_ONEWAY:
            return None
        return cmd.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, f"service not available now: {why}")
