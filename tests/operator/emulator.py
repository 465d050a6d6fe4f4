"""A Kubernetes API emulator kopf can run against, and a harness running the real operator on it.

kmock's ``KubernetesEmulator`` stores objects but sets no resourceVersion/uid/generation and
answers a failed JSON-patch ``test`` op with 500; kopf needs both (it adds finalizers with such a
test op and matches its own patches by resourceVersion). :class:`Emulator` adds, on every write:
resourceVersion (a global counter), uid and creationTimestamp on create, generation bumped when
``spec`` changes, 422 for failed test ops, 409 for a stale resourceVersion in a patch, status
subresource semantics (the main endpoint ignores ``status``, ``/status`` changes only ``status``),
generateName, the current resourceVersion on lists, and watches that start from the requested
resourceVersion without losing writes made while the existing objects are replayed.

:class:`OperatorHarness` runs the emulator and the real kopf operator (``rmqoperator.handlers``)
each in its own thread and event loop, so tests are plain synchronous code talking HTTP to the
emulator (:class:`Client`) -- the same way kubectl would.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import logging
import os
import re
import secrets
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock._internal import dicts as kmock_dicts
from kmock._internal import enums as kmock_enums
from kmock._internal import rendering as kmock_rendering

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "brokergroups.yaml"
GROUP = "rmq.brokergroup.dev"
VERSION = "v1alpha1"
PLURAL = "brokergroups"
NS = "rmq-test"

T = TypeVar("T")
log = logging.getLogger(__name__)


def _merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge patch turning ``old`` into ``new`` (both dicts)."""
    out: dict[str, Any] = {}
    for key in old:
        if key not in new:
            out[key] = None
    for key, value in new.items():
        if key in old and isinstance(old[key], dict) and isinstance(value, dict):
            sub = _merge_diff(old[key], value)
            if sub:
                out[key] = sub
        elif key not in old or old[key] != value:
            out[key] = value
    return out


# The API server's syntax of a resource quantity (k8s.io/apimachinery resource.Quantity), as it
# validates container resources: the one field check emulated here, for the operator's 422 path.
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")


