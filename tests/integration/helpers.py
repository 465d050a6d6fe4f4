"""Helpers for the broker acceptance tests: C++ client subprocesses, raw remoting calls, polling.

The stock C++ client (PyPI ``rocketmq``) runs only in subprocesses (scripts in ``clients/``);
this module starts them, feeds them arguments and parses the JSON they print.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from tests.support.procs import BrokerProc, metric_value

CLIENTS = Path(__file__).parent / "clients"
PY = sys.executable

T = TypeVar("T")


def poll(fn: Callable[[], T | Literal[False] | None], timeout: float, interval: float = 0.1,
         what: str = "condition") -> T:
    """Call ``fn`` until it returns something truthy; that value, or TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | Literal[False] | None = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s (last: {last!r})")
        time.sleep(interval)


def metric_delta(before: str, after: str, name: str, **labels: str) -> float:
    """How much a counter grew between two /metrics scrapes (a sample not yet exported counts as 0)."""

    def value(text: str) -> float:
        try:
            return metric_value(text, name, **labels)
        except KeyError:
            return 0.0

    return value(after) - value(before)


# ---------------------------------------------------------------- raw remoting
def rpc(addr: str, code: int, ext: dict[str, str] | None = None, body: bytes = b"",
        timeout: float = 5.0) -> RemotingCommand:
    """One request on a fresh connection; the response."""

    async def call() -> RemotingCommand:
        client = RemotingClient()
        try:
            return await client.invoke(addr, RemotingCommand(code, ext_fields=dict(ext or {}), body=body), timeout)
        finally:
            await client.close()

    return asyncio.run(call())


def route(namesrv: str, topic: str) -> dict[str, Any] | None:
    """The nameserver's route for ``topic`` (None when it answers TOPIC_NOT_EXIST)."""
    resp = rpc(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if resp.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert resp.code == ResponseCode.SUCCESS, resp
    result: dict[str, Any] = json.loads(bytes(resp.body))
    return result


def wait_route(namesrv: str, topic: str, timeout: float = 10.0) -> dict[str, Any]:
    return poll(lambda: route(namesrv, topic), timeout, what=f"route of {topic}")


def create_topic(broker: str, topic: str, queues: int = 4, perm: int = 6) -> None:
    resp = rpc(broker, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues), "writeQueueNums": str(queues),
        "perm": str(perm), "topicFilterType": "SINGLE_TAG"})
    assert resp.code == ResponseCode.SUCCESS, resp


def create_topic_and_wait(broker: str, namesrv: str, topic: str, queues: int = 4) -> None:
    """Create a topic and wait until the nameserver routes it (consumers need the route at start)."""
    create_topic(broker, topic, queues)
    wait_route(namesrv, topic)


def send_raw(broker: str, topic: str, body: bytes, timeout: float = 10.0, sys_flag: int = 0,
             properties: str = "WAIT\x01true\x02KEYS\x01raw\x02") -> RemotingCommand:
    """SEND_MESSAGE to queue 0 without client retries: the broker's own answer.

    ``properties`` is the wire form (name\\x01value\\x02 pairs), e.g. add ``DELAY\\x011\\x02`` for level 1.
    """
    return rpc(broker, RequestCode.SEND_MESSAGE, {
        "producerGroup": "PG_RAW", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": "0", "sysFlag": str(sys_flag), "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
        "properties": properties}, body, timeout=timeout)


def wait_caught_up(master: BrokerProc, slaves: list[BrokerProc], timeout: float = 60.0) -> int:
    """Wait until every slave's commitlog ends where the master's does now; that offset."""
    target = master.status()["maxPhyOffset"]
    poll(lambda: all(s.status()["maxPhyOffset"] == target for s in slaves), timeout, what="slaves caught up")
    return int(target)


class StreamProducer:
    """A C++ producer (clients/stream_producer.py) sending ``count`` messages for at most ``seconds``.

    Its per-send JSON lines go to a file, not a pipe: a pipe nobody reads until the end fills after
    ~64 KiB and blocks the producer, so a "mid-stream" event would really happen while it waits.
    """

    def __init__(self, namesrv: str, topic: str, prefix: str, out: Path, *, count: int = 1_000_000,
                 size: int = 256, seconds: float = 60.0, settle_ms: int = 0,
                 pause_ms: int = 0) -> None:
        """``settle_ms``: see ``stream_producer.py --settle-ms``. It avoids the C++ client's first-send
        race, but the client then sends its first heartbeat to the broker only 30 s after start
        (its early heartbeats found no broker yet), so the broker does not list the producer."""
        self.out = out
        with open(out, "wb") as fh:
            self.proc = subprocess.Popen(
                [PY, str(CLIENTS / "stream_producer.py"), "--namesrv", namesrv, "--topic", topic,
                 "--count", str(count), "--prefix", prefix, "--size", str(size), "--seconds", str(seconds),
                 "--settle-ms", str(settle_ms), "--pause-ms", str(pause_ms), "--stop-on-stdin"],
                stdin=subprocess.PIPE, stdout=fh, stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def sent(self) -> int:
        """Sends completed so far (acknowledged or failed)."""
        return self.out.read_bytes().count(b"\n")

    def stop(self) -> None:
        """Ask the producer to end after the send under way (rather than at count or seconds)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.write(b"stop\n")
                self.proc.stdin.close()

    def results(self, timeout: float = 120.0) -> list[dict[str, Any]]:
        """Every send's outcome, once the producer has finished."""
        self.proc.wait(timeout)
        self.stop()  # closes our end of its stdin
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.startswith("{")]


def assert_sending(producers: list[StreamProducer], within: float = 1.0) -> None:
    """Every producer is still running and, together, they completed sends in the last moment."""
    assert all(p.running for p in producers), "a producer finished before the event under test"
    before = sum(p.sent() for p in producers)
    poll(lambda: sum(p.sent() for p in producers) > before, within, what="producers still sending")


