"""Java wire names: every camelCase header field and the V2 single-letter send header live here.

Processors read request headers through :class:`Header`, which turns a missing, malformed or
out-of-range field into :class:`HeaderError` (answered with SYSTEM_ERROR and a remark naming the
field), the same outcome a Java broker gives when ``decodeCommandCustomHeader`` fails. A request
whose body cannot be used raises :class:`BadRequestError`; the server answers and counts both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from rmqbroker.remoting.codes import ResponseCode

# --- common ---
TOPIC = "topic"
QUEUE_ID = "queueId"
CONSUMER_GROUP = "consumerGroup"
PRODUCER_GROUP = "producerGroup"
CLIENT_ID = "clientID"
OFFSET = "offset"
TIMESTAMP = "timestamp"
COMMIT_OFFSET = "commitOffset"

# --- send (V1 names) ---
DEFAULT_TOPIC = "defaultTopic"
DEFAULT_TOPIC_QUEUE_NUMS = "defaultTopicQueueNums"
SYS_FLAG = "sysFlag"
BORN_TIMESTAMP = "bornTimestamp"
FLAG = "flag"
PROPERTIES = "properties"
RECONSUME_TIMES = "reconsumeTimes"
UNIT_MODE = "unitMode"
MAX_RECONSUME_TIMES = "maxReconsumeTimes"
BATCH = "batch"
BNAME = "bname"

# SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE abbreviate the V1 names to single letters.
V2_PRODUCER_GROUP = "a"
V2_TOPIC = "b"
SEND_V2_TO_V1: dict[str, str] = {
    V2_PRODUCER_GROUP: PRODUCER_GROUP,
    V2_TOPIC: TOPIC,
    "c": DEFAULT_TOPIC,
    "d": DEFAULT_TOPIC_QUEUE_NUMS,
    "e": QUEUE_ID,
    "f": SYS_FLAG,
    "g": BORN_TIMESTAMP,
    "h": FLAG,
    "i": PROPERTIES,
    "j": RECONSUME_TIMES,
    "k": UNIT_MODE,
    "l": MAX_RECONSUME_TIMES,
    "m": BATCH,
    "n": BNAME,
}

# --- PUSH_REPLY_MESSAGE_TO_CLIENT (the send header's names, and these) ---
BORN_HOST = "bornHost"
STORE_HOST = "storeHost"
STORE_TIMESTAMP = "storeTimestamp"

# --- send response ---
MSG_ID = "msgId"
QUEUE_OFFSET = "queueOffset"
MSG_REGION = "MSG_REGION"
TRACE_ON = "TRACE_ON"

# --- pull ---
MAX_MSG_NUMS = "maxMsgNums"
SUSPEND_TIMEOUT_MILLIS = "suspendTimeoutMillis"
SUBSCRIPTION = "subscription"
SUB_VERSION = "subVersion"
EXPRESSION_TYPE = "expressionType"
SUGGEST_WHICH_BROKER_ID = "suggestWhichBrokerId"
NEXT_BEGIN_OFFSET = "nextBeginOffset"
MIN_OFFSET = "minOffset"
MAX_OFFSET = "maxOffset"

# --- send back ---
GROUP = "group"
DELAY_LEVEL = "delayLevel"
ORIGIN_MSG_ID = "originMsgId"
ORIGIN_TOPIC = "originTopic"

# --- topic admin ---
READ_QUEUE_NUMS = "readQueueNums"
WRITE_QUEUE_NUMS = "writeQueueNums"
PERM = "perm"
TOPIC_FILTER_TYPE = "topicFilterType"
TOPIC_SYS_FLAG = "topicSysFlag"
ORDER = "order"

# --- subscription group administration (DELETE_SUBSCRIPTIONGROUP; the 4.9.x client names the
# offset flag removeOffset, 5.x cleanOffset) ---
GROUP_NAME = "groupName"
REMOVE_OFFSET = "removeOffset"
CLEAN_OFFSET = "cleanOffset"

# --- INVOKE_BROKER_TO_RESET_OFFSET / RESET_CONSUMER_CLIENT_OFFSET (ResetOffsetRequestHeader) ---
IS_FORCE = "isForce"

# --- GET_CONSUMER_RUNNING_INFO (GetConsumerRunningInfoRequestHeader: note clientId, not clientID) ---
RUNNING_INFO_CLIENT_ID = "clientId"
JSTACK_ENABLE = "jstackEnable"

# --- INVOKE_BROKER_TO_GET_CONSUMER_STATUS / GET_CONSUMER_STATUS_FROM_CLIENT (GetConsumerStatusRequestHeader;
# topic and group above) ---
CLIENT_ADDR = "clientAddr"

# --- QUERY_CORRECTION_OFFSET (QueryCorrectionOffsetHeader: filterGroups is comma-separated) ---
COMPARE_GROUP = "compareGroup"
FILTER_GROUPS = "filterGroups"

# --- QUERY_CONSUME_QUEUE (QueryConsumeQueueRequestHeader; topic, queueId, consumerGroup above) ---
INDEX = "index"
COUNT = "count"

# --- CLONE_GROUP_OFFSET (CloneGroupOffsetRequestHeader) ---
SRC_GROUP = "srcGroup"
DEST_GROUP = "destGroup"
OFFLINE = "offline"

# --- VIEW_BROKER_STATS_DATA (ViewBrokerStatsDataRequestHeader) and GET_BROKER_CONSUME_STATS
# (GetConsumeStatsInBrokerHeader: the field is named isOrder on the wire) ---
STATS_NAME = "statsName"
STATS_KEY = "statsKey"
IS_ORDER = "isOrder"

# --- WIPE_WRITE_PERM_OF_BROKER / ADD_WRITE_PERM_OF_BROKER responses ---
WIPE_TOPIC_COUNT = "wipeTopicCount"
ADD_TOPIC_COUNT = "addTopicCount"

# --- GET_BROKER_CONFIG (GetBrokerConfigResponseHeader: the configuration's DataVersion as JSON) ---
VERSION = "version"

# --- QUERY_MESSAGE (QueryMessageRequestHeader / QueryMessageResponseHeader) ---
KEY = "key"
MAX_NUM = "maxNum"
BEGIN_TIMESTAMP = "beginTimestamp"
END_TIMESTAMP = "endTimestamp"
INDEX_LAST_UPDATE_TIMESTAMP = "indexLastUpdateTimestamp"
INDEX_LAST_UPDATE_PHYOFFSET = "indexLastUpdatePhyoffset"

# --- plain ACL (SessionCredentials): added by a signing client; the signature covers every other
# field but the unique-key query flag ---
ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"

# --- project: a write a slave relays to its master carries the slave's address and the client's
# (host:port as the slave saw it, the message's born host); neither is signed ---
RELAYED_BY = "rmqRelayedBy"
RELAYED_FOR = "rmqRelayedFor"

# --- project: a broker's REGISTER_BROKER carries its replication epoch; the nameserver keeps a
# master of a newer epoch at brokerId 0 against an older master's registration (Java ignores it) ---
EPOCH = "rmqEpoch"

# --- transactions (EndTransactionRequestHeader, CheckTransactionStateRequestHeader) ---
TRAN_STATE_TABLE_OFFSET = "tranStateTableOffset"
COMMIT_LOG_OFFSET = "commitLogOffset"
COMMIT_OR_ROLLBACK = "commitOrRollback"
FROM_TRANSACTION_CHECK = "fromTransactionCheck"
TRANSACTION_ID = "transactionId"
OFFSET_MSG_ID = "offsetMsgId"

# --- plain ACL administration (CreateAccessConfigRequestHeader and the like; 50-54) ---
ACL_ACCESS_KEY = "accessKey"
ACL_SECRET_KEY = "secretKey"
WHITE_REMOTE_ADDRESS = "whiteRemoteAddress"
ACL_ADMIN = "admin"
DEFAULT_TOPIC_PERM = "defaultTopicPerm"
DEFAULT_GROUP_PERM = "defaultGroupPerm"
TOPIC_PERMS = "topicPerms"
GROUP_PERMS = "groupPerms"
GLOBAL_WHITE_ADDRS = "globalWhiteAddrs"
ALL_ACL_FILE_VERSION = "allAclFileVersion"

# --- nameserver registration ---
BROKER_NAME = "brokerName"
BROKER_ADDR = "brokerAddr"
CLUSTER_NAME = "clusterName"
HA_SERVER_ADDR = "haServerAddr"
BROKER_ID = "brokerId"
COMPRESSED = "compressed"
BODY_CRC32 = "bodyCrc32"
MASTER_ADDR = "masterAddr"
CHANGED = "changed"

# --- GET_TOPICS_BY_CLUSTER (GetTopicsByClusterRequestHeader: "cluster", not clusterName) ---
CLUSTER = "cluster"

# --- nameserver KV config (Put/Get/DeleteKVConfigRequestHeader, GetKVListByNamespaceRequestHeader,
# GetKVConfigResponseHeader; the key field is KEY above) ---
NAMESPACE = "namespace"
VALUE = "value"


# Java's Integer and Long: a header number outside them fails Integer/Long.parseInt there, and
# here it could not be packed into a record's int32/int64 fields.
INT32_MIN: Final = -(1 << 31)
INT32_MAX: Final = (1 << 31) - 1
INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1

_SYSTEM_ERROR: Final = int(ResponseCode.SYSTEM_ERROR)


class BadRequestError(Exception):
    """A request the client got wrong (undecodable body, illegal name, ...): answered with ``code``
    and ``remark`` by the server, which counts it per request code instead of logging a traceback."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


