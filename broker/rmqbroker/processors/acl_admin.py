"""The plain ACL's admin requests (RocketMQ 4.9's AdminBrokerProcessor, codes 50-54): create or update
an account, delete one, replace the global white-list, and read the file's version and rules.

Changes rewrite ``aclFile`` (the file keeps RocketMQ's format and its ``dataVersion``) and are in
force for the next request. With the ACL on, these requests need an admin account (``acl.ADMIN_CODES``),
except the version read. A broker without ``aclEnable`` answers each of them with why it cannot.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rmqbroker.acl import (
    ACCOUNTS,
    GLOBAL_WHITE,
    AclConfigError,
    AclFileWatcher,
    document_version,
    read_document,
    write_document,
)
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import Connection, RemotingServer
from rmqbroker.remoting.wire import Header

log = logging.getLogger(__name__)

ACL_OFF_REMARK = "the plain ACL is off on this broker (aclEnable=false)"
_MASK = "******"
# Account fields of plain_acl.yml that the update request sets when it carries a non-empty value
# (as RocketMQ's createAclAccessConfigMap does); ``admin`` is always sent and always set.
_TEXT_FIELDS = ((wire.ACL_SECRET_KEY, "secretKey"), (wire.WHITE_REMOTE_ADDRESS, "whiteRemoteAddress"),
                (wire.DEFAULT_TOPIC_PERM, "defaultTopicPerm"), (wire.DEFAULT_GROUP_PERM, "defaultGroupPerm"))
_LIST_FIELDS = ((wire.TOPIC_PERMS, "topicPerms"), (wire.GROUP_PERMS, "groupPerms"))


def _is_account(entry: Any, access_key: str) -> bool:
    return isinstance(entry, dict) and str(entry.get("accessKey")) == access_key


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


class AclAdminProcessor:
    """Edits of ``aclFile`` on behalf of mqadmin's ACL commands, one at a time."""

    def __init__(self, path: Path, watcher: AclFileWatcher | None, *, cluster: str, broker_name: str,
                 broker_addr: str) -> None:
        self.path = path
        self.watcher = watcher
        self.cluster = cluster
        self.broker_name = broker_name
        self.broker_addr = broker_addr
        self._lock = asyncio.Lock()

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, self.update_access_config)
        server.register(RequestCode.DELETE_ACL_CONFIG, self.delete_access_config)
        server.register(RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, self.update_global_white_addrs)
        server.register(RequestCode.GET_BROKER_CLUSTER_ACL_INFO, self.acl_version)
        server.register(RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, self.acl_config)

    async def _edit(self, conn: Connection, cmd: RemotingCommand, failed: int,
                    edit: Callable[[dict[str, Any]], str | None], what: str) -> RemotingCommand:
        """Read the file, apply ``edit`` (which returns a refusal remark or None), write it back and
        put its rules in force (logging ``what`` was done); any failure is answered ``failed`` with
        the reason."""
        watcher = self.watcher
        if watcher is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, ACL_OFF_REMARK)
        async with self._lock:
            try:
                doc = await asyncio.to_thread(read_document, self.path)
                refused = edit(doc)
                if refused is not None:
                    return cmd.make_response(failed, refused)
                rules = await asyncio.to_thread(write_document, self.path, doc)
            except AclConfigError as exc:
                log.warning("ACL admin request %d refused: %s", cmd.code, exc)
                return cmd.make_response(failed, str(exc))
            watcher.wrote(rules)
        log.info("ACL: %s (request from %s)", what, conn.remote_addr)
        return cmd.make_response(ResponseCode.SUCCESS)

    async def update_access_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin updateAclConfig: create the account, or change the fields the request gives."""
        h = Header(cmd.ext_fields)
        access_key = h.req_str(wire.ACL_ACCESS_KEY)
        admin = h.opt_bool(wire.ACL_ADMIN)

        def edit(doc: dict[str, Any]) -> str | None:
            accounts = doc.get(ACCOUNTS)
            if not isinstance(accounts, list):
                accounts = doc[ACCOUNTS] = []
            account = next((a for a in accounts if _is_account(a, access_key)), None)
            if account is None:
                if not h.opt_str(wire.ACL_SECRET_KEY):
                    return f"a new account needs a secretKey: accessKey {access_key} does not exist"
                account = {"accessKey": access_key}
                accounts.append(account)
            for wire_name, key in _TEXT_FIELDS:
                value = h.opt_str(wire_name)
                if value:
                    account[key] = value
            account["admin"] = admin
            for wire_name, key in _LIST_FIELDS:
                values = _split(h.opt_str(wire_name))
                if values:
                    account[key] = values
            return None

        return await self._edit(conn, cmd, ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED, edit,
                                f"account {access_key} created or updated")

    async def delete_access_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin deleteAccessConfig."""
        access_key = Header(cmd.ext_fields).req_str(wire.ACL_ACCESS_KEY)

        def edit(doc: dict[str, Any]) -> str | None:
            accounts = doc.get(ACCOUNTS)
            kept = [a for a in accounts or [] if not _is_account(a, access_key)]
            if not isinstance(accounts, list) or len(kept) == len(accounts):
                return f"Accesskey: {access_key} not existed, Please check it again"
            doc[ACCOUNTS] = kept
            return None

        return await self._edit(conn, cmd, ResponseCode.DELETE_ACL_CONFIG_FAILED, edit,
                                f"account {access_key} deleted")

    async def update_global_white_addrs(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin updateGlobalWhiteAddr: replace the addresses that need no signature."""
        addrs = _split(Header(cmd.ext_fields).opt_str(wire.GLOBAL_WHITE_ADDRS))

        def edit(doc: dict[str, Any]) -> str | None:
            doc[GLOBAL_WHITE] = addrs
            return None

        return await self._edit(conn, cmd, ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED, edit,
                                f"global white-list set to {addrs}")

    async def _document(self, cmd: RemotingCommand) -> dict[str, Any] | RemotingCommand:
        if self.watcher is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, ACL_OFF_REMARK)
        try:
            return await asyncio.to_thread(read_document, self.path)
        except AclConfigError as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, str(exc))

    async def acl_version(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin clusterAclConfigVersion: the file's DataVersion, and the broker it belongs to."""
        doc = await self._document(cmd)
        if isinstance(doc, RemotingCommand):
            return doc
        version = json.dumps(document_version(doc).to_json_obj(), separators=(",", ":"))
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields={
            wire.VERSION: version,
            wire.ALL_ACL_FILE_VERSION: json.dumps({str(self.path): json.loads(version)}, separators=(",", ":")),
            wire.BROKER_NAME: self.broker_name, wire.BROKER_ADDR: self.broker_addr,
            wire.CLUSTER_NAME: self.cluster})

    async def acl_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """The rules as RocketMQ's AclConfig JSON, secret keys masked (RocketMQ sends them in clear)."""
        doc = await self._document(cmd)
        if isinstance(doc, RemotingCommand):
            return doc
        configs = []
        for account in doc.get(ACCOUNTS) or []:
            if isinstance(account, dict):
                configs.append({**account, "secretKey": _MASK})
        body = {"globalWhiteAddrs": [str(a) for a in doc.get(GLOBAL_WHITE) or []], "plainAccessConfigs": configs}
        text = json.dumps(body, separators=(",", ":"), default=str)
        return cmd.make_response(ResponseCode.SUCCESS, body=text.encode("utf-8"))
