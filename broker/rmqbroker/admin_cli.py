"""``rmq-admin``: topic, consumer-group and message administration over the remoting protocol,
named and optioned after RocketMQ's ``mqadmin`` (see ``COMMANDS``), so that a broker group can be
managed without a Java toolchain. It works against Java brokers too: only RocketMQ request codes
are used."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import time
from collections.abc import Sequence
from typing import Any

from rmqbroker.acl import sign
from rmqbroker.metadata.jsonfile import MessageQueue, fastjson_loads, loads_mq_keyed, loads_with_mq_keys
from rmqbroker.metadata.subscription_groups import SubscriptionGroupConfig
from rmqbroker.namesrv.kvconfig import ORDER_TOPIC_CONFIG
from rmqbroker.remoting import tls, wire
from rmqbroker.remoting.client import RemotingClient, RemotingClosedError, RemotingError
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.store.errors import CorruptRecordError, MessageIdError
from rmqbroker.store.record import KEYS, UNIQ_KEY, MessageRecord, decode_offset_msg_id, decode_record, iter_records

TIMEOUT = 5.0


class AdminError(Exception):
    """A request failed; the message says which and why. ``done``: the output of what did succeed
    before it (printed ahead of the error)."""

    def __init__(self, message: str, done: str | None = None) -> None:
        super().__init__(message)
        self.done = done


class Admin:
    """Requests to nameservers and brokers on one client."""

    def __init__(self, namesrv: str | None, credentials: tuple[str, str] | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.namesrvs = [a.strip() for a in (namesrv or "").split(";") if a.strip()]
        self.credentials = credentials
        self.client = RemotingClient(ssl_context=ssl_context)
        self.tls = ssl_context is not None

    async def call(self, addr: str, code: int, ext: dict[str, str] | None = None, body: bytes = b"",
                   ok: tuple[int, ...] = (ResponseCode.SUCCESS,), timeout: float = TIMEOUT) -> RemotingCommand:
        fields = dict(ext or {})
        if self.credentials is not None:
            sign(fields, body, *self.credentials)  # for brokers with the plain ACL on
        try:
            resp = await self.client.invoke(addr, RemotingCommand(code, ext_fields=fields, body=body), timeout)
        except RemotingError as exc:
            # A server in TLS enforcing mode closes a plain connection without a word.
            hint = (" before answering: if it serves TLS only, add --tls"
                    if isinstance(exc, RemotingClosedError) and not self.tls else "")
            raise AdminError(f"{addr}: {exc}{hint}") from exc
        if resp.code not in ok:
            raise AdminError(f"{addr}: request {code} failed with code {resp.code}: {resp.remark}")
        return resp

    async def mq_table(self, addr: str, code: int, ext: dict[str, str]) -> tuple[dict[str, Any],
                                                                                  dict[MessageQueue, Any]]:
        """A TopicStatsTable / ConsumeStats answer: the document and its offsetTable by queue."""
        resp = await self.call(addr, code, ext)
        try:
            return loads_mq_keyed(bytes(resp.body), "offsetTable")
        except ValueError as exc:
            raise AdminError(f"{addr}: unreadable answer to request {code}: {exc}") from exc

    def require_namesrvs(self) -> list[str]:
        if not self.namesrvs:
            raise AdminError("no nameserver: give -n host:port (or set NAMESRV_ADDR)")
        return self.namesrvs

    async def namesrv_call(self, code: int, ext: dict[str, str] | None = None,
                           ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        errors = []
        for addr in self.require_namesrvs():
            try:
                return await self.call(addr, code, ext, ok=ok)
            except AdminError as exc:
                errors.append(str(exc))
        raise AdminError("; ".join(errors))

    async def cluster_info(self) -> dict[str, Any]:
        resp = await self.namesrv_call(RequestCode.GET_BROKER_CLUSTER_INFO)
        info: dict[str, Any] = fastjson_loads(bytes(resp.body)) if resp.body else {}
        return info

    async def masters(self, cluster: str | None, *, reads: bool = False) -> dict[str, str]:
        """brokerName -> master address, for one cluster or all. ``reads``: the address a read goes
        to instead, the master else a slave (a group whose master is down still answers reads)."""
        info = await self.cluster_info()
        names = info.get("clusterAddrTable", {}).get(cluster, []) if cluster else list(info.get("brokerAddrTable", {}))
        if cluster and not names:
            raise AdminError(f"cluster {cluster} not found on the nameserver")
        out = {}
        for name in names:
            addrs = info.get("brokerAddrTable", {}).get(name, {}).get("brokerAddrs", {})
            addr = _read_addr(addrs) if reads else addrs.get("0")
            if addr:
                out[name] = addr
        return out

    async def brokers(self, cluster: str) -> list[str]:
        """Every broker address of a cluster, masters and slaves."""
        info = await self.cluster_info()
        names = info.get("clusterAddrTable", {}).get(cluster, [])
        if not names:
            raise AdminError(f"cluster {cluster} not found on the nameserver")
        table = info.get("brokerAddrTable", {})
        return sorted(addr for name in names for addr in table.get(name, {}).get("brokerAddrs", {}).values())

    async def route(self, topic: str) -> dict[str, Any]:
        """The nameserver's TopicRouteData of ``topic``."""
        resp = await self.namesrv_call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {wire.TOPIC: topic},
                                       ok=(ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST))
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            raise AdminError(f"topic {topic} has no route on the nameserver")
        route: dict[str, Any] = fastjson_loads(bytes(resp.body))
        return route

    async def route_readers(self, topic: str) -> dict[str, str]:
        """brokerName -> the address a read goes to: the master, else a slave (selectBrokerAddr)."""
        out = {}
        for b in (await self.route(topic)).get("brokerDatas", []):
            addr = _read_addr(b.get("brokerAddrs", {}))
            if addr:
                out[b["brokerName"]] = addr
        return out

    async def route_masters(self, topic: str) -> dict[str, str]:
        return _masters_of((await self.route(topic)).get("brokerDatas", []))

    async def targets(self, args: argparse.Namespace) -> dict[str, str]:
        """The brokers a write goes to: ``-b`` one broker, or ``-c`` every master of a cluster."""
        if args.broker:
            return {args.broker: args.broker}
        if args.cluster:
            return await self.masters(args.cluster)
        raise AdminError("give -b brokerAddr or -c clusterName")


def _masters_of(broker_datas: list[dict[str, Any]]) -> dict[str, str]:
    """brokerName -> master address of a route's brokerDatas (groups without a master left out)."""
    return {b["brokerName"]: b["brokerAddrs"]["0"] for b in broker_datas if "0" in b.get("brokerAddrs", {})}


def _read_addr(addrs: dict[str, str]) -> str | None:
    """Of a route's brokerAddrs (id -> address): the master, else the lowest slave (selectBrokerAddr)."""
    return addrs.get("0") or next((addrs[k] for k in sorted(addrs, key=int)), None)