class HeaderError(BadRequestError):
    """A required request header field is missing, has the wrong type or is out of range."""

    def __init__(self, remark: str) -> None:
        super().__init__(_SYSTEM_ERROR, remark)


class Header:
    """Typed, validating access to a request's extFields."""

    __slots__ = ("_ext",)

    def __init__(self, ext: dict[str, str]) -> None:
        self._ext = ext

    def req_str(self, name: str) -> str:
        value = self._ext.get(name)
        if value is None:
            raise HeaderError(f"the custom field <{name}> is null")
        return value

    def opt_str(self, name: str, default: str | None = None) -> str | None:
        return self._ext.get(name, default)

    def req_int(self, name: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
        """A required number; a Java ``long`` unless the bounds say otherwise (see :meth:`req_int32`)."""
        value = self._ext.get(name)
        if value is None:
            raise HeaderError(f"the custom field <{name}> is null")
        return _parse_int(name, value, lo, hi)

    def opt_int(self, name: str, default: int, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
        value = self._ext.get(name)
        if value is None or value == "":
            return default
        return _parse_int(name, value, lo, hi)

    def req_int32(self, name: str) -> int:
        """A required Java ``int`` field."""
        return self.req_int(name, INT32_MIN, INT32_MAX)

    def opt_int32(self, name: str, default: int) -> int:
        return self.opt_int(name, default, INT32_MIN, INT32_MAX)

    def opt_bool(self, name: str, default: bool = False) -> bool:
        # Java's Boolean.parseBoolean: only "true" (any case) is true. The C++ client's "1" for
        # batch is handled by the send processor, which decides the batch policy explicitly.
        value = self._ext.get(name)
        if value is None:
            return default
        return value.lower() == "true"


def _parse_int(name: str, value: str, lo: int, hi: int) -> int:
    try:
        number = int(value)
    except ValueError as exc:
        raise HeaderError(f"the custom field <{name}> is not a number: {value!r}") from exc
    if not lo <= number <= hi:
        raise HeaderError(f"the custom field <{name}> is out of range [{lo}, {hi}]: {value!r}")
    return number


def normalize_send_v2(ext: dict[str, str]) -> dict[str, str]:
    """Map a SEND_MESSAGE_V2 header to V1 field names (unknown keys are kept as they are).

    A letter wins over its V1 name when a header carries both, whatever their order: the send
    path's fast decoding reads the letters and the ACL checks the topic and group they name
    (:func:`send_v2_field`), so a ``topic`` after ``b`` must not pick another topic than the
    one the ACL allowed."""
    out = {k: v for k, v in ext.items() if k not in SEND_V2_TO_V1}
    for letter, name in SEND_V2_TO_V1.items():
        value = ext.get(letter)
        if value is not None:
            out[name] = value
    return out


def send_v2_field(ext: Mapping[str, str], letter: str) -> str | None:
    """One field of a SEND_MESSAGE_V2 header as the send path reads it: its letter, else its V1
    name (see :func:`normalize_send_v2`)."""
    value = ext.get(letter)
    return ext.get(SEND_V2_TO_V1[letter]) if value is None else value
