"""What kolo's Spark plugin (``jvm/``, ``io.kolo.spark``) tells the driver: executors added,
removed (with the cluster manager's reason) and excluded, and failed task attempts.

When the plugin's classes load in the driver JVM (``kolo.spark.plugin.configure`` put the jar on
its classpath), :func:`open_job_events` attaches the plugin's listener if the user did not
(``spark.plugins`` / ``spark.extraListeners``) and returns a :class:`JobEvents` that a launch's
driver loop polls; without the jar it returns None and nothing changes. Events come over py4j
as single-line JSON objects drained in batches from the JVM's bounded queue (nothing else is
parsed: no pickle).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

log = logging.getLogger("kolo.spark")

#: ``KOLO_SPARK_PLUGIN=0`` makes kolo ignore the plugin even when its jar is on the driver.
ENABLE_VAR = "KOLO_SPARK_PLUGIN"
#: The plugin's py4j entry point.
EVENTS_CLASS = "io.kolo.spark.KoloEvents"
#: The most events one drain takes from the JVM.
DRAIN_BATCH = 1000
#: The most undelivered events a watcher keeps (the oldest go first, as in the JVM queue).
WATCHER_CAPACITY = 4096


def events_class(sc: Any) -> Any:
    """The plugin's ``KoloEvents`` class through ``sc``'s py4j gateway, or None when the jar is
    not on the driver's classpath (or ``sc`` has no JVM, e.g. Spark Connect)."""
    jvm = getattr(sc, "_jvm", None)
    if jvm is None:
        return None
    try:
        from py4j.java_gateway import JavaClass

        candidate = jvm.io.kolo.spark.KoloEvents
    except Exception as error:  # the gateway may be closing
        log.debug("looking up %s: %s", EVENTS_CLASS, error)
        return None
    return candidate if isinstance(candidate, JavaClass) else None


class _Source:
    """Drains the driver JVM's queue and hands every event to each open watcher."""

    def __init__(self, sc: Any, cls: Any) -> None:
        self.sc = sc
        self.cls = cls
        self.lock = threading.Lock()
        self.watchers: list[collections.deque] = []
        self.dropped_seen = 0

    def open(self) -> collections.deque:
        with self.lock:
            if not self.watchers:
                # Nobody watched: what piled up belongs to no launch.
                self._drain(deliver=False)
            watcher: collections.deque = collections.deque(maxlen=WATCHER_CAPACITY)
            self.watchers.append(watcher)
            return watcher

    def close(self, watcher: collections.deque) -> None:
        with self.lock:
            self.watchers = [w for w in self.watchers if w is not watcher]

    def pump(self) -> None:
        with self.lock:
            self._drain(deliver=True)

    def _drain(self, deliver: bool) -> None:
        try:
            while True:
                text = str(self.cls.drain(DRAIN_BATCH))
                events = [_parse(line) for line in text.split("\n") if line]
                if deliver:
                    for event in events:
                        if event is not None:
                            for watcher in self.watchers:
                                watcher.append(event)
                if len(events) < DRAIN_BATCH:
                    break
            dropped = int(self.cls.dropped())
        except Exception as error:  # the context may be stopping
            log.debug("draining the kolo Spark plugin's events: %s", error)
            return
        if dropped > self.dropped_seen:
            if deliver:
                log.warning(
                    "kolo Spark plugin: its driver queue dropped %d event(s) (full); executor "
                    "losses may be noticed by heartbeats only",
                    dropped - self.dropped_seen,
                )
            self.dropped_seen = dropped


def _parse(line: str) -> Optional[dict]:
    try:
        event = json.loads(line)
    except ValueError:
        log.debug("kolo Spark plugin: not a JSON event: %.200s", line)
        return None
    return event if isinstance(event, dict) and isinstance(event.get("kind"), str) else None


#: The source of the process's SparkContext (PySpark runs one at a time).
_current: Optional[_Source] = None
_current_lock = threading.Lock()


def _source(sc: Any) -> Optional[_Source]:
    global _current
    cls = events_class(sc)
    if cls is None:
        return None
    with _current_lock:
        if _current is None or _current.sc is not sc:
            try:
                attached = bool(cls.attach(sc._jsc.sc()))
            except Exception as error:
                log.warning("kolo Spark plugin: cannot attach its listener (%s)", error)
                return None
            log.debug("kolo Spark plugin: %s", "listener attached" if attached else "in use")
            _current = _Source(sc, cls)
        return _current