def _bool(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")
    return value.lower() == "true"


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms > 0 else "-"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


# ------------------------------------------------------------------------------------ commands
async def cluster_list(admin: Admin, args: argparse.Namespace) -> str:
    """mqadmin clusterList: every broker of every cluster, with mqadmin's load columns from each
    broker's runtime info (blank for a broker that does not answer)."""
    info = await admin.cluster_info()
    brokers = info.get("brokerAddrTable", {})
    listed = [(cluster, name, str(bid), addr)
              for cluster, names in sorted(info.get("clusterAddrTable", {}).items()) for name in sorted(names)
              for bid, addr in sorted(brokers.get(name, {}).get("brokerAddrs", {}).items(), key=lambda kv: int(kv[0]))]
    tables = await asyncio.gather(*(_runtime_table(admin, entry[3]) for entry in listed))
    rows = [["#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#InTPS(LOAD)", "#OutTPS(LOAD)",
             "#PCWait(ms)", "#Hour", "#SPACE"]]
    for entry, table in zip(listed, tables, strict=True):
        rows.append([*entry, *_load_columns(table)])
    return _table(rows)


async def _runtime_table(admin: Admin, addr: str) -> dict[str, str] | None:
    try:
        resp = await admin.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        table: dict[str, str] = fastjson_loads(bytes(resp.body)).get("table", {}) if resp.body else {}
    except (AdminError, OSError, ValueError, AttributeError):
        return None
    return table


def _load_columns(table: dict[str, str] | None) -> list[str]:
    """mqadmin's Version, InTPS(LOAD), OutTPS(LOAD), PCWait, Hour (age of the oldest message) and
    SPACE (commitlog disk used) columns."""
    if table is None:
        return ["-"] * 6

    def first_tps(key: str) -> float:
        try:
            return float(table.get(key, "").split(" ")[0])
        except ValueError:
            return 0.0

    def load(tps_key: str, pool: str) -> str:
        return (f"{first_tps(tps_key):.2f}({table.get(pool + 'ThreadPoolQueueSize', '0')},"
                f"{table.get(pool + 'ThreadPoolQueueHeadWaitTimeMills', '0')}ms)")

    earliest = int(table.get("earliestMessageTimeStamp", "-1") or -1)
    hours = (time.time() * 1000 - earliest) / 3_600_000 if earliest > 0 else 0.0
    try:
        space = f"{float(table.get('commitLogDiskRatio', '')):.4f}"
    except ValueError:
        space = "-"
    return [table.get("brokerVersionDesc", "-"), load("putTps", "send"), load("getTransferedTps", "pull"),
            table.get("pageCacheLockTimeMills", "-"), f"{hours:.2f}", space]


async def update_topic(admin: Admin, args: argparse.Namespace) -> str:
    ext = {wire.TOPIC: args.topic, wire.DEFAULT_TOPIC: "TBW102", wire.READ_QUEUE_NUMS: str(args.read_queue_nums),
           wire.WRITE_QUEUE_NUMS: str(args.write_queue_nums), wire.PERM: str(args.perm),
           wire.TOPIC_FILTER_TYPE: "SINGLE_TAG", wire.TOPIC_SYS_FLAG: "0", wire.ORDER: str(args.order).lower()}
    out = []
    for _name, addr in sorted((await admin.targets(args)).items()):
        await admin.call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
        out.append(f"create topic {args.topic} to {addr} success.")
    return "\n".join(out)


async def delete_topic(admin: Admin, args: argparse.Namespace) -> str:
    masters = await admin.masters(args.cluster)
    out = []
    for _name, addr in sorted(masters.items()):
        await admin.call(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {wire.TOPIC: args.topic})
        out.append(f"delete topic [{args.topic}] from broker {addr} success.")
    for ns in admin.namesrvs:
        await admin.call(ns, RequestCode.DELETE_TOPIC_IN_NAMESRV, {wire.TOPIC: args.topic,
                                                                  wire.CLUSTER_NAME: args.cluster})
        out.append(f"delete topic [{args.topic}] from NameServer {ns} success.")
    return "\n".join(out)


async def topic_status(admin: Admin, args: argparse.Namespace) -> str:
    rows = [["#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated"]]
    # As mqadmin (selectBrokerAddr): a group whose master is down is read from a slave.
    for _name, addr in sorted((await admin.route_readers(args.topic)).items()):
        _, table = await admin.mq_table(addr, RequestCode.GET_TOPIC_STATS_INFO, {wire.TOPIC: args.topic})
        for (_topic, broker, qid), v in sorted(table.items()):
            rows.append([broker, str(qid), str(v["minOffset"]), str(v["maxOffset"]), _when(v["lastUpdateTimestamp"])])
    return _table(rows)


async def update_sub_group(admin: Admin, args: argparse.Namespace) -> str:
    body = json.dumps(SubscriptionGroupConfig(
        group_name=args.group, consume_enable=args.consume_enable, consume_from_min_enable=args.from_min,
        consume_broadcast_enable=args.broadcast, retry_queue_nums=args.retry_queue_nums,
        retry_max_times=args.retry_max_times, broker_id=args.broker_id,
        which_broker_when_consume_slowly=args.which_broker, notify_consumer_ids_changed_enable=args.notify,
    ).to_json_obj()).encode()
    out = []
    for _name, addr in sorted((await admin.targets(args)).items()):
        await admin.call(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
        out.append(f"create subscription group to {addr} success.")
    return "\n".join(out)


async def delete_sub_group(admin: Admin, args: argparse.Namespace) -> str:
    out = []
    for _name, addr in sorted((await admin.targets(args)).items()):
        await admin.call(addr, RequestCode.DELETE_SUBSCRIPTIONGROUP,
                         {wire.GROUP_NAME: args.group, wire.REMOVE_OFFSET: str(args.remove_offset).lower()})
        out.append(f"delete subscription group [{args.group}] from broker [{addr}] success.")
    return "\n".join(out)


async def consumer_progress(admin: Admin, args: argparse.Namespace) -> str:
    # A group whose master is down is read from a slave, whose offsets trail by a sync period.
    brokers = await admin.route_readers(args.topic) if args.topic else await admin.masters(None, reads=True)
    ext = {wire.CONSUMER_GROUP: args.group, **({wire.TOPIC: args.topic} if args.topic else {})}
    rows = [["#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff", "#LastTime"]]
    tps = 0.0
    total = 0
    for _name, addr in sorted(brokers.items()):
        stats, table = await admin.mq_table(addr, RequestCode.GET_CONSUME_STATS, ext)
        tps += float(stats.get("consumeTps", 0.0))
        for (topic, broker, qid), v in sorted(table.items()):
            diff = int(v["brokerOffset"]) - int(v["consumerOffset"])
            total += diff
            rows.append([topic, broker, str(qid), str(v["brokerOffset"]), str(v["consumerOffset"]), str(diff),
                         _when(int(v["lastTimestamp"]))])
    return f"{_table(rows)}\n\nConsume TPS: {tps:.2f}\nDiff Total: {total}"


async def _broker_stats(admin: Admin, addr: str, name: str, key: str) -> dict[str, Any] | None:
    """A broker's BrokerStatsData of one stats item; None when it has none (mqadmin skips those)."""
    try:
        resp = await admin.call(addr, RequestCode.VIEW_BROKER_STATS_DATA, {wire.STATS_NAME: name, wire.STATS_KEY: key})
        data = fastjson_loads(bytes(resp.body))
    except (AdminError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _stat(data: dict[str, Any], window: str, field: str) -> float:
    value = (data.get(window) or {}).get(field, 0)
    return float(value) if isinstance(value, int | float) else 0.0


def _sum_24h(data: dict[str, Any]) -> int:
    """mqadmin's "24 hour" count: the day window's sum, else the hour's, else the minute's."""
    return next((int(s) for w in ("statsDay", "statsHour", "statsMinute") if (s := _stat(data, w, "sum"))), 0)


async def _topic_diff(admin: Admin, group: str, topic: str, masters: list[str]) -> int:
    """A group's backlog on a topic over its masters (ConsumeStats.computeTotalDiff, never negative)."""
    total = 0
    for addr in masters:
        try:
            _, table = await admin.mq_table(addr, RequestCode.GET_CONSUME_STATS,
                                            {wire.CONSUMER_GROUP: group, wire.TOPIC: topic})
        except AdminError:
            continue
        total += sum(int(v["brokerOffset"]) - int(v["consumerOffset"]) for v in table.values())
    return max(total, 0)


async def _topic_stats_lines(admin: Admin, topic: str, active_only: bool) -> list[str]:
    """mqadmin statsAll's lines of one topic: a line per consuming group (or NO_CONSUMER)."""
    route = await admin.route(topic)
    masters = [b["brokerAddrs"]["0"] for b in route.get("brokerDatas", []) if "0" in b.get("brokerAddrs", {})]
    _, groups = await _topic_cluster_and_groups(admin, topic, {})
    in_tps, in_24h = 0.0, 0
    for addr in masters:
        if (data := await _broker_stats(admin, addr, "TOPIC_PUT_NUMS", topic)) is not None:
            in_tps += _stat(data, "statsMinute", "tps")
            in_24h += _sum_24h(data)
    name = topic[:64]  # mqadmin's frontStringAtLeast: cut to 64
    if not groups:
        if active_only and in_24h <= 0:
            return []
        return [f"{name:<64}  {'':<64} {0:>12d} {in_tps:>11.2f} {'':>11} {in_24h:>14d} {'NO_CONSUMER':>14}"]
    lines = []
    for group in groups:
        out_tps, out_24h = 0.0, 0
        for addr in masters:
            if (data := await _broker_stats(admin, addr, "GROUP_GET_NUMS", f"{topic}@{group}")) is not None:
                out_tps += _stat(data, "statsMinute", "tps")
                out_24h += _sum_24h(data)
        diff = await _topic_diff(admin, group, topic, masters)
        if not active_only or in_24h > 0 or out_24h > 0:
            lines.append(f"{name:<64}  {group[:64]:<64} {diff:>12d} {in_tps:>11.2f} {out_tps:>11.2f} "
                         f"{in_24h:>14d} {out_24h:>14d}")
    return lines


async def stats_all(admin: Admin, args: argparse.Namespace) -> str:
    """mqadmin statsAll: per topic and consuming group, the backlog, put and get TPS over the last
    minute and messages in the last 24 hours (VIEW_BROKER_STATS_DATA on each master), in mqadmin's
    columns. Retry and DLQ topics are left out; a topic whose figures cannot be read is skipped."""
    resp = await admin.namesrv_call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    topics = sorted(fastjson_loads(bytes(resp.body)).get("topicList", []) if resp.body else [])
    lines = [f"{'#Topic':<64}  {'#Consumer Group':<64} {'#Accumulation':>12} {'#InTPS':>11} {'#OutTPS':>11} "
             f"{'#InMsg24Hour':>14} {'#OutMsg24Hour':>14}"]
    for topic in topics:
        if topic.startswith(("%RETRY%", "%DLQ%")) or (args.topic and topic != args.topic):
            continue
        try:
            lines += await _topic_stats_lines(admin, topic, args.active)
        except AdminError:
            continue
    return "\n".join(lines)


async def broker_consume_stats(admin: Admin, args: argparse.Namespace) -> str:
    """mqadmin brokerConsumeStats: every group's progress on one broker (GET_BROKER_CONSUME_STATS),
    the queues it has consumed from whose backlog is at least ``-l``, and the broker's total."""
    resp = await admin.call(args.broker, RequestCode.GET_BROKER_CONSUME_STATS,
                            {wire.IS_ORDER: str(args.order).lower()}, timeout=args.timeout_millis / 1000)
    try:
        doc, queues = loads_with_mq_keys(bytes(resp.body))
        groups = [(group, list(stats)) for entry in doc.get("consumeStatsList", []) for group, stats in entry.items()]
    except (ValueError, AttributeError, TypeError) as exc:
        raise AdminError(f"{args.broker}: unreadable ConsumeStatsList: {exc}") from exc
    lines = [f"{'#Topic':<64}  {'#Group':<64}  {'#Broker Name':<32}  {'#QID':<4}  {'#Broker Offset':<20}  "
             f"{'#Consumer Offset':<20}  {'#Diff':<20}  #LastTime"]
    for group, stats_list in groups:
        for stats in stats_list:
            table = {queues[int(k)]: v for k, v in stats.get("offsetTable", {}).items()}
            for (topic, broker, qid), v in sorted(table.items()):
                diff = int(v["brokerOffset"]) - int(v["consumerOffset"])
                # As in mqadmin: below the level, or never consumed (no last time), a queue is not shown.
                if diff < args.level or int(v.get("lastTimestamp", 0)) <= 0:
                    continue
                lines.append(f"{topic[:64]:<64}  {group:<64}  {broker[:32]:<32}  {qid:<4d}  {v['brokerOffset']:<20d}  "
                             f"{v['consumerOffset']:<20d}  {diff:<20d}  {_when(int(v['lastTimestamp']))}")
    return "\n".join(lines) + f"\n\nDiff Total: {int(doc.get('totalDiff', 0))}"


async def _broker_addrs(admin: Admin, args: argparse.Namespace) -> list[str]:
    """``-b`` one broker, or ``-c`` every broker (masters and slaves) of a cluster."""
    return [args.broker] if args.broker else await admin.brokers(args.cluster)


async def delete_expired_commit_log(admin: Admin, args: argparse.Namespace) -> str:
    return await _each_broker(admin, args, RequestCode.DELETE_EXPIRED_COMMITLOG)


async def clean_expired_cq(admin: Admin, args: argparse.Namespace) -> str:
    return await _each_broker(admin, args, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE)


async def clean_unused_topic(admin: Admin, args: argparse.Namespace) -> str:
    return await _each_broker(admin, args, RequestCode.CLEAN_UNUSED_TOPIC)


async def _each_broker(admin: Admin, args: argparse.Namespace, code: int, ext: dict[str, str] | None = None) -> str:
    """Send ``code`` (with ``ext`` as its header) to each broker ``-b``/``-c`` names; its remark per broker."""
    out = []
    for addr in await _broker_addrs(admin, args):
        resp = await admin.call(addr, code, ext)
        out.append(f"{addr}: {resp.remark or 'success'}")
    return "\n".join(out)


async def update_acl_config(admin: Admin, args: argparse.Namespace) -> str:
    ext = {wire.ACL_ACCESS_KEY: args.account, wire.ACL_ADMIN: "true" if args.admin else "false"}
    for name, value in ((wire.ACL_SECRET_KEY, args.account_secret), (wire.WHITE_REMOTE_ADDRESS, args.white),
                        (wire.DEFAULT_TOPIC_PERM, args.default_topic_perm),
                        (wire.DEFAULT_GROUP_PERM, args.default_group_perm), (wire.TOPIC_PERMS, args.topic_perms),
                        (wire.GROUP_PERMS, args.group_perms)):
        if value is not None:
            ext[name] = value
    return await _each_broker(admin, args, RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, ext)


async def delete_access_config(admin: Admin, args: argparse.Namespace) -> str:
    return await _each_broker(admin, args, RequestCode.DELETE_ACL_CONFIG, {wire.ACL_ACCESS_KEY: args.account})


async def update_global_white_addr(admin: Admin, args: argparse.Namespace) -> str:
    return await _each_broker(admin, args, RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
                              {wire.GLOBAL_WHITE_ADDRS: args.addresses})


async def cluster_acl_config_version(admin: Admin, args: argparse.Namespace) -> str:
    out = [f"{'#Cluster Name':<20}  {'#Broker Name':<16}  {'#Broker Addr':<22}  {'#AclConfigVersionNum':<20}  "
           "#AclLastUpdateTime"]
    for addr in await _broker_addrs(admin, args):
        ext = (await admin.call(addr, RequestCode.GET_BROKER_CLUSTER_ACL_INFO)).ext_fields
        version = fastjson_loads(ext.get(wire.VERSION) or "{}")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(version.get("timestamp", 0)) / 1000))
        out.append(f"{ext.get(wire.CLUSTER_NAME, ''):<20}  {ext.get(wire.BROKER_NAME, ''):<16}  {addr:<22}  "
                   f"{version.get('counter', 0)!s:<20}  {stamp}")
    return "\n".join(out)


async def get_acl_config(admin: Admin, args: argparse.Namespace) -> str:
    out = []
    for addr in await _broker_addrs(admin, args):
        body = fastjson_loads(bytes((await admin.call(addr, RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG)).body) or b"{}")
        out.append(f"============{addr}============")
        out.append(f"globalWhiteAddrs: {', '.join(body.get('globalWhiteAddrs') or []) or '-'}")
        for account in body.get("plainAccessConfigs") or []:
            out.append(json.dumps(account, sort_keys=True))
    return "\n".join(out)


async def broker_status(admin: Admin, args: argparse.Namespace) -> str:
    out: list[str] = []
    for addr in await _broker_addrs(admin, args):
        resp = await admin.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        table = fastjson_loads(bytes(resp.body)).get("table", {}) if resp.body else {}
        prefix = f"{addr:<22}" if not args.broker else ""
        out.extend(f"{prefix}{k:<32}: {v}" for k, v in sorted(table.items()))
    return "\n".join(out)


async def get_broker_config(admin: Admin, args: argparse.Namespace) -> str:
    out = []
    for addr in await _broker_addrs(admin, args):
        resp = await admin.call(addr, RequestCode.GET_BROKER_CONFIG)
        out.append(f"============{addr}============")
        for line in bytes(resp.body).decode("utf-8", "replace").splitlines():
            key, _, value = line.partition("=")
            out.append(f"{key:<50}=  {value}")
    return "\n".join(out)


async def update_broker_config(admin: Admin, args: argparse.Namespace) -> str:
    """mqadmin updateBrokerConfig: one broker (``-b``), or every master of a cluster (``-c``; mqadmin
    leaves the slaves out too). The broker's remark (what applies now, what after a restart) follows
    mqadmin's success line; with ``-c`` a failing broker does not stop the others."""
    key, value = args.key.strip(), args.value.strip()
    body = f"{key}={value}\n".encode()
    addrs = [addr for _name, addr in sorted((await admin.targets(args)).items())]
    out: list[str] = []
    failed: list[str] = []
    for addr in addrs:
        try:
            resp = await admin.call(addr, RequestCode.UPDATE_BROKER_CONFIG, body=body)
        except AdminError as exc:
            failed.append(f"update broker config failed, {exc}")
            continue
        out.append(f"update broker config success, {addr}")
        if resp.remark:
            out.append(f"  {resp.remark}")
    if failed:
        raise AdminError("\n".join(out + failed))
    return "\n".join(out)


async def topic_list(admin: Admin, args: argparse.Namespace) -> str:
    resp = await admin.namesrv_call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    topics = sorted(fastjson_loads(bytes(resp.body)).get("topicList", []) if resp.body else [])
    if not args.cluster_model:
        return "\n".join(topics)
    # mqadmin topicList -c: each topic's cluster (that of the first broker of its route) and the
    # groups consuming it; retry and DLQ topics are left out, as there.
    clusters = (await admin.cluster_info()).get("clusterAddrTable", {})
    rows = [["#Cluster Name", "#Topic", "#Consumer Group"]]
    for topic in topics:
        if topic.startswith(("%RETRY%", "%DLQ%")):
            continue
        cluster, groups = await _topic_cluster_and_groups(admin, topic, clusters)
        rows.extend([cluster, topic, group] for group in groups or [""])
    return _table(rows)


async def _topic_cluster_and_groups(admin: Admin, topic: str,
                                    clusters: dict[str, list[str]]) -> tuple[str, list[str]]:
    """The cluster of the first broker of the topic's route, and the groups consuming the topic
    (QUERY_TOPIC_CONSUME_BY_WHO on each broker of the route; mqadmin asks the first one only)."""
    resp = await admin.namesrv_call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {wire.TOPIC: topic},
                                    ok=(ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST))
    if resp.code != ResponseCode.SUCCESS or not resp.body:
        return "", []  # its route went between the two requests (deleted, or its broker left)
    brokers = sorted(fastjson_loads(bytes(resp.body)).get("brokerDatas", []), key=lambda b: str(b.get("brokerName")))
    first = str(brokers[0].get("brokerName")) if brokers else ""
    cluster = next((c for c, names in sorted(clusters.items()) if first in names), "")
    groups: set[str] = set()
    for b in brokers:
        addr = _read_addr(b.get("brokerAddrs", {}))
        if addr:
            resp = await admin.call(addr, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {wire.TOPIC: topic})
            groups.update(fastjson_loads(bytes(resp.body)).get("groupList", []) if resp.body else [])
    return cluster, sorted(groups)


