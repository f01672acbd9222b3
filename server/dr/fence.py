"""Stopping writes on a cluster (the switchover's fence) and seeing the stop in effect.

Every Milvus from 2.3 on reads its configuration from its etcd as well as from its files
(``<etcd.rootPath>/config/<section>/<key>``, refreshed every few seconds), and
``quotaAndLimits.limitWriting.forceDeny`` makes its proxies refuse every insert, upsert,
delete and bulk import with a rate-limit error while reads and DDL go on. The fence is that
key, written into the cluster's etcd, and lifted by deleting it again (only when it holds the
value this daemon wrote: an operator's own setting is never removed). It is in effect once a
write is refused: the probe is a delete that matches no row, in a collection of the cluster.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from replicator.config.connections import SourceSettings
from replicator.config.milvus_endpoint import milvus_param
from replicator.config.stores import etcd_client_for
from replicator.sinks.milvus_channel import client_kwargs

log = logging.getLogger(__name__)

FORCE_DENY_KEY = "quotaAndLimits/limitWriting/forceDeny"
# the value this daemon writes: Milvus reads it as true (a boolean setting parses "true")
FENCE_VALUE = b"true"
# where a hold given up before its key was written is marked, in the cluster's etcd (outside
# Milvus's config prefix), and for how long the mark is kept (a first owner that stalls longer
# between its join and its write could still write the key: a day is far beyond any lease)
CANCELLED_PREFIX = "milvus-cdc/fence-cancelled"
CANCELLED_TTL = 86_400


class FenceError(Exception):
    """The fence could not be set, seen in effect, or lifted; the message says which."""


class FenceCancelledError(FenceError):
    """The hold a fence key was to be written for was given up first: nothing written."""


class WriteFence(Protocol):
    """A stop of writes on one cluster, as a job waits for it to take (or lose) effect; who
    sets and lifts it is :mod:`fence_owners`'s business."""

    @property
    def label(self) -> str:
        """What the fence is, for the job's record and reason."""
        ...

    def in_effect(self) -> bool:
        """True once the cluster refuses writes."""
        ...


