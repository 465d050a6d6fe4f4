"""Delay-level delivery (reference §6.1): moves due messages from SCHEDULE_TOPIC_XXXX to their topic.

Runs on masters only. Each level's queue is read in order from the offset in delayOffset.json;
a message is re-put to REAL_TOPIC/REAL_QID once its delivery time (the CQ tagsCode) has passed.
"""

from __future__ import annotations

import asyncio
import logging
import time

from rmqbroker.metadata.delay_offsets import DelayOffsetTable
from rmqbroker.store import record as rec
from rmqbroker.store.errors import CorruptRecordError
from rmqbroker.store.message_store import SCHEDULE_TOPIC, MessageInner, MessageStore, PutMessageStatus

log = logging.getLogger(__name__)

POLL_SECONDS = 0.1
ERROR_BACKOFF_SECONDS = 10.0
BATCH = 64


class ScheduleMessageService:
    """One loop over all levels; sleeps until the next message is due (at most 100 ms)."""

    def __init__(self, store: MessageStore, offsets: DelayOffsetTable, levels_ms: tuple[int, ...]) -> None:
        self.store = store
        self.offsets = offsets
        self.levels_ms = levels_ms
        self.delivered = 0

    def correct_offsets(self) -> None:
        """Take each level's offset back to its queue's end where it is beyond it.

        A promoted slave's offsets are its master's, copied by the metadata sync; when its log had
        not caught up, a level's offset is beyond that level's queue, and the delayed messages sent
        to the new master (stored from the queue's end on) would never be delivered. RocketMQ's
        correctDelayOffset does the same when the schedule service starts. Called when the broker
        becomes a master (at start too: recovery may have cut a level's queue), before it serves a
        send in that role.
        """
        for level in range(1, len(self.levels_ms) + 1):
            offset = self.offsets.get(level, 0)
            end = self.store.get_max_offset_in_queue(SCHEDULE_TOPIC, level - 1)
            if offset > end:
                log.warning("delay level %d offset %d is beyond its queue's end %d; delivering from there", level,
                            offset, end)
                self.offsets.set(level, end)

    async def run(self) -> None:
        while True:
            try:
                wait, due = self.collect_due()
                for msg, level, next_offset in due:
                    result = await self.store.put_message(msg)
                    if result.status is not PutMessageStatus.PUT_OK:
                        # Leave the offset: the message is retried after the back-off.
                        raise RuntimeError(f"re-put to {msg.topic} failed: {result.status.name}")
                    self.delivered += 1
                    self.offsets.set(level, next_offset)
            except Exception:
                log.exception("delay delivery failed; retrying in %.0fs", ERROR_BACKOFF_SECONDS)
                wait = ERROR_BACKOFF_SECONDS
            await asyncio.sleep(wait)

    def collect_due(self, now_ms: int | None = None) -> tuple[float, list[tuple[MessageInner, int, int]]]:
        """Due messages of every level (with the level offset after each) and the time to sleep."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        due: list[tuple[MessageInner, int, int]] = []
        wait = POLL_SECONDS
        for level in range(1, len(self.levels_ms) + 1):
            qid = level - 1
            offset = max(self.offsets.get(level, 0), self.store.get_min_offset_in_queue(SCHEDULE_TOPIC, qid))
            for phy, _size, deliver_at in self.store.get_consume_queue_units(SCHEDULE_TOPIC, qid, offset, BATCH):
                if deliver_at > now_ms:
                    wait = min(wait, (deliver_at - now_ms) / 1000)
                    break
                offset += 1
                msg = self._restore(phy)
                if msg is not None:
                    due.append((msg, level, offset))
                else:
                    self.offsets.set(level, offset)
        return (0.0 if due else max(wait, 0.001)), due

    def _restore(self, phy: int) -> MessageInner | None:
        raw = self.store.look_message_by_offset(phy)
        if raw is None:
            log.warning("delayed message at %d vanished; skipping", phy)
            return None
        try:
            r = rec.decode_record(raw, 0)
        except CorruptRecordError:
            log.exception("delayed message at %d is corrupt; skipping", phy)
            return None
        props = dict(r.properties)
        topic = props.get(rec.REAL_TOPIC)
        qid = props.get(rec.REAL_QID)
        if topic is None or qid is None or not qid.lstrip("-").isdigit():
            log.warning("delayed message at %d lacks REAL_TOPIC/REAL_QID; skipping", phy)
            return None
        props.pop(rec.DELAY, None)
        props[rec.WAIT] = "false"
        return MessageInner(topic=topic, queue_id=int(qid), flag=r.flag, body=r.body, properties=props,
                            sys_flag=r.sys_flag, born_timestamp=r.born_timestamp, born_host=r.born_host,
                            reconsume_times=r.reconsume_times)