async def get_namesrv_config(admin: Admin, args: argparse.Namespace) -> str:
    """Every nameserver's config (GET_NAMESRV_CONFIG), printed as mqadmin getNamesrvConfig does."""
    out = []
    for ns in admin.require_namesrvs():
        resp = await admin.call(ns, RequestCode.GET_NAMESRV_CONFIG)
        out.append(f"============{ns}============")
        for line in bytes(resp.body).decode("utf-8", "replace").splitlines():
            if line.strip() and not line.lstrip().startswith(("#", "!")):
                key, _, value = line.partition("=")
                out.append(f"{key:<50}=  {value}")
    return "\n".join(out)


async def topic_route(admin: Admin, args: argparse.Namespace) -> str:
    return json.dumps(await admin.route(args.topic), indent=2, sort_keys=True)


def _connections(doc: dict[str, Any]) -> list[list[str]]:
    rows = [["#ClientId", "#ClientAddr", "#Language", "#Version"]]
    for c in doc.get("connectionSet", []):
        rows.append([str(c.get("clientId")), str(c.get("clientAddr")), str(c.get("language")), str(c.get("version"))])
    return rows


async def consumer_connection(admin: Admin, args: argparse.Namespace) -> str:
    """Which clients of a group are connected, what they subscribe to and how they consume."""
    addr = await _group_broker(admin, args)
    resp = await admin.call(addr, RequestCode.GET_CONSUMER_CONNECTION_LIST, {wire.CONSUMER_GROUP: args.group})
    doc = fastjson_loads(bytes(resp.body))
    out = [_table(_connections(doc)), ""]
    rows = [["#Topic", "#SubExpression"]]
    rows.extend([topic, str(sd.get("subString"))] for topic, sd in sorted(doc.get("subscriptionTable", {}).items()))
    out += [_table(rows), "", f"ConsumeType: {doc.get('consumeType')}", f"MessageModel: {doc.get('messageModel')}",
            f"ConsumeFromWhere: {doc.get('consumeFromWhere')}"]
    return "\n".join(out)


