"""RocketMQ's plain ACL (``aclEnable=true``), with the semantics of 4.9.x's PlainAccessValidator and
PlainPermissionManager: accounts and permissions from a ``plain_acl.yml``; every request signed
by the client (HMAC-SHA1 over its sorted header values and body, base64) unless its address is
white-listed; per-request topic/group permissions (PUB, SUB, DENY) with per-account defaults;
admin-only request codes. Stock clients sign with their session credentials
(``set_session_credentials`` in the C++ client, ``AclClientRPCHook`` in Java).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import hmac
import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rmqbroker.metadata.data_version import DataVersion
from rmqbroker.metadata.errors import MetadataFormatError, MetadataPersistError
from rmqbroker.metadata.jsonfile import atomic_write, fastjson_loads
from rmqbroker.metadata.topics import RETRY_GROUP_TOPIC_PREFIX, TRACE_TOPIC
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import Connection, Handler, RemotingServer
from rmqbroker.stats import BrokerStats

log = logging.getLogger(__name__)

DENY = 1
ANY = 2
PUB = 4
SUB = 8
_PERMS = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}
# Request codes only an admin account may send (Permission.ADMIN_CODE).
# DELETE_EXPIRED_COMMITLOG, CLEAN_EXPIRED_CONSUMEQUEUE and CLEAN_UNUSED_TOPIC delete data, and
# INVOKE_BROKER_TO_RESET_OFFSET and CLONE_GROUP_OFFSET set a group's offsets, and 50, 51, 53 and 54
# change or show the ACL itself, so they are admin-only here although 4.9 lets any account send them.
ADMIN_CODES = frozenset({RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.UPDATE_BROKER_CONFIG,
                         RequestCode.DELETE_TOPIC_IN_BROKER,
                         RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.DELETE_SUBSCRIPTIONGROUP,
                         RequestCode.DELETE_EXPIRED_COMMITLOG, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                         RequestCode.CLONE_GROUP_OFFSET, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE,
                         RequestCode.CLEAN_UNUSED_TOPIC, RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
                         RequestCode.DELETE_ACL_CONFIG, RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
                         RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG,
                         # Stricter than RocketMQ 4.9: one makes a consumer consume a message again,
                         # the other puts a transaction half back to be checked.
                         RequestCode.CONSUME_MESSAGE_DIRECTLY, RequestCode.RESUME_CHECK_HALF_MESSAGE})
# RELAYED_BY, RELAYED_FOR: added by a slave forwarding a client's signed write to its master
# (processors/relay.py).
_UNSIGNED = frozenset({wire.SIGNATURE, wire.UNIQUE_KEY_QUERY, wire.RELAYED_BY, wire.RELAYED_FOR})
MIN_KEY_LENGTH = 6
# plain_acl.yml keys (RocketMQ's file format).
ACCOUNTS = "accounts"
GLOBAL_WHITE = "globalWhiteRemoteAddresses"
DATA_VERSION = "dataVersion"
_ANY_OCTET = range(256)


class AclConfigError(ValueError):
    """The ACL file cannot be used; the message names the file and the entry."""


def signature(content: bytes, secret_key: str) -> str:
    """AclSigner: base64(HMAC-SHA1(secret, content))."""
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()).decode("ascii")


def signed_content(ext: Mapping[str, str], body: bytes) -> bytes:
    """What a request's signature covers: header values in key order (except the signature), then
    the body (AclUtils.combineRequestContent)."""
    values = "".join(value for key, value in sorted(ext.items()) if key not in _UNSIGNED)
    return values.encode("utf-8") + body


def sign(ext: dict[str, str], body: bytes, access_key: str, secret_key: str) -> None:
    """Add AccessKey and Signature to ``ext`` as a client does (used by rmq-admin)."""
    ext[wire.ACCESS_KEY] = access_key
    ext[wire.SIGNATURE] = signature(signed_content(ext, body), secret_key)


class AddressMatcher:
    """A white-list entry as RocketMQ writes them: ``*``, an address, ``a.b.c.*``,
    ``a.b.c.1-100``, ``a.b.c.{1,2,3}`` or a comma-separated list of addresses."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern = pattern.strip()
        self._any = pattern in ("*", "*.*.*.*")
        # Each alternative: the allowed values of the four octets.
        self._alternatives: list[list[range]] = []
        if self._any or not pattern:
            return
        if pattern.endswith("}"):
            head, sep, choices = pattern.rpartition(".{")
            if not sep:
                raise AclConfigError(f"bad address pattern {pattern!r}")
            entries = [f"{head}.{c.strip()}" for c in choices[:-1].split(",")]
        else:
            entries = [e.strip() for e in pattern.split(",")]
        self._alternatives = [self._parse(entry) for entry in entries]

    @staticmethod
    def _parse(entry: str) -> list[range]:
        parts = entry.split(".")
        if parts[-1] == "*":
            parts += ["*"] * (4 - len(parts))  # a.b.* = a.b.*.*
        if len(parts) != 4:
            raise AclConfigError(f"bad address pattern {entry!r}")
        out = []
        for part in parts:
            lo_s, _, hi_s = part.partition("-")
            try:
                octets = _ANY_OCTET if part == "*" else range(int(lo_s), int(hi_s or lo_s) + 1)
            except ValueError as exc:
                raise AclConfigError(f"bad address pattern {entry!r}") from exc
            if not octets or octets.start < 0 or octets.stop > 256:
                raise AclConfigError(f"bad address pattern {entry!r}")
            out.append(octets)
        return out

    def match(self, ip: str) -> bool:
        if self._any:
            return True
        if not self._alternatives:
            return False
        try:
            octets = ipaddress.IPv4Address(ip).packed
        except ValueError:
            return False
        return any(all(o in allowed for o, allowed in zip(octets, alt, strict=True)) for alt in self._alternatives)


