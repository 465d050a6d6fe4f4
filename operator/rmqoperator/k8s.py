"""The one module that calls the Kubernetes API (plain aiohttp; credentials from kopf's login).

Works against a real API server (in-cluster service account or kubeconfig, as kopf logs in) and
against the test emulator. It uses only GET, LIST, POST, merge PATCH and DELETE (no PUT, no
server-side apply), and filters lists by label on the client side too (the emulator ignores
selectors).

RBAC the operator needs (the Helm chart grants exactly this; a namespace-scoped install grants
the namespaced rows through a Role/RoleBinding in each watched namespace):

=====================  =======================================  ==================================
API group              resources                                verbs
=====================  =======================================  ==================================
rmq.brokergroup.dev    brokergroups                             get, list, watch, patch
rmq.brokergroup.dev    brokergroups/status                      get, patch
"" (core)              events                                   create
"" (core)              configmaps, services                     get, create, patch, delete
"" (core)              secrets                                  get, create, delete
"" (core)              pods                                     list, delete
"" (core)              persistentvolumeclaims                   get, patch
batch                  jobs                                     get, list, create, delete
apps                   statefulsets                             get, create, patch, delete
policy                 poddisruptionbudgets                     get, create, patch, delete
apiextensions.k8s.io   customresourcedefinitions (cluster)      list, watch
"" (core)              namespaces (cluster)                     list, watch
=====================  =======================================  ==================================

kopf itself uses the brokergroups rows (watch, finalizer and annotation patches), posts events,
watches CRDs for resource discovery, and lists/watches namespaces when given namespace patterns.
Besides RBAC, the operator pod must reach every broker pod's admin port (``spec.ports.admin``,
default 10916) for ``GET /status``, ``POST /ha/master`` and ``POST /role`` (allow it in a
NetworkPolicy).

Replica verification (:mod:`rmqoperator.verification`): the operator creates, lists, reads and
deletes the ``rmq-verify`` Jobs, lists their pods to read the report summary from the
termination message, and reads (on group deletion deletes) the report ConfigMap
``<group>-verification``. The Job pods themselves get no API token unless
``spec.verification.serviceAccountName`` is set; that account then needs configmaps create/patch
in the group's namespace to write the report ConfigMap. The Job pods must reach every broker
pod's admin port too.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import ssl
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp

from rmqoperator.spec import API_VERSION, KIND, PLURAL

log = logging.getLogger(__name__)

Obj = dict[str, Any]

PLURALS: dict[tuple[str, str], str] = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Secret"): "secrets",
    ("v1", "Service"): "services",
    ("v1", "Pod"): "pods",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Event"): "events",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("batch/v1", "Job"): "jobs",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    (API_VERSION, KIND): PLURAL,
}

# StatefulSet spec fields the API server lets us change; the rest is immutable after creation.
STS_MUTABLE = ("replicas", "template", "updateStrategy", "persistentVolumeClaimRetentionPolicy", "minReadySeconds",
               "ordinals")
MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    """A failed API call (``status`` 0 when the server could not be reached)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def resource_path(api_version: str, kind: str, namespace: str | None, name: str | None = None,
                  sub: str | None = None) -> str:
    plural = PLURALS[(api_version, kind)]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


