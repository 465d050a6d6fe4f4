"""Java wire names: every camelCase header field and the V2 single-letter send header live here.

Processors read request headers through :class:`Header`, which turns a missing or malformed field
into :class:`HeaderError` (answered with SYSTEM_ERROR and a remark naming the field), the same
outcome a Java broker gives when ``decodeCommandCustomHeader`` fails.
"""

from __future__ import annotations

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
SEND_V2_TO_V1: dict[str, str] = {
    "a": PRODUCER_GROUP,
    "b": TOPIC,
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


class HeaderError(Exception):
    """A required request header field is missing or has the wrong type."""


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

    def req_int(self, name: str) -> int:
        value = self._ext.get(name)
        if value is None:
            raise HeaderError(f"the custom field <{name}> is null")
        try:
            return int(value)
        except ValueError as exc:
            raise HeaderError(f"the custom field <{name}> is not a number: {value!r}") from exc

    def opt_int(self, name: str, default: int) -> int:
        value = self._ext.get(name)
        if value is None or value == "":
            return default
        try:
            return int(value)
        except ValueError as exc:
            raise HeaderError(f"the custom field <{name}> is not a number: {value!r}") from exc

    def opt_bool(self, name: str, default: bool = False) -> bool:
        # Java's Boolean.parseBoolean: only "true" (any case) is true. The C++ client's "1" for
        # batch is handled by the send processor, which decides the batch policy explicitly.
        value = self._ext.get(name)
        if value is None:
            return default
        return value.lower() == "true"


def normalize_send_v2(ext: dict[str, str]) -> dict[str, str]:
    """Map a SEND_MESSAGE_V2 header to V1 field names (unknown keys are kept as they are)."""
    return {SEND_V2_TO_V1.get(k, k): v for k, v in ext.items()}