@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str
    white: AddressMatcher
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    # Topic name, or %RETRY% + group, -> permission.
    perms: dict[str, int] = field(default_factory=dict)


def check_permission(needed: int, owned: int) -> bool:
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def _perm(value: Any, what: str) -> int:
    perm = _PERMS.get(str(value).strip()) if value is not None else None
    if perm is None:
        raise AclConfigError(f"{what}: expected DENY, PUB, SUB or PUB|SUB, got {value!r}")
    return perm


class PlainAcl:
    """Accounts and white-lists from one plain_acl.yml, and the per-request check."""

    def __init__(self, accounts: dict[str, Account], global_white: list[AddressMatcher]) -> None:
        self.accounts = accounts
        self.global_white = global_white

    def replace(self, other: PlainAcl) -> None:
        """Take ``other``'s accounts and white-list (a reloaded file), for every later request."""
        self.accounts, self.global_white = other.accounts, other.global_white

    @classmethod
    def load(cls, path: Path) -> PlainAcl:
        return cls.from_document(read_document(path), path)

    @classmethod
    def from_document(cls, doc: dict[str, Any], path: Path) -> PlainAcl:
        """The rules of a parsed plain_acl.yml (``path`` names it in errors)."""
        white = [AddressMatcher(str(p)) for p in doc.get(GLOBAL_WHITE) or []]
        accounts: dict[str, Account] = {}
        for i, raw in enumerate(doc.get(ACCOUNTS) or []):
            what = f"{path}: accounts[{i}]"
            if not isinstance(raw, dict):
                raise AclConfigError(f"{what}: expected a mapping")
            ak, sk = str(raw.get("accessKey") or ""), str(raw.get("secretKey") or "")
            if len(ak) < MIN_KEY_LENGTH or len(sk) < MIN_KEY_LENGTH:
                raise AclConfigError(f"{what}: accessKey and secretKey need at least {MIN_KEY_LENGTH} characters")
            if ak in accounts:
                raise AclConfigError(f"{what}: accessKey {ak} appears twice")
            perms: dict[str, int] = {}
            for kind, prefix in (("topicPerms", ""), ("groupPerms", RETRY_GROUP_TOPIC_PREFIX)):
                for entry in raw.get(kind) or []:
                    name, sep, value = str(entry).partition("=")
                    if not sep or not name.strip():
                        raise AclConfigError(f"{what}.{kind}: expected name=PERM, got {entry!r}")
                    perms[prefix + name.strip()] = _perm(value, f"{what}.{kind} {name.strip()}")
            accounts[ak] = Account(
                access_key=ak, secret_key=sk, white=AddressMatcher(str(raw.get("whiteRemoteAddress") or "")),
                admin=raw.get("admin") is True or str(raw.get("admin")).lower() == "true",
                default_topic_perm=_perm(raw.get("defaultTopicPerm", "DENY"), f"{what}.defaultTopicPerm"),
                default_group_perm=_perm(raw.get("defaultGroupPerm", "DENY"), f"{what}.defaultGroupPerm"),
                perms=perms)
        return cls(accounts, white)

    def check(self, remote_ip: str, cmd: RemotingCommand) -> str | None:
        """None when ``cmd`` from ``remote_ip`` may run, else why not (the response remark)."""
        if any(w.match(remote_ip) for w in self.global_white):
            return None
        ext = cmd.ext_fields
        ak = ext.get(wire.ACCESS_KEY)
        if ak is None:
            return "No accessKey is configured"
        account = self.accounts.get(ak)
        if account is None:
            return f"No acl config for {ak}"
        if account.white.match(remote_ip):
            return None
        expected = signature(signed_content(ext, bytes(cmd.body)), account.secret_key)
        if not hmac.compare_digest(expected, ext.get(wire.SIGNATURE, "")):
            return f"Check signature failed for accessKey={ak}"
        try:
            needed = needed_perms(cmd)
        except (ValueError, AttributeError, TypeError) as exc:  # an unusable heartbeat body
            return f"cannot read the resources of request code {cmd.code}: {exc}"
        if needed.get(TRACE_TOPIC) == PUB:
            return None
        if cmd.code in ADMIN_CODES and not account.admin:
            return f"Need admin permission for request code={cmd.code}, but accessKey={ak} is not"
        if not needed or (account.admin and not account.perms):
            return None
        for resource, perm in needed.items():
            is_group = resource.startswith(RETRY_GROUP_TOPIC_PREFIX)
            owned = account.perms.get(resource)
            if owned is None:
                owned = account.default_group_perm if is_group else account.default_topic_perm
            if not check_permission(perm, owned):
                what = f"group={resource[len(RETRY_GROUP_TOPIC_PREFIX):]}" if is_group else f"topic={resource}"
                return f"No default permission for {what}"
        return None


