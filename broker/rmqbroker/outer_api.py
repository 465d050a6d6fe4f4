"""The broker's calls to other processes: nameserver registration and (on slaves) the master's
GET_ALL_* metadata requests."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from rmqbroker.acl import sign
from rmqbroker.remoting import wire
from rmqbroker.remoting.client import RemotingClient, RemotingError
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.store.record import body_crc

log = logging.getLogger(__name__)


class OuterApiError(Exception):
    """A peer answered with an error code."""


class OuterApiRefused(OuterApiError):
    """The peer was reached and refused this one request (its other requests may succeed)."""


@dataclass(frozen=True, slots=True)
class RegisterResult:
    namesrv: str
    ha_server_addr: str | None
    master_addr: str | None


class BrokerOuterApi:
    """Talks to nameservers and to the master broker."""

    def __init__(self, client: RemotingClient | None = None, timeout: float = 3.0,
                 credentials: tuple[str, str] | None = None) -> None:
        self.client = client or RemotingClient()
        self.timeout = timeout
        # (accessKey, secretKey) that signs requests to other brokers, whose plain ACL may be on.
        self.credentials = credentials

    async def register_broker_all(
        self,
        namesrv_addrs: list[str],
        *,
        cluster_name: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str,
        topic_config_wrapper: dict[str, Any],
        epoch: int | None = None,
        oneway: bool = False,
    ) -> list[RegisterResult]:
        body = json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": topic_config_wrapper},
                          separators=(",", ":")).encode("utf-8")
        ext = {
            wire.BROKER_ADDR: broker_addr,
            wire.BROKER_ID: str(broker_id),
            wire.BROKER_NAME: broker_name,
            wire.CLUSTER_NAME: cluster_name,
            wire.HA_SERVER_ADDR: ha_server_addr,
            wire.COMPRESSED: "false",
            wire.BODY_CRC32: str(body_crc(body)),
        }
        if epoch is not None:
            ext[wire.EPOCH] = str(epoch)

        async def one(addr: str) -> RegisterResult | None:
            cmd = RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=dict(ext), body=body)
            try:
                if oneway:
                    await self.client.invoke_oneway(addr, cmd)
                    return None
                resp = await self.client.invoke(addr, cmd, self.timeout)
            except RemotingError as exc:
                log.warning("register to nameserver %s failed: %s", addr, exc)
                return None
            if resp.code != ResponseCode.SUCCESS:
                log.warning("nameserver %s refused registration: %s %s", addr, resp.code, resp.remark)
                return None
            return RegisterResult(addr, resp.ext_fields.get(wire.HA_SERVER_ADDR) or None,
                                  resp.ext_fields.get(wire.MASTER_ADDR) or None)

        results = await asyncio.gather(*(one(a) for a in namesrv_addrs))
        return [r for r in results if r is not None]

    async def unregister_broker_all(self, namesrv_addrs: list[str], *, cluster_name: str, broker_addr: str,
                                    broker_name: str, broker_id: int) -> None:
        ext = {wire.BROKER_ADDR: broker_addr, wire.BROKER_ID: str(broker_id),
               wire.BROKER_NAME: broker_name, wire.CLUSTER_NAME: cluster_name}
        for addr in namesrv_addrs:
            try:
                await self.client.invoke(addr, RemotingCommand(RequestCode.UNREGISTER_BROKER,
                                                               ext_fields=dict(ext)), self.timeout)
            except RemotingError as exc:
                log.warning("unregister from nameserver %s failed: %s", addr, exc)

    async def _to_master(self, master_addr: str, code: RequestCode, ext: dict[str, str]) -> RemotingCommand:
        """One request to the master, signed with aclAccessKey when configured; its answer."""
        if self.credentials is not None:
            sign(ext, b"", *self.credentials)
        try:
            return await self.client.invoke(master_addr, RemotingCommand(code, ext_fields=ext), self.timeout)
        except RemotingError as exc:
            raise OuterApiError(f"request {int(code)} to master {master_addr} failed: {exc}") from exc

    async def get_all(self, master_addr: str, code: RequestCode) -> bytes:
        """Body of a GET_ALL_* request to the master (topics 21, offsets 43, delay 45, groups 201)."""
        resp = await self._to_master(master_addr, code, {})
        if resp.code != ResponseCode.SUCCESS:
            raise OuterApiError(f"master {master_addr} answered {int(code)} with {resp.code}: {resp.remark}")
        return bytes(resp.body)

    async def update_consumer_offset(self, master_addr: str, group: str, topic: str, queue_id: int,
                                     offset: int) -> None:
        """UPDATE_CONSUMER_OFFSET to the master, as a stock consumer sends it."""
        resp = await self._to_master(master_addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
            wire.CONSUMER_GROUP: group, wire.TOPIC: topic, wire.QUEUE_ID: str(queue_id),
            wire.COMMIT_OFFSET: str(offset)})
        if resp.code != ResponseCode.SUCCESS:
            raise OuterApiRefused(f"master {master_addr} refused an offset update: {resp.code} {resp.remark}")

    async def close(self) -> None:
        await self.client.close()