async def _group_broker(admin: Admin, args: argparse.Namespace) -> str:
    if args.broker:
        return str(args.broker)
    # A consumer group's retry topic is routed to the brokers its members heartbeat to.
    readers = await admin.route_readers(f"%RETRY%{args.group}")
    return sorted(readers.values())[0]


async def consumer_status(admin: Admin, args: argparse.Namespace) -> str:
    """Each member's own account of itself (GET_CONSUMER_RUNNING_INFO, relayed by a broker)."""
    addr = await _group_broker(admin, args)
    if args.client_id:
        ids = [args.client_id]
    else:
        listed = await admin.call(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {wire.CONSUMER_GROUP: args.group})
        ids = fastjson_loads(bytes(listed.body)).get("consumerIdList", []) if listed.body else []
    out: list[str] = []
    for client_id in ids:
        resp = await admin.call(addr, RequestCode.GET_CONSUMER_RUNNING_INFO, {
            wire.CONSUMER_GROUP: args.group, wire.RUNNING_INFO_CLIENT_ID: client_id, wire.JSTACK_ENABLE: "false"})
        try:
            doc, queues = loads_mq_keyed(bytes(resp.body), "mqTable")
        except ValueError as exc:
            raise AdminError(f"{client_id}: unreadable ConsumerRunningInfo: {exc}") from exc
        out.append(f"#ClientId: {client_id}")
        out.extend(f"{k:<36}: {v}" for k, v in sorted((doc.get("properties") or {}).items()))
        subs = [["#Topic", "#SubExpression"]]
        subs.extend([str(sd.get("topic")), str(sd.get("subString"))] for sd in doc.get("subscriptionSet") or [])
        out += ["", _table(subs), ""]
        rows = [["#Topic", "#Broker", "#QID", "#CommitOffset", "#CachedMsgs", "#Dropped", "#LastConsume"]]
        for (topic, broker, qid), pq in sorted(queues.items()):
            rows.append([topic, broker, str(qid), str(pq.get("commitOffset")), str(pq.get("cachedMsgCount")),
                         str(pq.get("droped", pq.get("dropped"))), _when(int(pq.get("lastConsumeTimestamp") or 0))])
        out += [_table(rows), ""]
    return "\n".join(out).rstrip()


async def clone_group_offset(admin: Admin, args: argparse.Namespace) -> str:
    """CLONE_GROUP_OFFSET on every master of the topic's route."""
    ext = {wire.SRC_GROUP: args.src, wire.DEST_GROUP: args.dest, wire.TOPIC: args.topic,
           wire.OFFLINE: str(args.offline).lower()}
    out = []
    for _name, addr in sorted((await admin.route_masters(args.topic)).items()):
        resp = await admin.call(addr, RequestCode.CLONE_GROUP_OFFSET, ext)
        out.append(f"{addr}: {resp.remark or 'success'}")
    return "\n".join(out)


async def producer_connection(admin: Admin, args: argparse.Namespace) -> str:
    out = []
    for _name, addr in sorted((await admin.route_masters(args.topic)).items()):
        resp = await admin.call(addr, RequestCode.GET_PRODUCER_CONNECTION_LIST, {wire.PRODUCER_GROUP: args.group})
        out.append(_table(_connections(fastjson_loads(bytes(resp.body)))))
    return "\n".join(out)


