"""GroupTransferService: group release by ack, one deadline timer for all waits, shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rmqbroker.ha.transfer import GroupTransferService
from rmqbroker.store.message_store import PutMessageStatus

OK = PutMessageStatus.PUT_OK
TIMEOUT = PutMessageStatus.FLUSH_SLAVE_TIMEOUT
NO_SLAVE = PutMessageStatus.SLAVE_NOT_AVAILABLE


def _service(timeout: float) -> GroupTransferService:
    gts = GroupTransferService(timeout, 1 << 40)
    gts.live_slaves = 1
    return gts


def _collect() -> tuple[dict[int, PutMessageStatus], Callable[[int], Callable[[PutMessageStatus], None]]]:
    got: dict[int, PutMessageStatus] = {}

    def on(end: int) -> Callable[[PutMessageStatus], None]:
        return lambda status: got.__setitem__(end, status)

    return got, on


async def test_one_ack_releases_every_wait_up_to_its_offset() -> None:
    gts = _service(5.0)
    got, on = _collect()
    for end in (100, 200, 300):
        gts.wait_then(end, on(end))
    assert got == {} and len(gts) == 3
    gts.release(250)
    assert got == {100: OK, 200: OK}
    assert gts.acked == 250 and len(gts) == 1
    gts.release(200)  # an older ack changes nothing
    assert 300 not in got and gts.acked == 250
    gts.release(300)
    assert got[300] is OK and len(gts) == 0
    # Already acknowledged: answered at once, nothing queued.
    gts.wait_then(280, on(280))
    assert got[280] is OK and len(gts) == 0


async def test_no_slave_is_answered_at_once() -> None:
    gts = GroupTransferService(5.0, 1000)
    got, on = _collect()
    gts.wait_then(10, on(10))  # no slave connected
    assert got == {10: NO_SLAVE} and len(gts) == 0
    gts.live_slaves = 1
    gts.wait_then(999, on(999))
    assert len(gts) == 1
    gts.wait_then(1000, on(1000))  # the best slave would be too far behind
    assert got[1000] is NO_SLAVE and len(gts) == 1
    gts.release(999)  # the slave caught up: the limit moves with its ack
    gts.wait_then(1998, on(1998))
    assert got[999] is OK and len(gts) == 1


async def test_waits_time_out_in_order_with_one_timer() -> None:
    gts = _service(0.15)
    got, on = _collect()
    gts.wait_then(10, on(10))
    await asyncio.sleep(0.08)
    gts.wait_then(20, on(20))
    await asyncio.sleep(0.1)  # the first deadline has passed, the second not yet
    assert got == {10: TIMEOUT}
    await asyncio.sleep(0.1)
    assert got == {10: TIMEOUT, 20: TIMEOUT} and len(gts) == 0
    # The timer re-arms for waits that come after it went idle.
    gts.wait_then(30, on(30))
    gts.release(30)
    await asyncio.sleep(0.2)
    assert got[30] is OK


async def test_an_ack_before_the_deadline_wins_and_a_failing_callback_is_contained() -> None:
    gts = _service(0.05)
    got, on = _collect()

    def boom(_status: PutMessageStatus) -> None:
        raise RuntimeError("callback failed")

    gts.wait_then(5, boom)
    gts.wait_then(10, on(10))
    gts.release(10)
    await asyncio.sleep(0.1)
    assert got == {10: OK}  # not answered a second time by the timer


async def test_shutdown_fails_every_wait_as_not_replicated() -> None:
    gts = _service(5.0)
    got, on = _collect()
    for end in (1, 2):
        gts.wait_then(end, on(end))
    gts.fail_all()
    assert got == {1: TIMEOUT, 2: TIMEOUT} and len(gts) == 0


async def test_reset_forgets_acks_of_an_earlier_term() -> None:
    gts = _service(5.0)
    got, on = _collect()
    gts.release(1000)
    gts.wait_then(500, on(500))
    assert got == {500: OK}
    gts.wait_then(2000, on(2000))
    # A role change: the log may have been truncated below 1000 and rewritten since.
    gts.reset()
    assert got[2000] is TIMEOUT and gts.acked == 0
    gts.wait_then(600, on(600))
    assert 600 not in got and len(gts) == 1  # waits for a slave of the new term
    gts.release(600)
    assert got[600] is OK