def query_consumer_offset(broker: str, group: str, topic: str, queue_id: int) -> int | None:
    resp = rpc(broker, RequestCode.QUERY_CONSUMER_OFFSET,
               {"consumerGroup": group, "topic": topic, "queueId": str(queue_id)})
    if resp.code != ResponseCode.SUCCESS:
        return None
    return int(resp.ext_fields["offset"])


# ---------------------------------------------------------------- C++ client subprocesses
def _run_script(script: str, args: list[str], timeout: float) -> Any:
    proc = subprocess.run([PY, str(CLIENTS / script), *args], capture_output=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False)
    out = proc.stdout.decode(errors="replace")
    if proc.returncode != 0:
        raise AssertionError(f"{script} exited {proc.returncode}\nstdout:\n{out}\n"
                             f"stderr:\n{proc.stderr.decode(errors='replace')[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def message(topic: str, body: str, *, keys: str | None = None, tags: str | None = None,
            props: dict[str, str] | None = None, delay: int | None = None, shard: int | None = None,
            ) -> dict[str, Any]:
    spec: dict[str, Any] = {"topic": topic, "body": body}
    for name, value in (("keys", keys), ("tags", tags), ("props", props), ("delay", delay), ("shard", shard)):
        if value is not None:
            spec[name] = value
    return spec


def _credentials(credentials: tuple[str, str] | None) -> list[str]:
    return ["--access-key", credentials[0], "--secret-key", credentials[1]] if credentials else []


def produce(namesrv: str, messages: list[dict[str, Any]], mode: str = "sync", group: str = "PG_TEST",
            timeout: float = 60.0, credentials: tuple[str, str] | None = None,
            keep_going: bool = False, settle_ms: int = 0) -> list[dict[str, Any] | None]:
    """Send with the C++ producer; per message ``{"status", "msg_id", "offset", "sent_ms"}`` (None for oneway;
    ``{"error"}`` for a failed send with ``keep_going``). ``credentials`` (accessKey, secretKey) sign
    the requests for a broker with the plain ACL on; ``settle_ms``: see ``producer.py --settle-ms``."""
    out = _run_script("producer.py", ["--namesrv", namesrv, "--group", group, "--mode", mode,
                                      "--messages", json.dumps(messages), *_credentials(credentials),
                                      *(["--keep-going"] if keep_going else []),
                                      "--settle-ms", str(settle_ms)], timeout)
    results: list[dict[str, Any] | None] = out["results"]
    return results


def pull_all(namesrv: str, topic: str, group: str = "CG_PULL", expression: str = "*",
             props: tuple[str, ...] = (), timeout: float = 60.0,
             credentials: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """Every message of every queue of ``topic`` from offset 0, read with the C++ PullConsumer."""
    out: list[dict[str, Any]] = _run_script(
        "pull_consumer.py", ["--namesrv", namesrv, "--group", group, "--topic", topic,
                             "--expression", expression, "--props", ",".join(props),
                             *_credentials(credentials)], timeout)
    return out


class PushConsumer:
    """A C++ PushConsumer in a subprocess; its JSON events are collected by a reader thread."""

    def __init__(self, namesrv: str, group: str, topic: str, expression: str = "*", *,
                 props: tuple[str, ...] = (), fail_first: bool = False, orderly: bool = False,
                 log_dir: Path | None = None) -> None:
        args = [PY, str(CLIENTS / "push_consumer.py"), "--namesrv", namesrv, "--group", group, "--topic", topic,
                "--expression", expression, "--props", ",".join(props)]
        if fail_first:
            args.append("--fail-first")
        if orderly:
            args.append("--orderly")
        self.stderr_path = (log_dir or Path("/tmp")) / f"push-{group}-{time.monotonic_ns()}.stderr"
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "garbage", "line": line}
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()
        with self._changed:
            self.events.append({"event": "eof"})
            self._changed.notify_all()

    def __enter__(self) -> PushConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def messages(self) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("event") == "msg"]

    def wait_for(self, pred: Callable[[list[dict[str, Any]]], bool], timeout: float, what: str = "messages",
                 ) -> list[dict[str, Any]]:
        """Wait until ``pred(messages)`` holds; the messages."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                msgs = [e for e in self.events if e.get("event") == "msg"]
                if pred(msgs):
                    return msgs
                if any(e.get("event") == "eof" for e in self.events):
                    raise AssertionError(f"push consumer exited early:\n{self.stderr_text()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what} not received within {timeout}s; got {len(msgs)}: "
                                       f"{[m.get('body') for m in msgs]}")
                self._changed.wait(min(left, 0.5))

    def wait_started(self, timeout: float = 15.0) -> None:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: any(e.get("event") in ("started", "eof") for e in self.events), timeout)
            started = any(e.get("event") == "started" for e in self.events)
        if not ok or not started:
            raise AssertionError(f"push consumer did not start:\n{self.stderr_text()}")

    def wait_count(self, n: int, timeout: float) -> list[dict[str, Any]]:
        return self.wait_for(lambda m: len(m) >= n, timeout, what=f"{n} messages")

    def stderr_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.stderr_path.read_text(errors="replace")[-3000:]
        return ""

    def stop(self, timeout: float = 20.0) -> list[dict[str, Any]]:
        """Shut the consumer down cleanly (it commits its offsets); the messages it received."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write(b"stop\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._reader.join(5)
        if not self._stderr.closed:
            self._stderr.close()
        return self.messages

    @property
    def stopped_cleanly(self) -> bool:
        with self._lock:
            return any(e.get("event") == "stopped" for e in self.events)