async def _write_perm(admin: Admin, args: argparse.Namespace, code: int, count_field: str, verb: str) -> str:
    out = []
    for ns in admin.require_namesrvs():  # every nameserver keeps its own routes
        resp = await admin.call(ns, code, {wire.BROKER_NAME: args.broker_name})
        out.append(f"{verb} write perm of broker[{args.broker_name}] in name server[{ns}] OK, "
                   f"{resp.ext_fields.get(count_field, '0')}")
    return "\n".join(out)


async def wipe_write_perm(admin: Admin, args: argparse.Namespace) -> str:
    return await _write_perm(admin, args, RequestCode.WIPE_WRITE_PERM_OF_BROKER, wire.WIPE_TOPIC_COUNT, "wipe")


async def add_write_perm(admin: Admin, args: argparse.Namespace) -> str:
    return await _write_perm(admin, args, RequestCode.ADD_WRITE_PERM_OF_BROKER, wire.ADD_TOPIC_COUNT, "add")


async def _every_namesrv(admin: Admin, code: int, ext: dict[str, str]) -> None:
    """A KV change goes to every nameserver (each keeps its own table), as mqadmin's; every one is
    tried, and the failures are reported together."""
    errors = []
    for ns in admin.require_namesrvs():
        try:
            await admin.call(ns, code, ext)
        except AdminError as exc:
            errors.append(str(exc))
    if errors:
        raise AdminError("; ".join(errors))


async def _put_kv(admin: Admin, namespace: str, key: str, value: str) -> None:
    await _every_namesrv(admin, RequestCode.PUT_KV_CONFIG, {wire.NAMESPACE: namespace, wire.KEY: key,
                                                           wire.VALUE: value})


async def _delete_kv(admin: Admin, namespace: str, key: str) -> None:
    await _every_namesrv(admin, RequestCode.DELETE_KV_CONFIG, {wire.NAMESPACE: namespace, wire.KEY: key})


async def update_kv_config(admin: Admin, args: argparse.Namespace) -> str:
    await _put_kv(admin, args.namespace.strip(), args.key.strip(), args.value.strip())
    return "create or update kv config to namespace success."


async def delete_kv_config(admin: Admin, args: argparse.Namespace) -> str:
    await _delete_kv(admin, args.namespace.strip(), args.key.strip())
    return "delete kv config from namespace success."


async def update_order_conf(admin: Admin, args: argparse.Namespace) -> str:
    topic = args.topic.strip()
    if args.method == "get":
        # One nameserver answers, as mqadmin's; QUERY_NOT_FOUND fails the command with its remark.
        resp = await admin.namesrv_call(RequestCode.GET_KV_CONFIG, {wire.NAMESPACE: ORDER_TOPIC_CONFIG,
                                                                    wire.KEY: topic})
        return f"get orderConf success. topic=[{topic}], orderConf=[{resp.ext_fields.get(wire.VALUE, '')}]"
    if args.method == "put":
        conf = (args.order_conf or "").strip()
        if not conf:
            raise AdminError("please set orderConf with option -v.")
        await _put_kv(admin, ORDER_TOPIC_CONFIG, topic, conf)
        return f"update orderConf success. topic=[{topic}], orderConf=[{conf}]"
    await _delete_kv(admin, ORDER_TOPIC_CONFIG, topic)
    return f"delete orderConf success. topic=[{topic}]"


def _timestamp(text: str) -> int:
    """mqadmin's -s: ``now``, milliseconds, or ``yyyy-MM-dd#HH:mm:ss:SSS`` (local time)."""
    if text == "now":
        return int(time.time() * 1000)
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        date, _, millis = text.rpartition(":")
        return int(time.mktime(time.strptime(date, "%Y-%m-%d#%H:%M:%S")) * 1000) + int(millis)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected now, milliseconds or yyyy-MM-dd#HH:mm:ss:SSS, got {text!r}") \
            from exc


async def reset_offset_by_time(admin: Admin, args: argparse.Namespace) -> str:
    """INVOKE_BROKER_TO_RESET_OFFSET on every master of the topic; for a group with no consumer
    online (CONSUMER_NOT_ONLINE) the offsets are searched and committed directly, as mqadmin does."""
    ext = {wire.TOPIC: args.topic, wire.GROUP: args.group, wire.TIMESTAMP: str(args.timestamp),
           wire.IS_FORCE: str(args.force).lower()}
    rows = [["#brokerName", "#queueId", "#offset"]]
    route = (await admin.route(args.topic)).get("brokerDatas", [])
    masters = _masters_of(route)
    # An offset written to a slave is replaced by its master's at the next sync: such a group is
    # not reset, and the command says so and fails rather than look complete.
    headless = sorted({b["brokerName"] for b in route} - set(masters))
    for name, addr in sorted(masters.items()):
        resp = await admin.call(addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext,
                                ok=(ResponseCode.SUCCESS, ResponseCode.CONSUMER_NOT_ONLINE))
        if resp.code == ResponseCode.SUCCESS:
            try:
                _, reset = loads_mq_keyed(bytes(resp.body), "offsetTable")
            except ValueError as exc:
                raise AdminError(f"{addr}: unreadable answer to the reset: {exc}") from exc
            rows.extend([broker, str(qid), str(off)] for (_t, broker, qid), off in sorted(reset.items()))
            continue
        for qid, offset in await _reset_offline(admin, addr, args):
            rows.append([name, str(qid), str(offset)])
    if headless:
        raise AdminError(f"not reset on {', '.join(headless)}: no master online (a slave's offsets are replaced "
                         "by its master's); run it again once the master is back", done=_table(rows))
    return _table(rows)


async def _reset_offline(admin: Admin, addr: str, args: argparse.Namespace) -> list[tuple[int, int]]:
    out = []
    _, table = await admin.mq_table(addr, RequestCode.GET_TOPIC_STATS_INFO, {wire.TOPIC: args.topic})
    for mq in sorted(table):
        qid = mq[2]
        current_resp = await admin.call(addr, RequestCode.QUERY_CONSUMER_OFFSET, {
            wire.CONSUMER_GROUP: args.group, wire.TOPIC: args.topic, wire.QUEUE_ID: str(qid)},
            ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
        current = int(current_resp.ext_fields.get(wire.OFFSET, "-1")) if current_resp.code == 0 else -1
        if args.timestamp == -1:
            target = int(table[mq]["maxOffset"])
        else:
            found = await admin.call(addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {
                wire.TOPIC: args.topic, wire.QUEUE_ID: str(qid), wire.TIMESTAMP: str(args.timestamp)})
            target = int(found.ext_fields[wire.OFFSET])
        if args.force or current < 0 or target < current:
            await admin.call(addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
                wire.CONSUMER_GROUP: args.group, wire.TOPIC: args.topic, wire.QUEUE_ID: str(qid),
                wire.COMMIT_OFFSET: str(target)})
            out.append((qid, target))
        else:
            out.append((qid, current))
    return out


async def _query(admin: Admin, topic: str, key: str, begin: int, end: int, unique: bool) -> list[MessageRecord]:
    """QUERY_MESSAGE on every broker of the topic's route; the records that really hold ``key``."""
    ext = {wire.TOPIC: topic, wire.KEY: key, wire.MAX_NUM: "64", wire.BEGIN_TIMESTAMP: str(begin),
           wire.END_TIMESTAMP: str(end)}
    if unique:
        ext[wire.UNIQUE_KEY_QUERY] = "true"
    found: list[MessageRecord] = []
    for _name, addr in sorted((await admin.route_readers(topic)).items()):
        resp = await admin.call(addr, RequestCode.QUERY_MESSAGE, ext, ok=(ResponseCode.SUCCESS,
                                                                          ResponseCode.QUERY_NOT_FOUND))
        if resp.code != ResponseCode.SUCCESS:
            continue
        try:
            records = list(iter_records(bytes(resp.body)))
        except CorruptRecordError as exc:
            raise AdminError(f"{addr}: unreadable QUERY_MESSAGE body: {exc}") from exc
        for rec in records:
            # Index lookups are by hash: keep what matches, as RocketMQ's clients do.
            if rec.properties.get(UNIQ_KEY) == key or (not unique and key in (rec.keys or "").split(" ")):
                found.append(rec)
    return found


