"""Periodic sweeps under APScheduler, each exactly once per tick however many schedulers run (L3).

One scheduler runs per control-plane process group — its own process, started and watched by
the gunicorn master, never one per worker. Several replicas on one PostgreSQL each run one,
and every tick is claimed in the database by a conditional UPDATE whose row count picks the
one scheduler that runs it:

    UPDATE sweep_ticks SET last_tick = :tick, runs = runs + 1 WHERE name = :name AND last_tick < :tick

Ticks are wall-clock numbers (floor(now / interval)), so every scheduler agrees on them.

The control plane's own downtime is no node's outage (L1, J2): the sweeps that judge silence
(liveness, job leases) record in their row when it could hear again (`heard_since`) on their
first run after it could not: after their last run failed (the database was down, unreachable
or full), or when a scheduler starts after a gap in their ticks (no scheduler ran). The sweeps
then hold silence from before that moment (app.nodes.liveness.heard_since).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.interval import IntervalTrigger
from flask import Flask
from sqlalchemy.exc import SQLAlchemyError

from app.alerts import sweep as alerts
from app.config import Settings, current_settings
from app.db import insert_ignoring_duplicates
from app.extensions import db
from app.jobs import queue
from app.models import SweepTick
from app.nodes import enrollment, liveness, retention
from app.timeutil import utcnow

log = logging.getLogger("modelforge.scheduler")
RETENTION_INTERVAL_SECONDS = 60
_ticks = SweepTick.__table__
_CREATE_TICK = insert_ignoring_duplicates(_ticks)
# The sweeps that judge silence, so hold it after the control plane could not hear.
JUDGES_SILENCE = (liveness.LIVENESS_SWEEP, queue.LEASE_SWEEP)
# A scheduler that starts finds the control plane was deaf when the sweep's last claim is older
# than this many intervals: at least one tick went by with no scheduler able to run it.
GAP_INTERVALS = 2


class Hearing:
    """What this scheduler saw of each sweep that judges silence: whether it has run one yet, and
    whether its last attempt failed. It decides only when to record `heard_since`; the record
    itself is in the database, where every worker and replica reads it."""

    def __init__(self) -> None:
        self.ran: set[str] = set()
        self.failed: set[str] = set()

    def deaf_before(self, name: str, interval: int, now: datetime) -> datetime | None:
        """A previous claim older than this means the control plane could not hear since; None: no question."""
        if name not in JUDGES_SILENCE:
            return None
        if name in self.failed:
            return now
        if name not in self.ran:
            return now - timedelta(seconds=GAP_INTERVALS * interval)
        return None


def holder_name() -> str:
    """Who claimed a tick: host and process, for the operator reading sweep_ticks."""
    return f"{socket.gethostname()}:{os.getpid()}"


def claim_tick(name: str, tick: int, holder: str, deaf_before: datetime | None = None) -> bool:
    """True for exactly one caller per (name, tick): the row count decides (L3).

    With `deaf_before`, a previous claim older than it means the control plane could not hear
    in between, so the claim records now as the sweep's `heard_since` (in the same UPDATE: its
    SET reads the previous claim). A row never claimed before records nothing: a new database.
    """
    now = utcnow()
    values = {"last_tick": tick, "holder": holder, "claimed_at": now, "runs": _ticks.c.runs + 1}
    if deaf_before is not None:
        values["heard_since"] = sa.case(
            (_ticks.c.claimed_at < deaf_before, sa.literal(now, SweepTick.heard_since.type)),
            else_=_ticks.c.heard_since,
        )
    connection = db.session.connection()
    connection.execute(_CREATE_TICK[connection.dialect.name], {"name": name, "last_tick": 0, "runs": 0})
    claimed = connection.execute(
        _ticks.update().where(_ticks.c.name == name, _ticks.c.last_tick < tick).values(**values)
    ).rowcount
    db.session.commit()
    return claimed == 1


def record_duration(name: str, seconds: float) -> None:
    """O1: how long this run of `name` took, for GET /metrics, whichever process ran it."""
    db.session.execute(
        _ticks.update()
        .where(_ticks.c.name == name)
        .values(
            last_duration_seconds=seconds,
            last_finished_at=utcnow(),
            duration_seconds_total=_ticks.c.duration_seconds_total + seconds,
            completed_runs=_ticks.c.completed_runs + 1,
        )
    )
    db.session.commit()


def sweeps(settings: Settings) -> dict[str, tuple[int, Callable[[], dict[str, int]]]]:
    """Each sweep's name, interval and work."""
    found = {
        liveness.LIVENESS_SWEEP: (settings.sweep_interval_seconds, lambda: liveness.sweep(settings)),
        "enrollment-expiry": (settings.sweep_interval_seconds, lambda: {"expired": enrollment.sweep_expired()}),
        "telemetry-retention": (RETENTION_INTERVAL_SECONDS, lambda: retention.sweep(settings)),
        # J2: a job whose agent went silent is requeued within one tick after its lease.
        queue.LEASE_SWEEP: (settings.sweep_interval_seconds, lambda: queue.sweep_expired_leases(settings=settings)),
        # O2: alerts follow the audit trail within a tick; each delivery is claimed once. Always
        # scheduled, as the console adds targets while it runs; without any the sweep reads one
        # table and writes nothing.
        "alerts": (settings.sweep_interval_seconds, lambda: alerts.sweep(settings)),
    }
    return found


