"""Nameserver request handling: registration, routes, cluster info (reference §2.15-§2.17), the KV
config requests (PUT/GET/DELETE_KV_CONFIG, GET_KVLIST_BY_NAMESPACE), the admin tools' topic lists
(by cluster, system, unit flags) and the nameserver's config (read only)."""

from __future__ import annotations

import json
import logging
import struct
import zlib
from collections.abc import Callable
from typing import Any

from rmqbroker.inflate import inflate
from rmqbroker.metadata.errors import MetadataPersistError
from rmqbroker.metadata.jsonfile import fastjson_loads
from rmqbroker.namesrv.kvconfig import ORDER_TOPIC_CONFIG, KVConfigStore
from rmqbroker.namesrv.routeinfo import RouteInfoManager, TopicConfigLite
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import Connection, RemotingServer
from rmqbroker.remoting.wire import Header

log = logging.getLogger(__name__)

_INT = struct.Struct(">i")


# Answer to UPDATE_NAMESRV_CONFIG: every option is read once at start-up (flags / environment).
UPDATE_CONFIG_REFUSED = (
    "this nameserver's config cannot be changed at run time: nothing was changed; restart rmq-namesrv "
    "with other start-up options (--listen, --kv-config-path, --order-message-enable, "
    "--broker-expiry-seconds, --scan-interval-seconds or their RMQ_NAMESRV_* environment variables)")


def properties_text(props: dict[str, str]) -> str:
    """``key=value`` lines as Java's MixAll.properties2String writes them (keys sorted here)."""
    return "".join(f"{key}={value}\n" for key, value in sorted(props.items()))


# What a compressed registration may inflate to: a broker's topics in Java's compact form (about 40
# bytes each), far more than any broker holds, yet bounded (a few kilobytes of zeros inflate to gigabytes).
MAX_REGISTER_BODY = 64 * 1024 * 1024


class RegisterBodyError(ValueError):
    """A REGISTER_BROKER body that cannot be decoded."""


