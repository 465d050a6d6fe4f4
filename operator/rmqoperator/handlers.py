"""kopf handlers: thin adapters from kopf's events to :class:`~rmqoperator.controller.GroupController`.

Importing this module registers the handlers in kopf's default registry (``kopf run -m
rmqoperator.handlers`` or ``rmq-operator``).

* create / update / resume -> ``ensure``: validate, create-or-patch children (update also fires
  for annotation changes: ``rmq.brokergroup.dev/paused: "true"`` pauses reconciliation -- no
  child is changed, no role is changed, no pod is restarted, the status keeps being updated --
  and a new ``rmq.brokergroup.dev/restart-at`` value requests a rolling restart);
* delete -> ``cleanup`` (behind kopf's finalizer, so children are removed even where no garbage
  collector follows owner references);
* a per-group daemon polls the brokers every ``RMQ_OPERATOR_POLL_SECONDS`` (default 1 s) and
  drives failover, re-pointing, rolling restarts, replica verification Jobs (on
  ``spec.verification.schedule`` and on a new ``rmq.brokergroup.dev/verify-now`` value) and the
  status.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from rmqoperator.controller import HANDOVER_SETTLE_SECONDS, Runtime, TemporaryFailure
from rmqoperator.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)


def runtime(memo: Any) -> Runtime:
    rt = getattr(memo, "rmq", None)
    if rt is None:
        rt = Runtime(poll_interval=float(os.environ.get("RMQ_OPERATOR_POLL_SECONDS", "1.0")),
                     handover_settle=float(os.environ.get("RMQ_OPERATOR_HANDOVER_SETTLE_SECONDS",
                                                          str(HANDOVER_SETTLE_SECONDS))))
        memo.rmq = rt
    assert isinstance(rt, Runtime)
    return rt


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf's bookkeeping goes to annotations (the CRD's status schema is ours) under a prefix of its
    # own: kopf leaves annotations under its storage prefix out of diffs, and the pause/restart-at
    # annotations under rmq.brokergroup.dev/ must trigger the update handler.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=f"kopf.{GROUP}")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=f"kopf.{GROUP}",
                                                                            key="last-handled-configuration")
    # One operator replica (the chart's Deployment uses Recreate): no peering resources needed.
    settings.peering.standalone = True
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30
    runtime(memo)


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    await runtime(memo).close()


@kopf.on.login()
def login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """Service account in a pod, else kubeconfig; the same credentials serve our own API client."""
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if info is not None:
        runtime(memo).set_credentials(info)
    return info


def _retry(exc: TemporaryFailure) -> kopf.TemporaryError:
    return kopf.TemporaryError(str(exc), delay=5)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def ensure(body: kopf.Body, name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    try:
        await runtime(memo).controller(namespace or "default", name).ensure(body)
    except TemporaryFailure as exc:
        raise _retry(exc) from exc


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete(body: kopf.Body, name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    rt = runtime(memo)
    try:
        await rt.controller(namespace or "default", name).cleanup(body)
    except TemporaryFailure as exc:
        raise _retry(exc) from exc
    rt.forget(namespace or "default", name)


# How long a stopping operator lets the round under way finish before kopf cancels it: a round
# cut short between a promotion and its status write leaves the next operator to adopt it. Under
# the pod's default terminationGracePeriodSeconds (30 s), with kopf's 5 s cancellation after it.
ROUND_FINISH_SECONDS = 20.0


@kopf.daemon(GROUP, VERSION, PLURAL, id="poller", cancellation_backoff=ROUND_FINISH_SECONDS,
             cancellation_timeout=5.0)
async def poller(stopped: kopf.DaemonStopped, body: kopf.Body, name: str, namespace: str | None, memo: Any,
                 logger: kopf.Logger, **_: Any) -> None:
    rt = runtime(memo)
    while not stopped:
        try:
            await rt.controller(namespace or "default", name).tick(body)
        except TemporaryFailure as exc:
            logger.info("poll skipped: %s", exc)
        except Exception:
            # Never let one bad round kill the poller: failover depends on it.
            logger.exception("poll round failed")
        await stopped.wait(rt.poll_interval)