@dataclass
class ExecutorLost:
    """An executor running one of a launch's tasks was lost, as Spark's driver was told."""

    executor_id: str
    host: Optional[str]
    reason: str
    #: The launch's Spark partitions (attempt numbers) that ran on it.
    partitions: list[tuple[int, int]] = field(default_factory=list)

    def describe(self) -> str:
        """e.g. ``executor 1 on host 10.0.0.7 was lost: Command exited with code 137``."""
        where = f"executor {self.executor_id}"
        if self.host:
            where += f" on host {self.host}"
        return f"{where} was lost: {self.reason}"


@dataclass
class ExecutorChange:
    """An executor added or removed (a discovery event for the elastic driver)."""

    added: bool
    executor_id: str
    host: Optional[str]
    reason: Optional[str] = None


class JobEvents:
    """The plugin's events for one launch (its Spark job group, read when events arrive)."""

    def __init__(self, source: _Source, group: Callable[[], str]) -> None:
        self.source = source
        self.group = group
        self.watcher: Optional[collections.deque] = source.open()
        #: executor id -> [(partition, attempt, host)] of this launch's task attempts on it.
        self.tasks_on: dict[str, list[tuple[int, int, Optional[str]]]] = {}
        self.lost: list[ExecutorLost] = []
        self.changes: collections.deque = collections.deque(maxlen=WATCHER_CAPACITY)

    def poll(self) -> None:
        """Takes the events that arrived since the last poll."""
        if self.watcher is None:
            return
        self.source.pump()
        group = self.group()
        while self.watcher:
            self._take(self.watcher.popleft(), group)

    def _take(self, event: dict, group: str) -> None:
        kind = event["kind"]
        executor = event.get("executorId")
        if not isinstance(executor, str):
            return
        host = event.get("host") if isinstance(event.get("host"), str) else None
        if kind == "taskStart" and event.get("group") == group:
            partition, attempt = event.get("partition"), event.get("attempt")
            if isinstance(partition, int) and isinstance(attempt, int):
                self.tasks_on.setdefault(executor, []).append((partition, attempt, host))
        elif kind == "executorAdded":
            self.changes.append(ExecutorChange(True, executor, host))
        elif kind == "executorRemoved":
            reason = str(event.get("reason") or "no reason given")
            self.changes.append(ExecutorChange(False, executor, host, reason))
            self._lose(executor, host, reason)
        elif (
            kind == "taskFailed"
            and event.get("failure") == "ExecutorLostFailure"
            and event.get("group") == group
        ):
            reason = event.get("lossReason") or event.get("reason") or "no reason given"
            self._lose(executor, host, str(reason))

    def _lose(self, executor: str, host: Optional[str], reason: str) -> None:
        tasks = self.tasks_on.pop(executor, None)
        if tasks is None:
            return
        host = host or next((h for _, _, h in tasks if h), None)
        self.lost.append(ExecutorLost(executor, host, reason, [(p, a) for p, a, _ in tasks]))

    def take_lost(self) -> list[ExecutorLost]:
        """The launch's executors lost since the last call."""
        lost, self.lost = self.lost, []
        return lost

    def take_changes(self) -> list[ExecutorChange]:
        """Executors added or removed since the last call (any executor of the application)."""
        changes = list(self.changes)
        self.changes.clear()
        return changes

    def close(self) -> None:
        """Stops watching (idempotent)."""
        if self.watcher is not None:
            self.source.close(self.watcher)
            self.watcher = None


def open_job_events(sc: Any, group: Callable[[], str]) -> Optional[JobEvents]:
    """The plugin's events for the launch whose job group ``group()`` returns, or None when
    the plugin's jar is not on the driver's classpath (or ``KOLO_SPARK_PLUGIN=0``)."""
    if os.environ.get(ENABLE_VAR, "1").strip() == "0":
        return None
    source = _source(sc)
    return None if source is None else JobEvents(source, group)


def executor_lost_error(lost: ExecutorLost, driver: Any) -> Any:
    """A :class:`~kolo.exceptions.RankFailedError` for a launch whose executor was lost: the
    executor, its host and Spark's reason, and the rank of its task when one was assigned."""
    from kolo.exceptions import RankFailedError

    partition, attempt = lost.partitions[0] if lost.partitions else (None, None)
    rank = None
    assignment = driver.assignment()
    if partition is not None and assignment is not None:
        rank = next((row["rank"] for row in assignment if row["task_index"] == partition), None)
    where = f"rank {rank}" if rank is not None else "a rank"
    if partition is not None:
        where += f" (Spark task {partition}, attempt {attempt})"
    return RankFailedError(
        f"kolo.spark.run: {where} failed: Spark {lost.describe()} (reported by the cluster "
        "manager through the kolo Spark plugin); the other ranks were stopped",
        rank=rank,
        host=lost.host or "",
        task_index=partition,
        task_attempt=attempt,
        remote_traceback=lost.reason,
    )