def _record_rows(records: list[MessageRecord]) -> str:
    rows = [["#Message ID", "#QID", "#Offset", "#Store Time", "#Keys"]]
    for rec in sorted(records, key=lambda r: (r.store_timestamp, r.queue_id, r.queue_offset)):
        rows.append([rec.properties.get(UNIQ_KEY, "-"), str(rec.queue_id), str(rec.queue_offset),
                     _when(rec.store_timestamp), rec.keys or "-"])
    return _table(rows)


def _describe(rec: MessageRecord, offset_msg_id: str) -> str:
    props = {k: v for k, v in rec.properties.items() if k not in (UNIQ_KEY, KEYS, "TAGS")}
    lines = [("OffsetID", offset_msg_id), ("Topic", rec.topic), ("Tags", rec.tags or "-"),
             ("Keys", rec.keys or "-"), ("Queue ID", str(rec.queue_id)), ("Queue Offset", str(rec.queue_offset)),
             ("CommitLog Offset", str(rec.physical_offset)), ("Reconsume Times", str(rec.reconsume_times)),
             ("Born Timestamp", _when(rec.born_timestamp)), ("Store Timestamp", _when(rec.store_timestamp)),
             ("Born Host", f"{rec.born_host[0]}:{rec.born_host[1]}"),
             ("Store Host", f"{rec.store_host[0]}:{rec.store_host[1]}"), ("System Flag", str(rec.sys_flag)),
             ("Properties", json.dumps(props, sort_keys=True)), ("Message ID", rec.properties.get(UNIQ_KEY, "-")),
             ("Body Length", str(len(rec.body)))]
    return "\n".join(f"{name + ':':<20}{value}" for name, value in lines)


async def query_msg_by_key(admin: Admin, args: argparse.Namespace) -> str:
    end = args.end if args.end is not None else int(time.time() * 1000) + 60_000
    records = await _query(admin, args.topic, args.key, args.begin, end, unique=False)
    if not records:
        raise AdminError(f"no message of topic {args.topic} with key {args.key}")
    return _record_rows(records)


async def query_msg_by_unique_key(admin: Admin, args: argparse.Namespace) -> str:
    records = await _query(admin, args.topic, args.msg_id, 0, (1 << 63) - 1, unique=True)
    if not records:
        raise AdminError(f"no message of topic {args.topic} with message id {args.msg_id}")
    # Sent again after a failure, a message is stored twice under one id: show each copy.
    return "\n\n".join(_describe(rec, rec.msg_id) for rec in records)


async def query_msg_by_id(admin: Admin, args: argparse.Namespace) -> str:
    """By the broker's offset message id (SendResult.offsetMsgId): its store address and offset.
    With ``-g`` and ``-d``, as mqadmin: each id (comma-separated) goes to that consumer, which
    consumes it again (CONSUME_MESSAGE_DIRECTLY, relayed by the message's broker)."""
    if args.group and args.client_id:
        ids = [i.strip() for i in args.msg_id.split(",") if i.strip()]
        return "\n".join([await _consume_directly(admin, args.group, args.client_id, i) for i in ids])
    try:
        ip, port, phy = decode_offset_msg_id(args.msg_id)
    except MessageIdError as exc:
        raise AdminError(f"{exc} (for the client's message id use queryMsgByUniqueKey -t TOPIC)") from exc
    addr = f"{ip}:{port}"
    try:
        resp = await admin.call(addr, RequestCode.VIEW_MESSAGE_BY_ID, {wire.OFFSET: str(phy)})
    except AdminError as exc:
        # A client's message id has the same length, and decodes to an address of no broker.
        raise AdminError(f"{exc} (an offset message id names its broker, {addr}, and commitlog offset "
                         f"{phy}; for the client's message id use queryMsgByUniqueKey -t TOPIC -i "
                         f"{args.msg_id})") from exc
    try:
        rec = decode_record(bytes(resp.body), 0)
    except CorruptRecordError as exc:
        raise AdminError(f"{addr}: unreadable VIEW_MESSAGE_BY_ID body: {exc}") from exc
    return _describe(rec, args.msg_id)


def _java(value: Any) -> str:
    """A value as Java's string concatenation prints it."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


async def _consume_directly(admin: Admin, group: str, client_id: str, msg_id: str) -> str:
    """ConsumeMessageDirectlyResult.toString of one message pushed to one consumer."""
    try:
        ip, port, _phy = decode_offset_msg_id(msg_id)
    except MessageIdError as exc:
        raise AdminError(str(exc)) from exc
    # mqadmin waits three times its timeout: the consumer consumes before it answers.
    resp = await admin.call(f"{ip}:{port}", RequestCode.CONSUME_MESSAGE_DIRECTLY, {
        wire.CONSUMER_GROUP: group, wire.RUNNING_INFO_CLIENT_ID: client_id, wire.MSG_ID: msg_id},
        timeout=TIMEOUT * 3)
    try:
        r = fastjson_loads(bytes(resp.body))
    except ValueError as exc:
        raise AdminError(f"{ip}:{port}: unreadable ConsumeMessageDirectlyResult: {exc}") from exc
    return (f"ConsumeMessageDirectlyResult [order={_java(r.get('order', False))}, "
            f"autoCommit={_java(r.get('autoCommit', True))}, consumeResult={_java(r.get('consumeResult'))}, "
            f"remark={_java(r.get('remark'))}, spentTimeMills={_java(r.get('spentTimeMills', 0))}]")


async def _first_broker(admin: Admin, topic: str, master: bool) -> str:
    """The first broker of a topic's route, as mqadmin picks it: its master (``master``), else the
    address a read goes to."""
    datas = (await admin.route(topic)).get("brokerDatas") or []
    addrs = datas[0].get("brokerAddrs", {}) if datas else {}
    addr = addrs.get("0") if master else _read_addr(addrs)
    if not addr:
        raise AdminError(f"No topic route data of {topic}!")
    return str(addr)


async def get_consumer_status(admin: Admin, args: argparse.Namespace) -> str:
    """Each member's offsets as it holds them (INVOKE_BROKER_TO_GET_CONSUMER_STATUS on the first broker
    of the topic's route, which asks the members)."""
    origin = args.client_id or ""
    addr = await _first_broker(admin, args.topic, master=False)
    resp = await admin.call(addr, RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {
        wire.TOPIC: args.topic, wire.GROUP: args.group, wire.CLIENT_ADDR: origin})
    try:
        doc, queues = loads_with_mq_keys(bytes(resp.body))
    except ValueError as exc:
        raise AdminError(f"{addr}: unreadable GetConsumerStatusBody: {exc}") from exc
    out = [f"get consumer status from client. group={args.group}, topic={args.topic}, originClientId={origin}",
           f"{'#clientId':<50}  {'#brokerName':<15}  {'#queueId':<15}  {'#offset':<20}".rstrip()]
    for client_id, table in sorted((doc.get("consumerTable") or {}).items()):
        for (_topic, broker, qid), offset in sorted((queues[int(k)], v) for k, v in (table or {}).items()):
            out.append(f"{client_id:<50}  {broker:<15}  {qid:<15}  {offset:<20}".rstrip())
    return "\n".join(out)


def _cq_unit(unit: dict[str, Any]) -> str:
    return (f"ConsumeQueueData{{physicOffset={unit.get('physicOffset')}, physicSize={unit.get('physicSize')}, "
            f"tagsCode={unit.get('tagsCode')}, extendDataJson='{_java(unit.get('extendDataJson'))}', "
            f"bitMap='{_java(unit.get('bitMap'))}', eval={_java(unit.get('eval', False))}, "
            f"msg='{_java(unit.get('msg'))}'}}")