def _invalid_quantities(obj: Any) -> list[str]:
    if not isinstance(obj, dict) or obj.get("kind") != "StatefulSet":
        return []
    pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    bad = []
    for c in pod.get("containers") or []:
        for part in ("requests", "limits"):
            for name, value in ((c.get("resources") or {}).get(part) or {}).items():
                if not _QUANTITY.match(str(value)):
                    bad.append(f"spec.template.spec.containers[{c.get('name')}].resources.{part}[{name}]: "
                               f"Invalid value: {value!r}: quantities must match the regular expression")
    return bad


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API-server bookkeeping kopf relies on."""

    _rv: int = attrs.field(default=0, init=False)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _has_status(self, request: kmock_rendering.Request) -> bool:
        res = request.resource
        if res is None or res not in self.resources:
            return False
        return "status" in self.resources[res].subresources

    async def _handle(self, request: kmock_rendering.Request) -> aiohttp.web.StreamResponse:
        # No awaits in the bookkeeping below: it runs atomically with respect to other requests,
        # and kmock's own handler then applies our (complete) change under its lock.
        if request.resource is not None:
            try:
                if request.action == kmock_enums.action.CREATE and isinstance(request.data, dict):
                    self._stamp_create(request)
                elif request.action == kmock_enums.action.UPDATE and request.name is not None:
                    self._stamp_update(request)
                elif request.action == kmock_enums.action.DELETE and request.name is not None:
                    await self._mark_deleting(request)
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
        return await super()._handle(request)

    def _stamp_create(self, request: kmock_rendering.Request) -> None:
        data = request.data
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        if self._has_status(request):
            data.pop("status", None)
        bad = _invalid_quantities(data)
        if bad:
            raise kmock.KubernetesError(status=422, reason="Invalid", message="; ".join(bad))
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta["generation"] = 1
        meta["resourceVersion"] = self._next_rv()

    def _stamp_update(self, request: kmock_rendering.Request) -> None:
        assert request.resource is not None and request.name is not None
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return  # kmock answers 404
        old = copy.deepcopy(self.objects[key].raw)
        patch = request.data
        try:
            if isinstance(patch, list):
                new = jsonpatch.apply_patch(old, patch, in_place=False)
            elif isinstance(patch, dict):
                want_rv = (patch.get("metadata") or {}).get("resourceVersion")
                if want_rv and want_rv != old.get("metadata", {}).get("resourceVersion"):
                    raise kmock.KubernetesError(status=409, reason="Conflict",
                                                message="the object has been modified")
                new = copy.deepcopy(dict(kmock_dicts.patch_dict(old, patch)))  # it shares untouched parts
            else:
                raise kmock.KubernetesError(status=400, reason="BadRequest", message="unsupported patch body")
        except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict,
                jsonpointer.JsonPointerException) as exc:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc
        bad = _invalid_quantities(new)
        if bad:
            raise kmock.KubernetesError(status=422, reason="Invalid", message="; ".join(bad))
        if request.subresource == "status":
            new = {**old, "status": new.get("status")}
        elif self._has_status(request):
            new["status"] = old.get("status")
        if new.get("status") is None:
            new.pop("status", None)
        meta = new.setdefault("metadata", {})
        if new.get("spec") != old.get("spec"):
            meta["generation"] = int(old.get("metadata", {}).get("generation", 1)) + 1
        meta["resourceVersion"] = self._next_rv()
        object.__setattr__(request, "data", _merge_diff(old, new))

    async def _mark_deleting(self, request: kmock_rendering.Request) -> None:
        assert request.resource is not None and request.name is not None
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return
        obj = self.objects[key]
        meta = obj.raw.get("metadata", {})
        if meta.get("finalizers") and not meta.get("deletionTimestamp"):
            now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            obj.patch({"metadata": {"deletionTimestamp": now, "resourceVersion": self._next_rv()}})
            await self._buses[request.resource].put({"type": "MODIFIED", "object": obj.raw})

    async def _serve_watch(self, request: kmock_rendering.Request) -> AsyncIterator[kmock_rendering.Payload]:
        # kmock subscribes to the event bus only after replaying the existing objects, so a write
        # during the replay is lost and kopf waits forever for its own patch. Mark the bus first.
        assert request.resource is not None
        yield b""
        bus = self._buses[request.resource]
        mark = await bus.mark()
        try:
            # Like a real API server, a watch from resourceVersion X only sends what changed after X.
            since = request.params.get("resourceVersion", "")
            since_rv = int(since) if since.isdigit() else 0
            async with self._lock:
                replay = [{"type": "ADDED", "object": copy.deepcopy(obj.raw)}
                          for (res, ns, name), obj in self.objects.items()
                          if res == request.resource and not obj.deleted and self._wanted(request, ns, name)
                          and int(obj.raw.get("metadata", {}).get("resourceVersion") or 0) > since_rv]
            for event in replay:
                yield event
            async for event in bus.stream(since=mark):
                meta = event.get("object", {}).get("metadata", {})
                if self._wanted(request, meta.get("namespace"), meta.get("name")):
                    yield event
        finally:
            await bus.unmark(mark)

    @staticmethod
    def _wanted(request: kmock_rendering.Request, namespace: str | None, name: str | None) -> bool:
        return (request.namespace is None or namespace == request.namespace) and (
            request.name is None or name == request.name)

    async def _serve_list(self, request: kmock_rendering.Request) -> kmock_rendering.Payload:
        result = await super()._serve_list(request)
        assert isinstance(result, dict)
        result["metadata"] = {"resourceVersion": str(self._rv)}
        return result


def register_crd(emu: Emulator) -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    names = crd["spec"]["names"]
    emu.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock.ResourceInfo(
        kind=names["kind"], singular=names["singular"], namespaced=True, shortnames=set(names["shortNames"]),
        verbs={"get", "list", "watch", "create", "patch", "update", "delete"}, subresources={"status"})


# ---------------------------------------------------------------- a synchronous client for tests
class ApiFailure(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:500]}")
        self.status = status


class Client:
    """What a test (or kubectl) would do, over HTTP."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/merge-patch+json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type if method == "PATCH" else "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                text = resp.read()
                return json.loads(text) if text else None
        except urllib.error.HTTPError as exc:
            raise ApiFailure(exc.code, exc.read().decode(errors="replace")) from exc

    @staticmethod
    def path(api_version: str, plural: str, ns: str | None = NS, name: str | None = None,
             sub: str | None = None) -> str:
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        p = f"{base}/namespaces/{ns}/{plural}" if ns else f"{base}/{plural}"
        return p + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def get(self, api_version: str, plural: str, name: str, ns: str = NS) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.request("GET", self.path(api_version, plural, ns, name))
            return obj
        except ApiFailure as exc:
            if exc.status == 404:
                return None
            raise

    def items(self, api_version: str, plural: str, ns: str = NS) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.request("GET", self.path(api_version, plural, ns))["items"]
        return items

    def create(self, obj: dict[str, Any], plural: str, ns: str = NS) -> dict[str, Any]:
        created: dict[str, Any] = self.request("POST", self.path(obj["apiVersion"], plural, ns), obj)
        return created

    def patch(self, api_version: str, plural: str, name: str, patch: Any, ns: str = NS,
              sub: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self.request("PATCH", self.path(api_version, plural, ns, name, sub), patch)
        return result

    def delete(self, api_version: str, plural: str, name: str, ns: str = NS) -> None:
        try:
            self.request("DELETE", self.path(api_version, plural, ns, name))
        except ApiFailure as exc:
            if exc.status != 404:
                raise

    # BrokerGroup shortcuts
    def group(self, name: str) -> dict[str, Any] | None:
        return self.get(f"{GROUP}/{VERSION}", PLURAL, name)

    def apply_group(self, doc: dict[str, Any]) -> dict[str, Any]:
        return self.create(doc, PLURAL)

    def patch_group(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.patch(f"{GROUP}/{VERSION}", PLURAL, name, patch)

    def delete_group(self, name: str) -> None:
        self.delete(f"{GROUP}/{VERSION}", PLURAL, name)

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        evs = self.items("v1", "events")
        return [e for e in evs if reason is None or e.get("reason") == reason]


def condition(group: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((group or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def wait_for(fn: Callable[[], T | Literal[False] | None], timeout: float, what: str, interval: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    last: T | Literal[False] | None = None
    while True:
        try:
            last = fn()
        except (ApiFailure, OSError, KeyError, TypeError) as exc:
            last = None
            err: Exception | None = exc
        else:
            err = None
        if last:
            return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s (last: {last!r}, error: {err!r})")
        time.sleep(interval)


# ---------------------------------------------------------------- harness
class LoopThread:
    """An event loop in a daemon thread; ``call`` runs a coroutine there and waits for it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


class OperatorHarness:
    """The emulator (one thread) and the real operator (another), with a kubeconfig between them."""

    def __init__(self, workdir: Path, poll_seconds: float = 0.5) -> None:
        self.workdir = workdir
        self.poll_seconds = poll_seconds
        # Rolls in these tests do not wait for clients' route refresh unless a test asks to.
        self.handover_settle = 0.0
        self.emu_thread = LoopThread("k8s-emulator")
        self.emu = Emulator()
        self.emu.resources.load_bundled()
        register_crd(self.emu)
        self._server: kmock.Server | None = None
        self.url = self.emu_thread.call(self._start_server())
        self.client = Client(self.url)
        self._op_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._op_error: BaseException | None = None
        self._saved_env: dict[str, str | None] = {}

    async def _start_server(self) -> str:
        await self.emu.__aenter__()
        self._server = kmock.Server(self.emu)
        await self._server.__aenter__()
        return str(self._server.url)

    async def _stop_server(self) -> None:
        if self._server is not None:
            await self._server.__aexit__(None, None, None)
        await self.emu.__aexit__(None, None, None)

    def kubeconfig(self) -> Path:
        path = self.workdir / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "emu",
            "clusters": [{"name": "emu", "cluster": {"server": self.url}}],
            "users": [{"name": "emu", "user": {"token": "test"}}],
            "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu", "namespace": NS}}],
        }))
        return path

    def start_operator(self) -> None:
        """Run kopf with rmqoperator's handlers in its own thread (kopf owns that loop)."""
        import kopf

        import rmqoperator.handlers  # noqa: F401 - registers the handlers

        # kopf's kubeconfig login reads $KUBECONFIG when it logs in; restored in stop_operator().
        self._saved_env = {k: os.environ.get(k) for k in ("KUBECONFIG", "RMQ_OPERATOR_POLL_SECONDS",
                                                          "RMQ_OPERATOR_HANDOVER_SETTLE_SECONDS")}
        os.environ["KUBECONFIG"] = str(self.kubeconfig())
        os.environ["RMQ_OPERATOR_POLL_SECONDS"] = str(self.poll_seconds)
        os.environ["RMQ_OPERATOR_HANDOVER_SETTLE_SECONDS"] = str(self.handover_settle)
        self._stop.clear()
        self._ready.clear()

        def run() -> None:
            try:
                asyncio.run(kopf.operator(
                    clusterwide=True, standalone=True, stop_flag=self._stop,
                    ready_flag=self._ready, memo=kopf.Memo()))
            except BaseException as exc:  # surfaced by stop_operator
                self._op_error = exc

        self._op_thread = threading.Thread(target=run, name="kopf", daemon=True)
        self._op_thread.start()
        if not self._ready.wait(20):
            raise RuntimeError(f"operator did not start: {self._op_error!r}")

    def stop_operator(self) -> None:
        if self._op_thread is None:
            return
        self._stop.set()
        self._op_thread.join(30)
        self._op_thread = None
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def close(self) -> None:
        self.stop_operator()
        try:
            self.emu_thread.call(self._stop_server(), timeout=10)
        finally:
            self.emu_thread.stop()