def _retry(group: str | None) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + ("null" if group is None else group)  # Java's getRetryTopic(null)


def needed_perms(cmd: RemotingCommand) -> dict[str, int]:
    """The topics (and groups, as their retry topics) a request needs, and how (PlainAccessValidator)."""
    ext = cmd.ext_fields
    code = cmd.code
    out: dict[str, int] = {}
    if code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        v1 = code == RequestCode.SEND_MESSAGE
        # A V2 header's topic as the send path reads it (its letter, else the V1 name): checking
        # only "b" let a header that also named "topic" store into a topic never checked.
        topic = (ext.get(wire.TOPIC) if v1 else wire.send_v2_field(ext, wire.V2_TOPIC)) or ""
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            # Java reads "group" from a V1 header, which has none: its retry sends need %RETRY%null.
            out[_retry(ext.get(wire.GROUP) if v1 else wire.send_v2_field(ext, wire.V2_PRODUCER_GROUP))] = SUB
        else:
            out[topic] = PUB
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        out[_retry(ext.get(wire.GROUP))] = SUB
    elif code in (RequestCode.PULL_MESSAGE, RequestCode.UPDATE_CONSUMER_OFFSET):
        out[ext.get(wire.TOPIC) or ""] = SUB
        out[_retry(ext.get(wire.CONSUMER_GROUP))] = SUB
    elif code == RequestCode.QUERY_MESSAGE:
        out[ext.get(wire.TOPIC) or ""] = SUB
    elif code == RequestCode.HEART_BEAT:
        data = fastjson_loads(bytes(cmd.body)) if cmd.body else {}
        for consumer in data.get("consumerDataSet") or []:
            out[_retry(consumer.get("groupName"))] = SUB
            for sub in consumer.get("subscriptionDataSet") or []:
                out[str(sub.get("topic"))] = SUB
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        out[_retry(ext.get(wire.CONSUMER_GROUP))] = SUB
    return out