async def query_cq(admin: Admin, args: argparse.Namespace) -> str:
    """Consume-queue units from an index (QUERY_CONSUME_QUEUE), printed as mqadmin queryCq prints them."""
    addr = args.broker or await _first_broker(admin, args.topic, master=True)
    ext = {wire.TOPIC: args.topic, wire.QUEUE_ID: str(args.queue), wire.INDEX: str(args.index),
           wire.COUNT: str(args.count), **({wire.CONSUMER_GROUP: args.group} if args.group else {})}
    resp = await admin.call(addr, RequestCode.QUERY_CONSUME_QUEUE, ext)
    if not resp.body:
        raise AdminError(f"{addr}: {resp.remark or 'no consume queue data'}")
    try:
        body = fastjson_loads(bytes(resp.body))
    except ValueError as exc:
        raise AdminError(f"{addr}: unreadable QueryConsumeQueueResponseBody: {exc}") from exc
    line = "======================================"
    out = []
    if body.get("subscriptionData") is not None:
        out += ["Subscription data: ", json.dumps(body["subscriptionData"], indent="\t", sort_keys=True), line]
    if body.get("filterData") is not None:
        out += ["Filter data: ", str(body["filterData"]), line]
    out += ["Queue data: ", f"max: {body.get('maxQueueIndex')}, min: {body.get('minQueueIndex')}", line]
    for i, unit in enumerate(body.get("queueData") or [], start=args.index):
        out += [f"idx: {i}", _cq_unit(unit), line]
    return "\n".join(out)


