"""Where the time of a :func:`kolo.spark.run` launch went, from the times the launch records.

The driver records when ``run`` was called, when it started the job driver service and when
it submitted the barrier stage; each barrier task returns when it started
(its row); each rank process sends when it was created, when its interpreter started, when
``kolo`` was imported, when it joined the job and when its function was unpickled
(:mod:`kolo._launch_times`). A step's time on the critical path is when the *last* rank
passed it (the launch waits for every rank), so the phases below add up to the time from the
call to the moment every rank's function started:

``setup`` (argument checks, pickling, slots, the driver's address), ``driver_service`` (the
job driver service started, the payload published), ``spark_scheduling`` (stage submitted until
every task ran: scheduling, Python workers, task deserialisation), ``process_spawn`` (until
every rank process was created), ``python_start`` (until every interpreter ran),
``warm_fork`` (only when ranks came from a warm rank server, :mod:`kolo.spark._warm_server`:
until every such rank was forked; their ``python_start`` is their client's),
``kolo_import``, ``rendezvous`` (until every rank joined: registration and rank assignment),
``payload`` (fetching and unpickling the function, with the modules it imports).

Tasks and ranks on other hosts report their own clocks: across hosts the phases from
``spark_scheduling`` on carry the clocks' offset (on one host they are exact). A step a rank did
not report (an older kolo on the executors, no ``/proc``) is skipped, its time going to the
next phase.

Example::

    reports = []
    kolo.spark.run(fn, num_proc=2, _on_launch_report=reports.append)
    print(reports[0].describe())
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

#: The driver's steps, in order (``called`` first).
DRIVER_STEPS = ("called", "service_starting", "submitted")
#: Each phase: its name and the step that ends it (the previous phase's step starts it).
PHASES = (
    ("setup", "service_starting"),
    ("driver_service", "submitted"),
    ("spark_scheduling", "task_started"),
    ("process_spawn", "process"),
    ("python_start", "interpreter"),
    ("warm_fork", "forked"),
    ("kolo_import", "kolo_imported"),
    ("rendezvous", "joined"),
    ("payload", "payload_loaded"),
)


@dataclass
class LaunchReport:
    """The recorded times of one launch (unix seconds) and the breakdown they give.

    Example::

        for name, seconds in report.phases():
            print(f"{name:18s} {seconds:6.3f} s")
    """

    #: Number of ranks.
    num_proc: int
    #: The driver's steps (``DRIVER_STEPS``) by name.
    driver: dict[str, float] = field(default_factory=dict)
    #: When each barrier task started, by task index.
    tasks: dict[int, float] = field(default_factory=dict)
    #: Each rank process's step times (``kolo._launch_times.RANK_STEPS``), by task index.
    ranks: dict[int, dict[str, float]] = field(default_factory=dict)

    def mark(self, step: str) -> None:
        """Records that the driver passed ``step`` now."""
        self.driver[step] = time.time()

    def complete(self) -> bool:
        """Whether every task and every rank reported its times."""
        return len(self.tasks) >= self.num_proc and len(self.ranks) >= self.num_proc

    def step_time(self, step: str) -> Optional[float]:
        """When the last rank (or the driver) passed ``step``; None when nobody reported it."""
        if step in self.driver:
            return self.driver[step]
        if step == "task_started":
            values = list(self.tasks.values())
        else:
            values = [times[step] for times in self.ranks.values() if step in times]
        return max(values) if values else None

    def milestones(self) -> list[tuple[str, float]]:
        """``(phase, unix time it ended)`` for every phase with a recorded end, after
        ``("called", t0)``; times never go back (a clock offset across hosts or the 10 ms
        resolution of a process's creation time gives a phase 0, not a negative time)."""
        called = self.driver.get("called")
        if called is None:
            return []
        out = [("called", called)]
        for name, step in PHASES:
            at = self.step_time(step)
            if at is not None:
                out.append((name, max(at, out[-1][1])))
        return out

    def phases(self) -> list[tuple[str, float]]:
        """``(phase, seconds)`` in order; they add up to :meth:`total`."""
        points = self.milestones()
        return [(name, at - points[i][1]) for i, (name, at) in enumerate(points[1:])]

    def total(self) -> float:
        """Seconds from the call to the last recorded step (every rank's function started)."""
        points = self.milestones()
        return points[-1][1] - points[0][1] if points else 0.0

    def warm_ranks(self) -> list[int]:
        """The tasks whose rank process a warm rank server forked."""
        return sorted(task for task, times in self.ranks.items() if "forked" in times)

    def describe(self) -> str:
        """One line: the total and each phase, in seconds.

        Example::

            'launch 1.234 s to every rank's function: setup 0.002, driver_service 0.020, ...'
        """
        parts = ", ".join(f"{name} {seconds:.3f}" for name, seconds in self.phases())
        missing = "" if self.complete() else " (some ranks did not report their times)"
        warm = len(self.warm_ranks())
        how = f"; {warm} of {self.num_proc} rank(s) forked by a warm rank server" if warm else ""
        return f"launch {self.total():.3f} s to every rank's function{missing}: {parts}{how}"