def run_if_due(
    app: Flask,
    name: str,
    interval: int,
    work: Callable[[], dict[str, int]],
    holder: str,
    hearing: Hearing | None = None,
) -> bool:
    """Claim this tick of `name` and run it; False when another scheduler has it."""
    hearing = hearing or Hearing()
    tick = int(time.time() // interval)
    with app.app_context():
        try:
            deaf_before = hearing.deaf_before(name, interval, utcnow())
            if not claim_tick(name, tick, holder, deaf_before):
                return False
            hearing.ran.add(name)
            if name in hearing.failed or deaf_before is not None:
                _log_hold(app, name)
            hearing.failed.discard(name)
            started = time.perf_counter()
            result = work()
            record_duration(name, time.perf_counter() - started)
        except SQLAlchemyError as error:
            db.session.rollback()
            if name in JUDGES_SILENCE:
                hearing.failed.add(name)
            log.warning("sweep %s tick %d failed: %s", name, tick, type(error).__name__)
            return False
        finally:
            db.session.remove()
    if any(result.values()):
        log.info("sweep %s tick %d: %s", name, tick, result)
    return True


def _log_hold(app: Flask, name: str) -> None:
    """Say when this sweep holds judgment, and until when (once, as the hold begins)."""
    settings = current_settings(app)
    since = db.session.scalar(sa.select(SweepTick.heard_since).where(SweepTick.name == name))
    if since is not None and (utcnow() - since).total_seconds() < 1 + settings.sweep_interval_seconds:
        log.warning(
            "sweep %s: the control plane could not hear (scheduler start after a gap, or a failed sweep); "
            "silence from before %s is not judged for %.0f s",
            name,
            since.isoformat(timespec="seconds"),
            liveness.hearing_hold_seconds(settings),
        )


def build(app: Flask, scheduler: BaseScheduler) -> BaseScheduler:
    """Add every sweep to `scheduler`; jobs fire just after each wall-clock tick boundary."""
    settings = current_settings(app)
    holder = holder_name()
    hearing = Hearing()
    now = time.time()
    for name, (interval, work) in sweeps(settings).items():
        first = (math.floor(now / interval) + 1) * interval + 0.05
        scheduler.add_job(
            run_if_due,
            IntervalTrigger(seconds=interval, start_date=datetime.fromtimestamp(first, UTC)),
            args=(app, name, interval, work, holder, hearing),
            id=name,
            misfire_grace_time=max(1, interval // 2),
        )
    return scheduler


def main(argv: list[str] | None = None) -> int:
    """`python -m app.scheduler --parent-pid PID`: the sweep process that gunicorn's master starts.

    It is a fresh interpreter, not a fork, so it shares no database connection or lock with
    the web workers; it exits when its parent does.
    """
    parser = argparse.ArgumentParser(prog="python -m app.scheduler")
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # not a line per job run
    from app import ConfigError, create_app

    try:
        app = create_app()
    except ConfigError as error:
        print(f"modelforge: configuration error: {error}", file=sys.stderr)
        return 2
    scheduler = build(app, BackgroundScheduler(timezone=UTC, job_defaults={"coalesce": True, "max_instances": 1}))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    scheduler.start()
    log.info("scheduler %s started: %s", holder_name(), ", ".join(sweeps(current_settings(app))))
    while not stop.wait(1.0):
        if args.parent_pid is not None and os.getppid() != args.parent_pid:
            log.warning("scheduler %s: the control plane that started it is gone; exiting", holder_name())
            break
    scheduler.shutdown(wait=True)
    return 0


def run_all_now(settings: Settings) -> dict[str, dict[str, int]]:
    """Run every sweep once, now, without claiming a tick (for `flask modelforge sweep`)."""
    return {name: work() for name, (_, work) in sweeps(settings).items()}


def sweep_runs() -> dict[str, int]:
    """How many times each sweep has run, across every scheduler."""
    return dict(db.session.execute(sa.select(SweepTick.name, SweepTick.runs)).all())


if __name__ == "__main__":
    sys.exit(main())