def read_document(path: Path) -> dict[str, Any]:
    """The parsed plain_acl.yml (an empty file is an empty document)."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise AclConfigError(f"{path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise AclConfigError(f"{path}: expected a mapping with accounts and globalWhiteRemoteAddresses")
    return doc


def document_version(doc: Mapping[str, Any]) -> DataVersion:
    """The file's ``dataVersion`` (RocketMQ keeps it in the file as a one-element list)."""
    raw = doc.get(DATA_VERSION)
    if isinstance(raw, list) and raw:
        raw = raw[0]
    try:
        return DataVersion.from_json_obj(raw)
    except MetadataFormatError:
        return DataVersion(timestamp=0)


def write_document(path: Path, doc: dict[str, Any]) -> PlainAcl:
    """Check ``doc``, stamp a new ``dataVersion`` and replace the file with it (a crash leaves the
    old or the new file, with the old file's mode, 0600 for a new one); blocking. The new rules."""
    version = document_version(doc)
    version.next_version()
    doc[DATA_VERSION] = [{"counter": version.counter, "timestamp": version.timestamp}]
    rules = PlainAcl.from_document(doc, path)
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True)
    target = path.resolve()
    try:
        mode = target.stat().st_mode & 0o777 if target.exists() else 0o600
        atomic_write(target, text, mode=mode, backup=False)
    except (OSError, MetadataPersistError) as exc:
        cause = exc if isinstance(exc, OSError) else exc.__cause__
        hint = (" (the file is mounted read-only: change it where it comes from, e.g. the Kubernetes Secret "
                "of spec.acl.secretName)") if isinstance(cause, OSError) and cause.errno == errno.EROFS else ""
        raise AclConfigError(f"cannot write {path}: {cause.strerror if isinstance(cause, OSError) else exc}{hint}"
                             ) from exc
    return rules


class AclFileWatcher:
    """Reloads the ACL file when it changes (RocketMQ watches plain_acl.yml too; a Kubernetes Secret
    update reaches the mounted file on its own). A file that no longer loads is logged and counted,
    and the last good one stays in force."""

    def __init__(self, acl: PlainAcl, path: Path, stats: BrokerStats) -> None:
        self.acl = acl
        self.path = path
        self.stats = stats
        self._seen = self._fingerprint()

    def _fingerprint(self) -> bytes | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None

    def load_if_changed(self) -> PlainAcl | None:
        """Blocking (a worker thread): the file's new rules if its content changed and loads."""
        seen = self._fingerprint()
        if seen is None or seen == self._seen:
            return None
        self._seen = seen
        try:
            return PlainAcl.load(self.path)
        except AclConfigError as exc:
            self.stats.acl_reload_failures += 1
            log.error("ACL file changed but cannot be used; keeping the previous rules: %s", exc)
            return None

    def apply(self, fresh: PlainAcl) -> None:
        """On the loop: every later request is checked against ``fresh``."""
        self.acl.replace(fresh)
        self.stats.acl_reloads += 1
        log.info("ACL file %s reloaded: %d account(s)", self.path, len(fresh.accounts))

    def wrote(self, fresh: PlainAcl) -> None:
        """On the loop, after an admin request rewrote the file: its rules are in force now (the next
        check of the file finds nothing new)."""
        self._seen = self._fingerprint()
        self.acl.replace(fresh)
        log.info("ACL file %s rewritten by an admin request: %d account(s)", self.path, len(fresh.accounts))


def guard(server: RemotingServer, acl: PlainAcl, stats: BrokerStats) -> None:
    """Check every request against ``acl`` before its handler (RocketMQ's ACL RPC hook): a refused
    one is answered SYSTEM_ERROR with the reason, as a Java broker does, and counted."""

    def wrap(handler: Handler) -> Handler:
        def checked(conn: Connection, cmd: RemotingCommand) -> Any:
            remark = acl.check(conn.remote_host, cmd)
            if remark is not None:
                stats.acl_denied += 1
                log.info("ACL refused request code %d from %s: %s", cmd.code, conn.remote_addr, remark)
                return cmd.make_response(ResponseCode.SYSTEM_ERROR, remark)
            return handler(conn, cmd)

        return checked

    for code, handler in list(server.handlers.items()):
        server.handlers[code] = wrap(handler)
