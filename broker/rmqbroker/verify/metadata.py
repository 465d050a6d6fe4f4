"""Metadata agreement between a master and a slave (``GET /metadata`` of each, reference §5).

* Topic configs and subscription groups: the slave's DataVersion must equal the master's (slaves
  copy it on sync, §7.6) and so must the content; the same DataVersion with different content is
  reported per entry, which is exactly what a sync can never repair (it only copies on a version
  change).
* Consumer offsets: slaves merge the master's table, so a slave offset beyond the master's for
  the same ``topic@group`` and queue means the slave holds progress the master never had.
  Entries the master lacks are not reported (the master may have removed them; slaves never do).
"""

from __future__ import annotations

import json
from typing import Any

from rmqbroker.verify.model import CONSUMER_OFFSET_AHEAD, SUBSCRIPTION_GROUP, TOPIC_CONFIG, Mismatch


def _dv(obj: Any) -> tuple[int, int] | None:
    if not isinstance(obj, dict):
        return None
    try:
        return int(obj.get("counter", 0)), int(obj.get("timestamp", 0))
    except (TypeError, ValueError):
        return None


def _table(obj: Any, key: str) -> dict[str, Any]:
    table = obj.get(key) if isinstance(obj, dict) else None
    return table if isinstance(table, dict) else {}


def _compare_versioned(replica: str, kind: str, master: Any, slave: Any, table_key: str,
                       entry_is_topic: bool) -> list[Mismatch]:
    out: list[Mismatch] = []
    mdv = _dv(master.get("dataVersion") if isinstance(master, dict) else None)
    sdv = _dv(slave.get("dataVersion") if isinstance(slave, dict) else None)
    same_version = mdv == sdv
    if not same_version:
        out.append(Mismatch(replica, kind, field="dataVersion", expected=json.dumps(mdv), actual=json.dumps(sdv),
                            detail=f"{table_key}: DataVersion (counter, timestamp) differs"))
    mt, st = _table(master, table_key), _table(slave, table_key)
    note = " although the DataVersion is the same" if same_version else ""
    for name in sorted(set(mt) | set(st)):
        a, b = mt.get(name), st.get(name)
        if a == b:
            continue
        m = Mismatch(replica, kind, field=f"{table_key}.{name}")
        if entry_is_topic:
            m.topic = name
        if b is None:
            m.detail = f"{name} is missing on the replica{note}"
        elif a is None:
            m.detail = f"{name} exists only on the replica{note}"
        else:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            m.detail = f"{name} differs in {', '.join(keys)}{note}"
        m.expected = None if a is None else json.dumps(a, sort_keys=True)
        m.actual = None if b is None else json.dumps(b, sort_keys=True)
        out.append(m)
    return out


def compare_metadata(replica: str, master: dict[str, Any], slave: dict[str, Any]) -> list[Mismatch]:
    """Everything in which ``slave``'s metadata disagrees with ``master``'s (both ``GET /metadata``)."""
    out = _compare_versioned(replica, TOPIC_CONFIG, master.get("topics"), slave.get("topics"),
                             "topicConfigTable", True)
    out += _compare_versioned(replica, SUBSCRIPTION_GROUP, master.get("subscriptionGroups"),
                              slave.get("subscriptionGroups"), "subscriptionGroupTable", False)
    moff = _table(master.get("consumerOffsets"), "offsetTable")
    soff = _table(slave.get("consumerOffsets"), "offsetTable")
    for key in sorted(soff):
        mq = moff.get(key)
        sq = soff[key]
        if not isinstance(mq, dict) or not isinstance(sq, dict):
            continue
        topic, _, group = key.rpartition("@")
        for qid in sorted(sq, key=lambda q: int(q) if str(q).isdigit() else 0):
            if qid not in mq:
                continue
            try:
                a, b = int(mq[qid]), int(sq[qid])
            except (TypeError, ValueError):
                continue
            if b > a:
                out.append(Mismatch(replica, CONSUMER_OFFSET_AHEAD, topic=topic, queue_id=int(qid), field=group,
                                    expected=str(a), actual=str(b),
                                    detail=f"group {group}: replica offset {b} is ahead of the master's {a}"))
    return out
