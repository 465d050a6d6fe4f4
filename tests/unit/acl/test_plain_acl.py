"""The plain ACL's rules (RocketMQ 4.9.x semantics): signatures, white-lists, permissions, admin codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmqbroker.acl import (
    ACCOUNTS,
    ANY,
    DENY,
    GLOBAL_WHITE,
    PUB,
    SUB,
    AclConfigError,
    AddressMatcher,
    PlainAcl,
    check_permission,
    document_version,
    read_document,
    sign,
    signature,
    signed_content,
    write_document,
)
from rmqbroker.remoting.codes import RequestCode
from rmqbroker.remoting.frame import RemotingCommand

ACL = """
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    whiteRemoteAddress: 192.168.1.{5,6}
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - Orders=PUB
      - Audit=PUB|SUB
    groupPerms:
      - Blocked=DENY
  - accessKey: admin-1
    secretKey: admin-secret
    admin: true
"""


@pytest.fixture
def acl(tmp_path: Path) -> PlainAcl:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    return PlainAcl.load(path)


def request(code: int, ext: dict[str, str], body: bytes = b"", creds: tuple[str, str] | None = None) -> RemotingCommand:
    fields = dict(ext)
    if creds:
        sign(fields, body, *creds)
    return RemotingCommand(code, ext_fields=fields, body=body)


PRODUCER = ("producer1", "producer-secret")
ADMIN = ("admin-1", "admin-secret")


def test_signature_covers_sorted_values_then_body() -> None:
    content = signed_content({"b": "2", "a": "1", "Signature": "x", "AccessKey": "ak"}, b"BODY")
    assert content == b"ak12BODY"  # AccessKey < a < b in Java's String order; Signature left out
    # base64(HMAC-SHA1) as `printf abc | openssl dgst -sha1 -hmac secret -binary | base64` gives it
    assert signature(b"abc", "secret") == "aUq9EIQtFh3bxU34oNV89k0NvMk="


def test_send_needs_a_valid_signature_and_topic_pub(acl: PlainAcl) -> None:
    ip = "127.0.0.1"
    ext = {"producerGroup": "PG", "topic": "Orders"}
    assert acl.check(ip, request(RequestCode.SEND_MESSAGE, ext, b"m", PRODUCER)) is None
    assert acl.check(ip, request(RequestCode.SEND_MESSAGE, ext, b"m")) == "No accessKey is configured"
    assert "No acl config" in (acl.check(ip, request(RequestCode.SEND_MESSAGE, ext, b"m", ("nobody", "x" * 6))) or "")
    tampered = request(RequestCode.SEND_MESSAGE, ext, b"m", PRODUCER)
    tampered.ext_fields["topic"] = "Audit"
    assert "Check signature failed" in (acl.check(ip, tampered) or "")
    wrong = request(RequestCode.SEND_MESSAGE, ext, b"m", ("producer1", "not-the-secret"))
    assert "Check signature failed" in (acl.check(ip, wrong) or "")
    other = request(RequestCode.SEND_MESSAGE, {**ext, "topic": "Payments"}, b"m", PRODUCER)
    assert acl.check(ip, other) == "No default permission for topic=Payments"  # defaultTopicPerm DENY
    v2 = request(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "Orders"}, b"m", PRODUCER)
    assert acl.check(ip, v2) is None


def test_pull_needs_topic_sub_and_group_sub(acl: PlainAcl) -> None:
    def pull(topic: str, group: str) -> str | None:
        return acl.check("127.0.0.1", request(RequestCode.PULL_MESSAGE, {"topic": topic, "consumerGroup": group},
                                              creds=PRODUCER))

    assert pull("Audit", "G1") is None  # Audit=PUB|SUB, groups default to SUB
    assert pull("Orders", "G1") == "No default permission for topic=Orders"  # PUB only
    assert pull("Audit", "Blocked") == "No default permission for group=Blocked"


def test_heartbeat_checks_every_group_and_subscription(acl: PlainAcl) -> None:
    def beat(groups: list[tuple[str, str]]) -> str | None:
        body = json.dumps({"clientID": "c", "consumerDataSet": [
            {"groupName": g, "subscriptionDataSet": [{"topic": t}]} for g, t in groups]}).encode()
        return acl.check("127.0.0.1", request(RequestCode.HEART_BEAT, {}, body, PRODUCER))

    assert beat([("G1", "Audit")]) is None
    assert beat([("G1", "Audit"), ("Blocked", "Audit")]) == "No default permission for group=Blocked"
    unusable = acl.check("127.0.0.1", request(RequestCode.HEART_BEAT, {}, b"[1]", PRODUCER))
    assert unusable is not None and "cannot read" in unusable


def test_admin_codes_need_an_admin_account(acl: PlainAcl) -> None:
    ext = {"topic": "T", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"}
    assert "Need admin permission" in (acl.check("127.0.0.1", request(17, ext, creds=PRODUCER)) or "")
    assert acl.check("127.0.0.1", request(17, ext, creds=ADMIN)) is None
    # Requests that delete data or move a group's offsets, header-less ones too.
    for code in (RequestCode.DELETE_EXPIRED_COMMITLOG, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE,
                 RequestCode.CLEAN_UNUSED_TOPIC, RequestCode.CLONE_GROUP_OFFSET):
        assert "Need admin permission" in (acl.check("127.0.0.1", request(code, {}, creds=PRODUCER)) or ""), code
        assert acl.check("127.0.0.1", request(code, {}, creds=ADMIN)) is None, code
    # Codes with no resources need only a valid signature.
    assert acl.check("127.0.0.1", request(RequestCode.GET_MAX_OFFSET, {"topic": "X", "queueId": "0"},
                                          creds=PRODUCER)) is None


def test_white_lists_skip_the_signature(acl: PlainAcl) -> None:
    unsigned = request(RequestCode.SEND_MESSAGE, {"topic": "Payments"}, b"m")
    assert acl.check("10.10.103.7", unsigned) is None  # global white-list: no checks at all
    keyed = request(RequestCode.SEND_MESSAGE, {"topic": "Payments", "AccessKey": "producer1"}, b"m")
    assert acl.check("192.168.1.5", keyed) is None  # the account's white-list: no signature or perms
    assert acl.check("192.168.1.7", keyed) is not None


@pytest.mark.parametrize(("pattern", "yes", "no"), [
    ("*", ["1.2.3.4"], []),
    ("", [], ["1.2.3.4"]),
    ("192.168.1.1", ["192.168.1.1"], ["192.168.1.2"]),
    ("192.168.*", ["192.168.7.9"], ["192.169.0.1"]),
    ("192.168.1.1-100", ["192.168.1.100"], ["192.168.1.101"]),
    ("192.168.1.{1,3}", ["192.168.1.3"], ["192.168.1.2"]),
    ("10.0.0.1,10.0.0.2", ["10.0.0.2"], ["10.0.0.3"]),
])
def test_address_patterns(pattern: str, yes: list[str], no: list[str]) -> None:
    m = AddressMatcher(pattern)
    assert all(m.match(ip) for ip in yes) and not any(m.match(ip) for ip in no)


def test_permission_rules() -> None:
    assert check_permission(PUB, PUB | SUB) and not check_permission(SUB, PUB)
    assert not check_permission(PUB, DENY | PUB)
    assert check_permission(ANY, SUB) and not check_permission(ANY, DENY)


@pytest.mark.parametrize(("text", "problem"), [
    ("accounts: [{accessKey: short, secretKey: long-enough}]", "at least 6"),
    ("accounts: [{accessKey: abcdef, secretKey: ghijkl, topicPerms: [T=WRITE]}]", "topicPerms"),
    ("accounts: [{accessKey: abcdef, secretKey: ghijkl, topicPerms: [justaname]}]", "name=PERM"),
    ("globalWhiteRemoteAddresses: [300.1.1.1]", "bad address"),
    ("- just a list", "mapping"),
    ("accounts: [", "plain_acl.yml"),
])
def test_unusable_acl_files_are_refused(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(text)
    with pytest.raises(AclConfigError, match=problem):
        PlainAcl.load(path)


def test_write_document_keeps_the_format_and_mode_and_refuses_bad_rules(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text("globalWhiteRemoteAddresses: ['10.0.0.*']\naccounts:\n- accessKey: reader1\n"
                    "  secretKey: reader-secret\n  defaultTopicPerm: SUB\n  custom: kept\n")
    path.chmod(0o640)
    doc = read_document(path)
    assert document_version(doc).counter == 0
    doc[ACCOUNTS].append({"accessKey": "writer1", "secretKey": "writer-secret", "topicPerms": ["T=PUB"]})
    rules = write_document(path, doc)
    assert set(rules.accounts) == {"reader1", "writer1"} and rules.accounts["writer1"].perms == {"T": 4}
    again = read_document(path)
    assert again[ACCOUNTS][0]["custom"] == "kept" and again[GLOBAL_WHITE] == ["10.0.0.*"]
    assert again["dataVersion"][0]["counter"] == 1 and document_version(again).counter == 1
    assert path.stat().st_mode & 0o777 == 0o640
    assert PlainAcl.load(path).accounts.keys() == rules.accounts.keys()

    before = path.read_bytes()
    again[ACCOUNTS][1]["topicPerms"] = ["T=WRITE"]
    with pytest.raises(AclConfigError, match=r"expected DENY, PUB, SUB or PUB\|SUB"):
        write_document(path, again)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["plain_acl.yml"]

    fresh = tmp_path / "new" / "plain_acl.yml"
    fresh.parent.mkdir()
    write_document(fresh, {ACCOUNTS: [{"accessKey": "admin01", "secretKey": "admin-secret", "admin": True}]})
    assert fresh.stat().st_mode & 0o777 == 0o600  # it holds secret keys
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    with pytest.raises(AclConfigError, match="cannot write"):
        write_document(not_a_dir / "plain_acl.yml", read_document(fresh))