@dataclass
class EtcdQuotaFence:
    """``quotaAndLimits.limitWriting.forceDeny`` in the cluster's etcd configuration."""

    cluster: str
    source: SourceSettings
    # a write to try (True: refused); None: a delete matching nothing in a collection there
    probe: Callable[[], bool] | None = None

    @property
    def key(self) -> str:
        return f"{self.source.root_path}/config/{FORCE_DENY_KEY}"

    @property
    def label(self) -> str:
        return f"{self.key} in the etcd of cluster {self.cluster}"

    def lift(self) -> None:
        """Delete the key whoever wrote it, when it holds the fence's value: an operator's (or a
        test's) clean-up; jobs release their fences through :mod:`fence_owners`."""

        def delete(client: Any) -> None:
            value, _ = client.get(self.key)
            if value is not None and value.strip().lower() == FENCE_VALUE:
                client.delete(self.key)

        self._etcd(delete)
        log.info("fence lifted on cluster %s", self.cluster)

    def read(self) -> tuple[bytes | None, int, int, int]:
        """The key's value, modification and creation revisions (0 when absent) and the etcd
        revision of the read."""

        def get(client: Any) -> tuple[bytes | None, int, int, int]:
            response = client.get_response(self.key)
            if not response.kvs:
                return None, 0, 0, int(response.header.revision)
            kv = response.kvs[0]
            return (
                bytes(kv.value),
                int(kv.mod_revision),
                int(kv.create_revision),
                int(response.header.revision),
            )

        return self._etcd(get)  # type: ignore[no-any-return]

    def cancelled_key(self, written_after: int) -> str:
        """The mark of the hold that read etcd revision ``written_after`` before its join."""
        return f"{self.source.root_path}/{CANCELLED_PREFIX}/{written_after}"

    def create(self, written_after: int = 0) -> int:
        """Write the key if it is absent, in one transaction; the revision written, 0 when the
        key was there (someone else's). ``written_after``: the hold this write is for; when
        its mark says it was given up (:meth:`cancel_unwritten`), nothing is written and
        FenceCancelledError is raised, in the same transaction."""
        cancelled = self.cancelled_key(written_after)

        def put(client: Any) -> int:
            t = client.transactions
            compare = [t.version(self.key) == 0]
            if written_after:
                compare.append(t.version(cancelled) == 0)
            ok, responses = client.transaction(
                compare=compare,
                success=[t.put(self.key, FENCE_VALUE)],
                failure=[t.get(cancelled)] if written_after else [],
            )
            if ok:
                return int(responses[0].response_put.header.revision)
            if written_after and responses and responses[0]:
                return -1
            return 0

        revision = int(self._etcd(put))
        if revision < 0:
            raise FenceCancelledError(
                f"the fence on cluster {self.cluster} was given up (its job rolled back by "
                f"another daemon) before {self.label} was written: not written"
            )
        if revision:
            log.info("writes fenced on cluster %s (%s=true)", self.cluster, self.key)
        return revision

    def cancel_unwritten(self, written_after: int) -> bool:
        """Mark the hold that read ``written_after`` as given up while its key is absent, in
        one transaction (True): its first owner, stalled between its join and its write,
        then writes nothing (:meth:`create`), so no key outlives its hold even when that owner
        is killed right after. False: the key is there now (lift it as written)."""
        cancelled = self.cancelled_key(written_after)

        def mark(client: Any) -> bool:
            t = client.transactions
            lease = client.lease(CANCELLED_TTL)
            ok, _ = client.transaction(
                compare=[t.version(self.key) == 0],
                success=[t.put(cancelled, b"given up", lease=lease)],
                failure=[],
            )
            if not ok:
                lease.revoke()
            return bool(ok)

        return bool(self._etcd(mark))

    def delete_if(self, revision: int) -> bool:
        """Delete the key if it is still the write of ``revision``, in one transaction; False
        when it changed (or is gone)."""

        def delete(client: Any) -> bool:
            t = client.transactions
            ok, _ = client.transaction(
                compare=[t.mod(self.key) == revision], success=[t.delete(self.key)], failure=[]
            )
            return bool(ok)

        deleted = bool(self._etcd(delete))
        if deleted:
            log.info("fence lifted on cluster %s", self.cluster)
        return deleted

    def is_set(self) -> bool:
        value = self._etcd(lambda client: client.get(self.key)[0])
        return value is not None and value.strip().lower() == FENCE_VALUE

    def in_effect(self) -> bool:
        try:
            return (self.probe or self._refuses_delete)()
        except FenceError:
            raise
        except Exception as exc:
            raise FenceError(
                f"cluster {self.cluster}: the probe write could not be made: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _etcd(self, action: Callable[[Any], Any]) -> Any:
        try:
            client = etcd_client_for(self.source.etcd)
        except Exception as exc:
            raise FenceError(f"cluster {self.cluster}'s etcd: {type(exc).__name__}: {exc}") from exc
        try:
            return action(client)
        except Exception as exc:
            raise FenceError(f"cluster {self.cluster}'s etcd: {type(exc).__name__}: {exc}") from exc
        finally:
            client.close()

    def _refuses_delete(self) -> bool:
        """Try a delete that matches no row in a collection of the cluster, through its Milvus
        endpoint and every proxy the operator lists (``milvus.proxies``: each proxy picks up
        the quota on its own); True when every one of them refuses it as a write."""
        args = client_args(self.source)
        endpoints = [args["uri"], *self.source.milvus.proxies]
        return all(self._refused_at({**args, "uri": uri}) for uri in endpoints)

    def _refused_at(self, args: dict[str, Any]) -> bool:
        from pymilvus import MilvusClient
        from pymilvus.exceptions import MilvusException

        client = MilvusClient(**args, timeout=10)
        try:
            target = _a_collection(client)
            if target is None:
                raise FenceError(
                    f"cluster {self.cluster} has no collection to try a write on: the fence "
                    "cannot be seen in effect"
                )
            name, field, is_int = target
            # matches no row whatever the collection holds
            low, high = ("0", "1") if is_int else ('"a"', '"b"')
            try:
                client.delete(name, filter=f"{field} > {high} and {field} < {low}")
            except MilvusException as exc:
                if is_write_refusal(exc):
                    return True
                raise FenceError(
                    f"cluster {self.cluster}: the probe write to {args['uri']} failed: {exc}"
                ) from exc
            return False
        finally:
            client.close()


# what Milvus answers a write while forceDeny is on, and only then: "quota exceeded[reason=the
# writing has been deactivated by the administrator]" (2.3.5, code 9; ErrServiceForceDeny from
# 2.3 on). A refusal for memory or disk back-pressure ("memory quota exhausted", "disk quota
# exceeded") or a rate limit is not the fence and proves nothing.
FORCE_DENY_REFUSAL = "deactivated by the administrator"


def is_write_refusal(exc: Exception) -> bool:
    """A write refused by the cluster's forceDeny (the fence), not by other back-pressure."""
    return FORCE_DENY_REFUSAL in str(exc).lower()


def client_args(source: SourceSettings) -> dict[str, Any]:
    """``MilvusClient`` arguments for the cluster's Milvus (its login and TLS files)."""
    return client_kwargs(milvus_param(source.milvus))


def _a_collection(client: Any) -> tuple[str, str, bool] | None:
    """A collection of the default database: its name, primary key field, and whether the key
    is an integer."""
    from pymilvus import DataType

    for name in client.list_collections():
        schema = client.describe_collection(name)
        for field in schema.get("fields", []):
            if field.get("is_primary"):
                return name, field["name"], field.get("type") == DataType.INT64
    return None


def wait_in_effect(
    fence: WriteFence, timeout: float, stop: Callable[[], bool], *, effect: bool = True
) -> float:
    """Poll until the fence is in effect (``effect`` False: until it is no longer); returns the
    moment (seconds) it was first seen so. A FenceError after ``timeout`` seconds, or once
    ``stop`` says so."""
    deadline = time.monotonic() + timeout
    while True:
        if fence.in_effect() == effect:
            return time.time()
        if time.monotonic() >= deadline or stop():
            seen = "still accepted" if effect else "still refused"
            raise FenceError(f"writes were {seen} {timeout:g} s after changing {fence.label}")
        time.sleep(POLL_SECONDS)


POLL_SECONDS = 0.2  # seconds between probes