def _json_body(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _topics_from_table(table: dict[str, Any]) -> list[TopicConfigLite]:
    topics = []
    for name, tc in table.items():
        if not isinstance(tc, dict):
            raise RegisterBodyError(f"topic config of {name!r} is not an object")
        topics.append(TopicConfigLite(
            name=str(tc.get("topicName", name)),
            read_queue_nums=int(tc.get("readQueueNums", 16)),
            write_queue_nums=int(tc.get("writeQueueNums", 16)),
            perm=int(tc.get("perm", 6)),
            topic_sys_flag=int(tc.get("topicSysFlag", tc.get("topicSynFlag")) or 0),
        ))
    return topics


def decode_register_body(body: bytes, compressed: bool) -> tuple[dict[str, Any] | None, list[TopicConfigLite]]:
    """Return (dataVersion, topics) from a RegisterBrokerBody, plain JSON or compressed."""
    if not body:
        return None, []
    try:
        if compressed:
            return _decode_compressed(inflate(body, MAX_REGISTER_BODY))
        obj = fastjson_loads(body.decode("utf-8"))
        wrapper = obj.get("topicConfigSerializeWrapper", obj) if isinstance(obj, dict) else None
        if not isinstance(wrapper, dict):
            raise RegisterBodyError("body has no topicConfigSerializeWrapper")
        table = wrapper.get("topicConfigTable") or {}
        version = wrapper.get("dataVersion")
        if not isinstance(table, dict) or (version is not None and not isinstance(version, dict)):
            raise RegisterBodyError("topicConfigTable/dataVersion have the wrong type")
        return version, _topics_from_table(table)
    except (ValueError, UnicodeDecodeError, struct.error, TypeError) as exc:
        if isinstance(exc, RegisterBodyError):
            raise
        raise RegisterBodyError(f"cannot decode register body: {exc}") from exc


def _decode_compressed(raw: bytes) -> tuple[dict[str, Any] | None, list[TopicConfigLite]]:
    # Layout (Java RegisterBrokerBody.encode): int len + DataVersion JSON; int topicCount;
    # per topic int len + "name read write perm filterType [sysFlag order]"; int len + filter list.
    pos = 0

    def take() -> bytes:
        nonlocal pos
        (n,) = _INT.unpack_from(raw, pos)
        pos += 4
        if n < 0 or pos + n > len(raw):
            raise RegisterBodyError("compressed register body truncated")
        chunk = raw[pos:pos + n]
        pos += n
        return chunk

    version = fastjson_loads(take().decode("utf-8"))
    (count,) = _INT.unpack_from(raw, pos)
    pos += 4
    topics = []
    for _ in range(count):
        parts = take().decode("utf-8").split(" ")
        if len(parts) < 4:
            raise RegisterBodyError("compressed topic config has too few fields")
        topics.append(TopicConfigLite(parts[0], int(parts[1]), int(parts[2]), int(parts[3]),
                                      int(parts[5]) if len(parts) > 5 else 0))
    return (version if isinstance(version, dict) else None), topics


def _topic_list(cmd: RemotingCommand, topics: list[str], broker_addr: str | None = None) -> RemotingCommand:
    # Java's TopicList; fastjson leaves a null brokerAddr out.
    body: dict[str, Any] = {"topicList": topics}
    if broker_addr is not None:
        body["brokerAddr"] = broker_addr
    return cmd.make_response(ResponseCode.SUCCESS, body=_json_body(dict(sorted(body.items()))))


class NamesrvProcessor:
    """Registers the nameserver's handlers on a remoting server."""

    def __init__(self, routes: RouteInfoManager, kv: KVConfigStore | None = None,
                 order_message_enable: bool = False,
                 config: Callable[[], dict[str, str]] | None = None) -> None:
        self.routes = routes
        # The nameserver's options as Java property names -> text, asked per request: the listen
        # port is known only once the server is bound.
        self.config = config if config is not None else dict
        self.kv = kv if kv is not None else KVConfigStore(None)
        # Java's NamesrvConfig.orderMessageEnable: routes carry the topic's ORDER_TOPIC_CONFIG entry.
        self.order_message_enable = order_message_enable
        # Connections whose close already drops their brokers: a broker re-registers on the same
        # connection every registerNameServerPeriod, and one callback per registration would grow
        # the connection's callback list for as long as it lives.
        self._watched: set[int] = set()

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.REGISTER_BROKER, self.register_broker)
        server.register(RequestCode.UNREGISTER_BROKER, self.unregister_broker)
        server.register(RequestCode.QUERY_DATA_VERSION, self.query_data_version)
        server.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self.get_route)
        server.register(RequestCode.GET_BROKER_CLUSTER_INFO, self.get_cluster_info)
        server.register(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self.get_all_topics)
        server.register(RequestCode.DELETE_TOPIC_IN_NAMESRV, self.delete_topic)
        server.register(RequestCode.WIPE_WRITE_PERM_OF_BROKER, self.wipe_write_perm)
        server.register(RequestCode.ADD_WRITE_PERM_OF_BROKER, self.add_write_perm)
        server.register(RequestCode.PUT_KV_CONFIG, self.put_kv_config)
        server.register(RequestCode.GET_KV_CONFIG, self.get_kv_config)
        server.register(RequestCode.DELETE_KV_CONFIG, self.delete_kv_config)
        server.register(RequestCode.GET_KVLIST_BY_NAMESPACE, self.get_kv_list_by_namespace)
        server.register(RequestCode.GET_TOPICS_BY_CLUSTER, self.get_topics_by_cluster)
        server.register(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS, self.get_system_topics)
        server.register(RequestCode.GET_UNIT_TOPIC_LIST, self.get_unit_topics)
        server.register(RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST, self.get_has_unit_sub_topics)
        server.register(RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST, self.get_has_unit_sub_ununit_topics)
        server.register(RequestCode.GET_NAMESRV_CONFIG, self.get_config)
        server.register(RequestCode.UPDATE_NAMESRV_CONFIG, self.update_config)

    async def register_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        broker_addr = h.req_str(wire.BROKER_ADDR)
        broker_id = h.req_int(wire.BROKER_ID)
        body = bytes(cmd.body)
        crc = h.opt_int(wire.BODY_CRC32, 0)
        if crc != 0 and (zlib.crc32(body) & 0x7FFFFFFF) != crc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        try:
            version, topics = decode_register_body(body, h.opt_bool(wire.COMPRESSED))
        except RegisterBodyError as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, str(exc))
        result = self.routes.register_broker(
            cluster_name=h.req_str(wire.CLUSTER_NAME),
            broker_addr=broker_addr,
            broker_name=h.req_str(wire.BROKER_NAME),
            broker_id=broker_id,
            ha_server_addr=h.opt_str(wire.HA_SERVER_ADDR) or "",
            data_version=version,
            topics=topics if body else None,
            connection_id=conn.id,
            epoch=epoch if (epoch := h.opt_int(wire.EPOCH, -1, 0)) >= 0 else None,
        )
        if conn.id not in self._watched:
            self._watched.add(conn.id)
            conn.on_close(self._connection_closed)
        ext: dict[str, str] = {}
        if result.ha_server_addr is not None:
            ext[wire.HA_SERVER_ADDR] = result.ha_server_addr
        if result.master_addr is not None:
            ext[wire.MASTER_ADDR] = result.master_addr
        # As Java: the order configuration of topics, which a Java broker applies to its topics' order flag.
        order_conf = self.kv.namespace(ORDER_TOPIC_CONFIG)
        body_out = _json_body({"table": order_conf}) if order_conf else b""
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields=ext, body=body_out)

    def _connection_closed(self, conn: Connection) -> None:
        self._watched.discard(conn.id)
        self.routes.on_connection_closed(conn.id)

    async def unregister_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        self.routes.unregister_broker(
            cluster_name=h.req_str(wire.CLUSTER_NAME), broker_addr=h.req_str(wire.BROKER_ADDR),
            broker_name=h.req_str(wire.BROKER_NAME), broker_id=h.req_int(wire.BROKER_ID))
        return cmd.make_response(ResponseCode.SUCCESS)

    async def query_data_version(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        try:
            version = fastjson_loads(bytes(cmd.body).decode("utf-8")) if cmd.body else {}
        except (ValueError, UnicodeDecodeError) as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"bad DataVersion body: {exc}")
        changed, stored = self.routes.query_data_version_changed(
            h.req_str(wire.BROKER_ADDR), version if isinstance(version, dict) else {})
        return cmd.make_response(ResponseCode.SUCCESS,
                                 ext_fields={wire.CHANGED: "true" if changed else "false"},
                                 body=_json_body(stored) if stored is not None else b"")

    async def delete_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Drop a topic's route (mqadmin deleteTopic, after deleting it on the brokers): a broker's
        registration only adds routes. With ``clusterName`` (5.x), only that cluster's brokers."""
        h = Header(cmd.ext_fields)
        self.routes.delete_topic(h.req_str(wire.TOPIC), h.opt_str(wire.CLUSTER_NAME) or None)
        return cmd.make_response(ResponseCode.SUCCESS)

    async def wipe_write_perm(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Producers stop sending to a broker (they follow routes), e.g. before maintenance."""
        name = Header(cmd.ext_fields).req_str(wire.BROKER_NAME)
        count = self.routes.set_write_perm(name, writable=False)
        log.info("write permission of broker %s wiped in %d topic route(s)", name, count)
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields={wire.WIPE_TOPIC_COUNT: str(count)})

    async def add_write_perm(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        name = Header(cmd.ext_fields).req_str(wire.BROKER_NAME)
        count = self.routes.set_write_perm(name, writable=True)
        log.info("write permission of broker %s restored in %d topic route(s)", name, count)
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields={wire.ADD_TOPIC_COUNT: str(count)})

    async def get_route(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = Header(cmd.ext_fields).req_str(wire.TOPIC)
        route = self.routes.pick_topic_route(topic)
        if route is None:
            return cmd.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic}")
        if self.order_message_enable:
            order_conf = self.kv.get(ORDER_TOPIC_CONFIG, topic)
            if order_conf is not None:  # Java leaves a null orderTopicConf out
                route = dict(sorted({**route, "orderTopicConf": order_conf}.items()))
        return cmd.make_response(ResponseCode.SUCCESS, body=_json_body(route))

    async def get_cluster_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(ResponseCode.SUCCESS, body=_json_body(self.routes.cluster_info()))

    async def get_all_topics(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(ResponseCode.SUCCESS,
                                 body=_json_body({"topicList": self.routes.all_topics()}))

    async def get_topics_by_cluster(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin / Dashboard: the topics on a cluster's brokers (an unknown cluster has none)."""
        cluster = Header(cmd.ext_fields).req_str(wire.CLUSTER)
        return _topic_list(cmd, self.routes.topics_by_cluster(cluster))

    async def get_system_topics(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topics, broker_addr = self.routes.system_topic_list()
        return _topic_list(cmd, topics, broker_addr)

    async def get_unit_topics(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return _topic_list(cmd, self.routes.topics_by_sys_flag(unit=True, unit_sub=None))

    async def get_has_unit_sub_topics(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return _topic_list(cmd, self.routes.topics_by_sys_flag(unit=None, unit_sub=True))

    async def get_has_unit_sub_ununit_topics(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return _topic_list(cmd, self.routes.topics_by_sys_flag(unit=False, unit_sub=True))

    async def get_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin getNamesrvConfig: the options in Java's properties text."""
        return cmd.make_response(ResponseCode.SUCCESS, body=properties_text(self.config()).encode("utf-8"))

    async def update_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Refused: answering SUCCESS would claim a change that never happens. NO_PERMISSION is
        Java's answer for options it will not change at run time (its configBlackList)."""
        log.warning("UPDATE_NAMESRV_CONFIG from %s refused: the config is fixed at start-up", conn.remote_addr)
        return cmd.make_response(ResponseCode.NO_PERMISSION, UPDATE_CONFIG_REFUSED)

    async def put_kv_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        namespace, key, value = h.req_str(wire.NAMESPACE), h.req_str(wire.KEY), h.req_str(wire.VALUE)
        try:
            await self.kv.put(namespace, key, value)
        except MetadataPersistError as exc:
            log.error("KV config put of namespace %s key %s not saved: %s", namespace, key, exc)
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"KV config not saved: {exc}")
        return cmd.make_response(ResponseCode.SUCCESS)

    async def get_kv_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        namespace, key = h.req_str(wire.NAMESPACE), h.req_str(wire.KEY)
        value = self.kv.get(namespace, key)
        if value is None:
            return cmd.make_response(ResponseCode.QUERY_NOT_FOUND,
                                     f"No config item, Namespace: {namespace} Key: {key}")
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields={wire.VALUE: value})

    async def delete_kv_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """SUCCESS whether or not the entry existed, as Java."""
        h = Header(cmd.ext_fields)
        namespace, key = h.req_str(wire.NAMESPACE), h.req_str(wire.KEY)
        try:
            await self.kv.delete(namespace, key)
        except MetadataPersistError as exc:
            log.error("KV config delete of namespace %s key %s not saved: %s", namespace, key, exc)
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"KV config not saved: {exc}")
        return cmd.make_response(ResponseCode.SUCCESS)

    async def get_kv_list_by_namespace(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        namespace = Header(cmd.ext_fields).req_str(wire.NAMESPACE)
        table = self.kv.namespace(namespace)
        if table is None:
            return cmd.make_response(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        return cmd.make_response(ResponseCode.SUCCESS, body=_json_body({"table": dict(sorted(table.items()))}))