COMMANDS = {
    "clusterList": (cluster_list, "list the brokers of every cluster"),
    "updateTopic": (update_topic, "create or update a topic on a broker or on every master of a cluster"),
    "deleteTopic": (delete_topic, "delete a topic from a cluster's masters and from the nameservers"),
    "topicStatus": (topic_status, "min/max offset and last store time of each queue of a topic"),
    "updateSubGroup": (update_sub_group, "create or update a consumer group"),
    "deleteSubGroup": (delete_sub_group, "delete a consumer group (and with -r its offsets)"),
    "consumerProgress": (consumer_progress, "a consumer group's progress and lag per queue"),
    "deleteExpiredCommitLog": (delete_expired_commit_log, "delete commitlog segments older than fileReservedTime "
                               "now, on one broker or every broker of a cluster"),
    "cleanExpiredCQ": (clean_expired_cq, "remove consume queues whose every message retention deleted (their "
                       "queue offsets start again at 0)"),
    "cleanUnusedTopic": (clean_unused_topic, "remove the consume queues of topics a broker has no config for"),
    "queryMsgByKey": (query_msg_by_key, "the messages of a topic with a key (KEYS), from the brokers' index"),
    "queryMsgById": (query_msg_by_id, "one message by the broker's offset message id (SendResult.offsetMsgId); "
                     "with -g and -d a consumer consumes it again"),
    "queryMsgByUniqueKey": (query_msg_by_unique_key, "one message by the client's message id (UNIQ_KEY)"),
    "brokerStatus": (broker_status, "a broker's runtime figures (offsets, disk use, role), or every broker's of a "
                     "cluster"),
    "getBrokerConfig": (get_broker_config, "a broker's settings (secrets masked), or every broker's of a cluster"),
    "updateBrokerConfig": (update_broker_config, "change a setting of a broker, or of every master of a cluster "
                           "(live keys at once; saved to broker.conf)"),
    "topicList": (topic_list, "every topic the nameserver routes; with -c each one's cluster and consumer groups"),
    "topicRoute": (topic_route, "a topic's route: its brokers and queues"),
    "consumerConnection": (consumer_connection, "a consumer group's connected clients and subscriptions"),
    "consumerStatus": (consumer_status, "each member of a consumer group reports its queues, offsets and "
                       "settings (asked through a broker)"),
    "producerConnection": (producer_connection, "a producer group's connected clients (on the topic's brokers)"),
    "wipeWritePerm": (wipe_write_perm, "producers stop sending to a broker group (its routes lose write "
                      "permission on every nameserver)"),
    "addWritePerm": (add_write_perm, "give a broker group's routes write permission back"),
    "cloneGroupOffset": (clone_group_offset, "a consumer group starts where another one is on a topic"),
    "resetOffsetByTime": (reset_offset_by_time, "move a consumer group's offsets on a topic to a point in time "
                          "(online consumers follow at once)"),
    "updateAclConfig": (update_acl_config, "create a plain ACL account, or change the fields given"),
    "deleteAccessConfig": (delete_access_config, "delete a plain ACL account"),
    "updateGlobalWhiteAddr": (update_global_white_addr, "replace the addresses that need no signature"),
    "clusterAclConfigVersion": (cluster_acl_config_version, "the version of each broker's ACL file"),
    "getAclConfig": (get_acl_config, "each broker's ACL accounts (secret keys masked) and white-list"),
    "updateKvConfig": (update_kv_config, "create or update a KV config entry on every nameserver"),
    "deleteKvConfig": (delete_kv_config, "delete a KV config entry on every nameserver"),
    "updateOrderConf": (update_order_conf, "put, get or delete a topic's order conf (KV namespace "
                        "ORDER_TOPIC_CONFIG; routes carry it with the nameservers' orderMessageEnable)"),
    "getNamesrvConfig": (get_namesrv_config, "every nameserver's config (its start-up options)"),
    "statsAll": (stats_all, "per topic and consumer group: backlog, put and get TPS, messages in 24 hours"),
    "getConsumerStatus": (get_consumer_status, "each member of a consumer group reports its offsets on a topic "
                          "(asked through a broker)"),
    "queryCq": (query_cq, "consume-queue units of a queue from an index (commitlog offset, size, tags code)"),
    "brokerConsumeStats": (broker_consume_stats, "every consumer group's progress on one broker, with its "
                           "total backlog"),
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rmq-admin", description="Topic, consumer-group and message administration with "
                                "RocketMQ mqadmin's command names and options, over the remoting protocol.")
    sub = p.add_subparsers(dest="command", required=True, metavar="command")
    parsers = {name: sub.add_parser(name, help=text) for name, (_fn, text) in COMMANDS.items()}
    for sp in parsers.values():
        sp.add_argument("-n", "--namesrvAddr", dest="namesrv", default=os.environ.get("NAMESRV_ADDR"),
                        help="nameserver address(es), host:port;host:port (default $NAMESRV_ADDR)")
        sp.add_argument("--accessKey", dest="access_key", default=os.environ.get("RMQ_ACCESS_KEY"),
                        help="sign requests for brokers with aclEnable (default $RMQ_ACCESS_KEY)")
        sp.add_argument("--secretKey", dest="secret_key", default=os.environ.get("RMQ_SECRET_KEY"),
                        help="the account's secret key (default $RMQ_SECRET_KEY)")
        sp.add_argument("--tls", action="store_true", default=os.environ.get("RMQ_TLS_ENABLE", "") == "true",
                        help="connect over TLS, as mqadmin with -Dtls.enable=true (default $RMQ_TLS_ENABLE)")
        sp.add_argument("--tlsConfigFile", dest="tls_config_file",
                        default=os.environ.get("RMQ_TLS_CONFIG_FILE", tls.DEFAULT_CONFIG_FILE),
                        help="tls.properties with the tls.client.* certificate keys (default $RMQ_TLS_CONFIG_FILE, "
                             f"else {tls.DEFAULT_CONFIG_FILE} when it exists)")
    for names, whom in ((("updateTopic", "updateSubGroup", "deleteSubGroup", "updateBrokerConfig"),
                         "every master of this cluster"),
                        (("deleteExpiredCommitLog", "cleanExpiredCQ", "cleanUnusedTopic", "brokerStatus",
                          "getBrokerConfig", "updateAclConfig", "deleteAccessConfig", "updateGlobalWhiteAddr",
                          "clusterAclConfigVersion", "getAclConfig"),
                         "every broker (masters and slaves) of this cluster")):
        for name in names:
            target = parsers[name].add_mutually_exclusive_group(required=True)
            target.add_argument("-b", "--brokerAddr", dest="broker", help="one broker, host:port")
            target.add_argument("-c", "--clusterName", dest="cluster", help=whom)
    parsers["deleteTopic"].add_argument("-c", "--clusterName", dest="cluster", required=True)
    for name in ("updateTopic", "deleteTopic", "topicStatus", "topicRoute", "queryMsgByKey", "queryMsgByUniqueKey",
                 "producerConnection", "cloneGroupOffset", "resetOffsetByTime"):
        parsers[name].add_argument("-t", "--topic", required=True)
    t = parsers["updateTopic"]
    t.add_argument("-r", "--readQueueNums", dest="read_queue_nums", type=int, default=8)
    t.add_argument("-w", "--writeQueueNums", dest="write_queue_nums", type=int, default=8)
    t.add_argument("-p", "--perm", type=int, default=6)
    t.add_argument("-o", "--order", type=_bool, default=False)
    for name in ("updateSubGroup", "deleteSubGroup", "consumerProgress"):
        parsers[name].add_argument("-g", "--groupName", dest="group", required=True)
    g = parsers["updateSubGroup"]
    g.add_argument("-s", "--consumeEnable", dest="consume_enable", type=_bool, default=True)
    # Defaults are SubscriptionGroupConfig's, as with mqadmin.
    g.add_argument("-m", "--consumeFromMinEnable", dest="from_min", type=_bool, default=True)
    g.add_argument("-d", "--consumeBroadcastEnable", dest="broadcast", type=_bool, default=True)
    g.add_argument("-q", "--retryQueueNums", dest="retry_queue_nums", type=int, default=1)
    g.add_argument("-r", "--retryMaxTimes", dest="retry_max_times", type=int, default=16)
    g.add_argument("-i", "--brokerId", dest="broker_id", type=int, default=0)
    g.add_argument("-w", "--whichBrokerWhenConsumeSlowly", dest="which_broker", type=int, default=1)
    g.add_argument("-a", "--notifyConsumerIdsChanged", dest="notify", type=_bool, default=True)
    parsers["deleteSubGroup"].add_argument("-r", "--removeOffset", dest="remove_offset", type=_bool, default=False)
    parsers["consumerProgress"].add_argument("-t", "--topicName", dest="topic", default=None)
    parsers["topicList"].add_argument("-c", "--clusterModel", dest="cluster_model", action="store_true",
                                      help="each topic's cluster and consumer groups (asks the brokers too)")
    q = parsers["queryMsgByKey"]
    q.add_argument("-k", "--msgKey", dest="key", required=True)
    q.add_argument("-b", "--beginTimestamp", dest="begin", type=int, default=0, help="store time from (ms)")
    q.add_argument("-e", "--endTimestamp", dest="end", type=int, default=None, help="store time to (ms; default now)")
    qi = parsers["queryMsgById"]
    qi.add_argument("-i", "--msgId", dest="msg_id", required=True)
    qi.add_argument("-g", "--consumerGroup", dest="group", default=None, help="with -d: have this consumer consume it")
    qi.add_argument("-d", "--clientId", dest="client_id", default=None, help="the consumer's client id")
    gs = parsers["getConsumerStatus"]
    gs.add_argument("-g", "--group", required=True, help="the consumer group")
    gs.add_argument("-t", "--topic", required=True)
    gs.add_argument("-i", "--originClientId", dest="client_id", default=None, help="one member (default: every one)")
    cq = parsers["queryCq"]
    cq.add_argument("-t", "--topic", required=True)
    cq.add_argument("-q", "--queue", type=int, required=True, help="queue id")
    cq.add_argument("-i", "--index", type=int, required=True, help="start queue index")
    cq.add_argument("-c", "--count", type=int, default=10, help="how many (default 10)")
    cq.add_argument("-b", "--broker", default=None, help="broker address (default: the route's first master)")
    cq.add_argument("-g", "--consumer", dest="group", default=None, help="consumer group (adds its subscription)")
    for name in ("consumerConnection", "consumerStatus"):
        c = parsers[name]
        c.add_argument("-g", "--consumerGroup", dest="group", required=True)
        c.add_argument("-b", "--brokerAddr", dest="broker", default=None, help="ask this broker (default: by route)")
    parsers["consumerStatus"].add_argument("-i", "--clientId", dest="client_id", default=None,
                                           help="one member (default: every member)")
    pc = parsers["producerConnection"]
    pc.add_argument("-g", "--producerGroup", dest="group", required=True)
    for name in ("wipeWritePerm", "addWritePerm"):
        parsers[name].add_argument("-b", "--brokerName", dest="broker_name", required=True)
    cg = parsers["cloneGroupOffset"]
    cg.add_argument("-s", "--srcGroup", dest="src", required=True)
    cg.add_argument("-d", "--destGroup", dest="dest", required=True)
    cg.add_argument("-o", "--offline", type=_bool, default=False, help="clone even where the source group is "
                    "online without subscribing to the topic")
    r = parsers["resetOffsetByTime"]
    r.add_argument("-g", "--group", required=True)
    r.add_argument("-s", "--timestamp", type=_timestamp, required=True,
                   help="now, -1 (the queues' end), milliseconds, or yyyy-MM-dd#HH:mm:ss:SSS")
    r.add_argument("-f", "--force", type=_bool, default=True, help="also move offsets forward (default true)")
    parsers["queryMsgByUniqueKey"].add_argument("-i", "--msgId", dest="msg_id", required=True)
    # mqadmin's options; --accessKey/--secretKey stay the credentials the request is signed with.
    for name in ("updateAclConfig", "deleteAccessConfig"):
        parsers[name].add_argument("-a", dest="account", required=True, help="the account's accessKey")
    a = parsers["updateAclConfig"]
    a.add_argument("-s", dest="account_secret", default=None, help="its secretKey (needed for a new account)")
    a.add_argument("-w", "--whiteRemoteAddress", dest="white", default=None)
    a.add_argument("-i", "--defaultTopicPerm", dest="default_topic_perm", default=None, help="DENY, PUB, SUB, PUB|SUB")
    a.add_argument("-u", "--defaultGroupPerm", dest="default_group_perm", default=None)
    a.add_argument("-t", "--topicPerms", dest="topic_perms", default=None, help="topicA=DENY,topicB=PUB|SUB")
    a.add_argument("-g", "--groupPerms", dest="group_perms", default=None, help="groupA=SUB")
    a.add_argument("-m", "--admin", type=_bool, default=False)
    parsers["updateGlobalWhiteAddr"].add_argument("-g", "--globalWhiteRemoteAddresses", dest="addresses",
                                                  required=True, help="comma-separated, e.g. 10.10.*.*,192.168.0.1")
    for name in ("updateKvConfig", "deleteKvConfig"):
        kv = parsers[name]
        kv.add_argument("-s", "--namespace", required=True)
        kv.add_argument("-k", "--key", required=True)
    parsers["updateKvConfig"].add_argument("-v", "--value", required=True)
    ub = parsers["updateBrokerConfig"]
    ub.add_argument("-k", "--key", required=True, help="config key (a broker.conf key)")
    ub.add_argument("-v", "--value", required=True, help="config value")
    o = parsers["updateOrderConf"]
    o.add_argument("-t", "--topic", required=True)
    o.add_argument("-v", "--orderConf", dest="order_conf", default=None,
                   help="brokerName1:num;brokerName2:num (for put)")
    o.add_argument("-m", "--method", required=True, choices=("put", "get", "delete"))
    sa = parsers["statsAll"]
    sa.add_argument("-a", "--activeTopic", dest="active", action="store_true", help="print active topic only")
    sa.add_argument("-t", "--topic", default=None, help="print select topic only")
    bc = parsers["brokerConsumeStats"]
    bc.add_argument("-b", "--brokerAddr", dest="broker", required=True, help="broker address, host:port")
    bc.add_argument("-t", "--timeoutMillis", dest="timeout_millis", type=int, default=50000,
                    help="request timeout (ms)")
    bc.add_argument("-l", "--level", type=int, default=0, help="threshold of print diff")
    bc.add_argument("-o", "--order", type=_bool, default=False, help="order topics only")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> str:
    if bool(args.access_key) != bool(args.secret_key):
        raise AdminError("give both --accessKey and --secretKey, or neither")
    ssl_context = None
    if args.tls:
        try:
            ssl_context = tls.client_context(tls.load_settings("disabled", True, args.tls_config_file))
        except tls.TlsConfigError as exc:
            raise AdminError(f"TLS: {exc}") from exc
    admin = Admin(args.namesrv, (args.access_key, args.secret_key) if args.access_key else None, ssl_context)
    try:
        fn = COMMANDS[args.command][0]
        return await fn(admin, args)
    finally:
        await admin.client.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        print(asyncio.run(run(args)))
    except AdminError as exc:
        if exc.done:
            print(exc.done)
        print(f"rmq-admin {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