def is_subset(want: Any, have: Any) -> bool:
    """True when ``have`` already holds everything in ``want`` (server-added fields ignored)."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(is_subset(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    if isinstance(want, (int, float)) and not isinstance(want, bool) and isinstance(have, str):
        return str(want) == have  # quantities and int-or-string come back as strings
    return bool(want == have)


def labels_match(obj: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


class KubeApi:
    """A small async client for the calls the operator makes."""

    def __init__(self, server: str, *, headers: Mapping[str, str] | None = None,
                 ssl_context: ssl.SSLContext | bool | None = None, timeout: float = 15.0) -> None:
        self.server = server.rstrip("/")
        self.headers = dict(headers or {})
        self.ssl_context = ssl_context
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @classmethod
    def from_connection_info(cls, info: Any) -> KubeApi:
        """From a ``kopf.ConnectionInfo`` (whatever kopf's login produced)."""
        api = cls(info.server)
        api.set_credentials(info)
        return api

    def set_credentials(self, info: Any) -> None:
        self.server = str(info.server).rstrip("/")
        self.headers = dict(info.as_http_headers())
        self.ssl_context = info.as_ssl_context() if self.server.startswith("https:") else None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._closed:
            # A call after close() would open a session nobody closes.
            raise ApiError(0, "Closed", "the operator is stopping")
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, path: str, *, body: Any = None, params: Mapping[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        headers = {**self.headers, "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        try:
            async with self.session.request(method, self.server + path, data=data, params=params, headers=headers,
                                            ssl=self.ssl_context if self.ssl_context is not None else True) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    try:
                        st = json.loads(text)
                        reason, message = str(st.get("reason", "")), str(st.get("message", text))
                    except ValueError:
                        reason, message = resp.reason or "", text[:500]
                    raise ApiError(resp.status, reason, message)
                return json.loads(text) if text else None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(0, type(exc).__name__, str(exc)) from exc

    # -- generic verbs --
    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            obj: Obj = await self.request("GET", resource_path(api_version, kind, namespace, name))
            return obj
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list_objects(self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str]) -> list[Obj]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        result = await self.request("GET", resource_path(api_version, kind, namespace),
                                    params={"labelSelector": selector} if selector else None)
        return [o for o in (result or {}).get("items", []) if labels_match(o, labels)]

    async def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        created: Obj = await self.request("POST", resource_path(obj["apiVersion"], obj["kind"], meta["namespace"]),
                                          body=obj)
        return created

    async def patch(self, api_version: str, kind: str, namespace: str, name: str, patch: Obj,
                    sub: str | None = None) -> Obj:
        result: Obj = await self.request("PATCH", resource_path(api_version, kind, namespace, name, sub), body=patch,
                                         content_type=MERGE_PATCH)
        return result

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete (background propagation); False when it was already gone."""
        try:
            await self.request("DELETE", resource_path(api_version, kind, namespace, name),
                               body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"})
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise

    # -- create-or-patch --
    async def apply(self, obj: Obj, dropped_pod_meta: Mapping[str, Iterable[str]] | None = None) -> str:
        """Create ``obj`` or merge-patch the live object towards it; 'created', 'patched' or 'unchanged'.

        ``dropped_pod_meta`` ({"labels": keys, "annotations": keys}) names pod-template metadata the
        previous spec set and this one does not: removed from a live StatefulSet's template.
        """
        meta = obj["metadata"]
        live = await self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        if live is None:
            try:
                await self.create(obj)
                return "created"
            except ApiError as exc:
                if exc.status != 409:
                    raise
                live = await self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
                if live is None:
                    raise
        patch = desired_patch(obj)
        # A merge patch only adds and replaces keys: the ones no longer wanted are dropped explicitly.
        stale: Obj = {}
        if isinstance(patch.get("data"), dict):
            stale = {k: None for k in (live.get("data") or {}) if k not in patch["data"]}
        pod_stale = stale_pod_fields(obj, live)
        meta_stale = stale_pod_meta(obj, live, dropped_pod_meta or {})
        if not stale and not pod_stale and not meta_stale and is_subset(patch, live):
            return "unchanged"
        if stale:
            patch["data"] = {**patch["data"], **stale}
        if pod_stale:
            template = patch["spec"]["template"]
            template["spec"] = _merged(template["spec"], pod_stale)
        if meta_stale:
            template = patch["spec"]["template"]
            template["metadata"] = _merged(template.get("metadata") or {}, meta_stale)
        await self.patch(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"], patch)
        return "patched"

    async def ensure_created(self, obj: Obj) -> Obj:
        """Create ``obj`` unless it exists; the live object either way (never overwrites, e.g. a token)."""
        meta = obj["metadata"]
        live = await self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        if live is not None:
            return live
        try:
            return await self.create(obj)
        except ApiError as exc:
            if exc.status != 409:
                raise
            again = await self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
            if again is None:
                raise
            return again

    # -- BrokerGroup --
    async def get_group(self, namespace: str, name: str) -> Obj | None:
        return await self.get(API_VERSION, KIND, namespace, name)

    async def patch_group_status(self, namespace: str, name: str, status: Obj) -> Obj:
        return await self.patch(API_VERSION, KIND, namespace, name, {"status": status}, sub="status")

    async def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[Obj]:
        return await self.list_objects("v1", "Pod", namespace, labels)

    async def delete_pod(self, namespace: str, name: str) -> bool:
        return await self.delete("v1", "Pod", namespace, name)

    async def post_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about ``involved`` (a BrokerGroup); failures are logged, never raised."""
        meta = involved.get("metadata") or {}
        now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta.get('name')}.{uuid.uuid4().hex[:12]}", "namespace": meta.get("namespace")},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": meta.get("name"),
                               "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1000],
            "source": {"component": "rmq-operator"}, "reportingComponent": "rmq-operator",
            "reportingInstance": os.environ.get("HOSTNAME", "rmq-operator"),
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await self.create(event)
        except ApiError as exc:
            log.warning("event %s for %s not posted: %s", reason, meta.get("name"), exc)


# Pod-spec fields a StatefulSet template gets from spec.scheduling and spec.imagePullSecrets, and
# has without them when they are unset: removed from the live template when the spec drops them.
OWNED_POD_FIELDS = ("affinity", "nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets")


def deletions(want: Mapping[str, Any], have: Mapping[str, Any]) -> Obj:
    """The merge-patch nulls that remove from ``have`` every key ``want`` does not hold, at any depth
    of nested maps (lists are replaced whole by a merge patch)."""
    out: Obj = {}
    for key, value in have.items():
        if key not in want:
            out[key] = None
        elif isinstance(value, Mapping) and isinstance(want[key], Mapping):
            sub = deletions(want[key], value)
            if sub:
                out[key] = sub
    return out


def stale_pod_fields(obj: Obj, live: Obj) -> Obj:
    """For a StatefulSet: the nulls that drop scheduling fields the spec no longer sets from the
    live pod template (e.g. a required anti-affinity left beside a preferred one)."""
    if obj["kind"] != "StatefulSet":
        return {}
    want = obj["spec"]["template"]["spec"]
    have = ((live.get("spec") or {}).get("template") or {}).get("spec") or {}
    owned_want = {k: want[k] for k in OWNED_POD_FIELDS if k in want}
    owned_have = {k: have[k] for k in OWNED_POD_FIELDS if k in have}
    return deletions(owned_want, owned_have)


def stale_pod_meta(obj: Obj, live: Obj, dropped: Mapping[str, Iterable[str]]) -> Obj:
    """For a StatefulSet: the nulls that drop from the live pod template the labels and annotations
    in ``dropped`` that ``obj`` no longer has (keys others set stay: only ours are named)."""
    if obj["kind"] != "StatefulSet":
        return {}
    want = obj["spec"]["template"].get("metadata") or {}
    have = ((live.get("spec") or {}).get("template") or {}).get("metadata") or {}
    out: Obj = {}
    for part, keys in dropped.items():
        gone = {k: None for k in keys if k in (have.get(part) or {}) and k not in (want.get(part) or {})}
        if gone:
            out[part] = gone
    return out


def _merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> Obj:
    out: Obj = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def desired_patch(obj: Obj) -> Obj:
    """The merge patch that makes a live object match ``obj`` in the fields the operator owns."""
    meta = obj["metadata"]
    patch: Obj = {"metadata": {k: meta[k] for k in ("labels", "annotations", "ownerReferences") if k in meta}}
    if obj["kind"] == "StatefulSet":
        patch["spec"] = {k: v for k, v in obj["spec"].items() if k in STS_MUTABLE}
    elif "spec" in obj:
        patch["spec"] = obj["spec"]
    for key in ("data", "stringData", "type"):
        if key in obj and obj["kind"] != "Secret":
            patch[key] = obj[key]
    return patch
