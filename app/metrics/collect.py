"""Fleet series read from the database on each scrape (O1): one query per family.

Why on scrape, not kept in process memory: nodes, samples, jobs and sweeps are already rows,
written by whichever worker, replica or scheduler process handled them; reading them back at
scrape time is the one answer every worker and replica agrees on, and a stopped agent keeps
ageing with no process having to notice.

Why rendered here rather than through prometheus_client's collector objects: at 1,000 nodes x
8 GPUs the fleet is ~40,000 samples, and the client escapes and joins each sample's labels anew
(0.48 s of a 0.75 s scrape, bench/metrics.py). Here each node's and GPU's label set is escaped
once, by the same rules (backslash, quote, newline), and shared by its five GPU families.

P3: a value is shown only when it was measured. A GPU whose newest sample is older than the
freshness window (MODELFORGE_NODE_STALE_AFTER_SECONDS, the same window after which the console's
charts draw a gap) has no GPU series at all, and a metric NVML could not read has none either.
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import sqlalchemy as sa

from app.config import Settings
from app.extensions import db
from app.models import Deployment, DeploymentState, Gpu, Job, Node, NodeLease, SweepTick, TelemetrySample
from app.nodes import liveness, printable

STATUSES = (liveness.ONLINE, liveness.STALE, liveness.OFFLINE, liveness.PENDING)
MAX_LABEL_LENGTH = 200
# (family, help, column)
GPU_FAMILIES = (
    (
        "modelforge_gpu_utilization_percent",
        "GPU utilisation, newest fresh sample.",
        TelemetrySample.utilization_gpu_percent,
    ),
    ("modelforge_gpu_memory_used_bytes", "GPU memory in use, newest fresh sample.", TelemetrySample.memory_used_bytes),
    (
        "modelforge_gpu_memory_total_bytes",
        "GPU memory per its inventory (GPUs with a fresh sample).",
        Gpu.memory_total_bytes,
    ),
    ("modelforge_gpu_temperature_celsius", "GPU temperature, newest fresh sample.", TelemetrySample.temperature_c),
    ("modelforge_gpu_power_watts", "GPU power draw, newest fresh sample.", TelemetrySample.power_w),
)


def label(value: object) -> str:
    """A label value that cannot break the exposition: encodable, no control characters, bounded.

    An old row may hold a lone surrogate (not encodable), a newline or a bidi control in a node's
    name, or 4,000 characters of it.
    """
    text = printable("" if value is None else str(value))[:MAX_LABEL_LENGTH]
    if text.isprintable():  # the common case, checked in C: no control character at all
        return text
    return "".join("\ufffd" if unicodedata.category(character) == "Cc" else character for character in text)


def _escaped(value: object) -> str:
    """label(value) escaped as the text format requires: backslash, newline, double quote."""
    return label(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(**pairs: object) -> str:
    """`{name="value",…}`, each value a label(), escaped."""
    return "{" + ",".join(f'{name}="{_escaped(value)}"' for name, value in pairs.items()) + "}"


def number_text(value: object) -> str | None:
    """A stored number as the text format writes it, or None when there is none to show (P3).

    Whole numbers as they are, floats as Python's shortest round-trip repr (which Prometheus
    parses); None, infinities and NaN are not measurements.
    """
    if type(value) is float:  # the hot path: ~40,000 samples a scrape at 8,000 GPUs
        return repr(value) if math.isfinite(value) else None
    if value is None:
        return None
    if isinstance(value, int):
        return str(int(value))  # a bool as 0 or 1
    number = float(value)
    return repr(number) if math.isfinite(number) else None


@dataclass
class Family:
    """One metric family in the text format: its HELP, TYPE and sample lines."""

    name: str
    kind: str
    help: str
    lines: list[str] = field(default_factory=list)

    def add(self, label_text: str, value: object, suffix: str = "") -> None:
        """One sample, unless `value` is none (P3): `label_text` from labels() ("" for none), `suffix` like _sum."""
        text = number_text(value)
        if text is not None:
            self.lines.append(f"{self.name}{suffix}{label_text} {text}\n")

    def text(self) -> str:
        """The family as the exposition shows it."""
        return f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.kind}\n" + "".join(self.lines)


def collect(settings: Settings, now: datetime) -> list[Family]:
    """Every fleet family, read now in the current app context (a few queries, however large the fleet)."""
    families, names = _nodes(settings, now)
    return [*families, *_gpus(settings, now, names), _jobs(), *_deployments(), *_sweeps()]


def render(families: list[Family]) -> str:
    """The families in the Prometheus text format (0.0.4)."""
    return "".join(family.text() for family in families)


def _nodes(settings: Settings, now: datetime) -> tuple[list[Family], dict[str, str]]:
    by_status = Family("modelforge_nodes", "gauge", "Nodes by liveness status (L1).")
    disabled = Family("modelforge_nodes_disabled", "gauge", "Nodes the operator disabled.")
    status = Family("modelforge_node_status", "gauge", "1 for each node, labelled with its liveness status.")
    age = Family("modelforge_node_heartbeat_age_seconds", "gauge", "Seconds since the node's last heartbeat.")
    rows = db.session.execute(
        sa.select(Node.id, Node.display_name, Node.disabled, NodeLease.last_heartbeat_at).outerjoin(
            NodeLease, NodeLease.node_id == Node.id
        )
    )
    counts: Counter[str] = Counter()
    disabled_count = 0
    node_labels: dict[str, str] = {}  # node id -> its escaped node_id and node_name pairs
    since = liveness.listening_since(settings, now)
    for node_id, display_name, is_disabled, last_heartbeat_at in rows:
        pairs = node_labels[node_id] = labels(node_id=node_id, node_name=display_name)[1:-1]
        node_status, heartbeat_age = liveness.status_of(last_heartbeat_at, now, settings, since)
        counts[node_status] += 1
        disabled_count += bool(is_disabled)
        status.add(f"{{{pairs},{labels(status=node_status)[1:-1]}}}", 1)
        if heartbeat_age is not None:
            age.add(f"{{{pairs}}}", heartbeat_age)
    for value in STATUSES:
        by_status.add(labels(status=value), counts[value])
    disabled.add("", disabled_count)
    return [by_status, disabled, status, age], node_labels


def _newest_fresh_samples(cutoff: datetime) -> sa.Select:
    """Each GPU with a sample at or after `cutoff`: its node, UUID, name and GPU_FAMILIES values, newest sample.

    Per GPU, one backward probe of the (gpu_id, sampled_at) key, so the cost follows the number of
    GPUs, not of stored samples (6 h of raw samples by default). Measured at 1,000 x 8 GPUs with 200
    samples each: on PostgreSQL a LATERAL … LIMIT 1 took 0.4 s where a grouped range took 1.1 s and a
    correlated max() 1.7 s (both hash the whole table); SQLite has no LATERAL, and its correlated
    max() is a key probe there (31 ms).
    """
    labels_columns = (Gpu.node_id, Gpu.uuid, Gpu.name)
    fresh = (TelemetrySample.gpu_id == Gpu.id, TelemetrySample.sampled_at >= cutoff)
    if db.session.get_bind().dialect.name == "postgresql":
        newest = (
            sa.select(TelemetrySample)
            .where(*fresh)
            .order_by(TelemetrySample.sampled_at.desc())
            .limit(1)
            .lateral("newest")
        )
        values = (
            newest.c[column.key] if column.table is TelemetrySample.__table__ else column
            for _, _, column in GPU_FAMILIES
        )
        return sa.select(*labels_columns, *values).select_from(Gpu).join(newest, sa.true())
    newest_at = sa.select(sa.func.max(TelemetrySample.sampled_at)).where(*fresh).correlate(Gpu).scalar_subquery()
    return (
        sa.select(*labels_columns, *(column for _, _, column in GPU_FAMILIES))
        .select_from(Gpu)
        .join(TelemetrySample, sa.and_(TelemetrySample.gpu_id == Gpu.id, TelemetrySample.sampled_at == newest_at))
    )


def _gpus(settings: Settings, now: datetime, node_labels: dict[str, str]) -> list[Family]:
    cutoff = now - timedelta(seconds=settings.node_stale_after_seconds)
    rows = db.session.execute(_newest_fresh_samples(cutoff))
    families = [Family(name, "gauge", text) for name, text, _ in GPU_FAMILIES]
    info = Family("modelforge_gpu_info", "gauge", "1 for each GPU with a fresh sample, labelled with its model name.")
    targets = [(family.lines, family.name) for family in families]
    for node_id, gpu_uuid, gpu_name, *values in rows:
        gpu_labels = f'{node_labels.get(node_id, "")},gpu_uuid="{_escaped(gpu_uuid)}"'
        info.add(f'{{{gpu_labels},gpu_name="{_escaped(gpu_name)}"}}', 1)
        for (lines, name), value in zip(targets, values, strict=True):
            text = number_text(value)
            if text is not None:
                lines.append(f"{name}{{{gpu_labels}}} {text}\n")
    return [*families, info]


def _jobs() -> Family:
    jobs = Family("modelforge_jobs", "gauge", "Jobs by type and state (J2).")
    rows = db.session.execute(sa.select(Job.type, Job.state, sa.func.count()).group_by(Job.type, Job.state))
    for job_type, state, count in rows:
        jobs.add(labels(type=job_type, state=state), count)
    return jobs


def _deployments() -> list[Family]:
    """S7: deployments by state, and one series per deployment that is not stopped (its name is
    bounded by rules.DEPLOYMENT_NAME_PATTERN, so the label set stays as small as the fleet's)."""
    counts = Family("modelforge_deployments", "gauge", "Deployments by state (S2).")
    state = Family(
        "modelforge_deployment_state", "gauge", "1 for each deployment that is not stopped, labelled with its state."
    )
    found = dict(db.session.execute(sa.select(Deployment.state, sa.func.count()).group_by(Deployment.state)).all())
    for each_state in DeploymentState:  # every state, 0 too: a count that drops to none shows as 0
        counts.add(labels(state=str(each_state)), found.get(str(each_state), 0))
    live = sa.select(Deployment.name, Deployment.node_id, Deployment.state).where(
        Deployment.state != DeploymentState.STOPPED
    )
    for name, node_id, each_state in db.session.execute(live.order_by(Deployment.name)):
        state.add(labels(deployment=name, node_id=node_id, state=each_state), 1)
    return [counts, state]


def _sweeps() -> list[Family]:
    duration = Family("modelforge_sweep_duration_seconds", "summary", "Time the periodic sweeps took (L3).")
    last = Family("modelforge_sweep_last_duration_seconds", "gauge", "How long the sweep's last run took.")
    finished = Family("modelforge_sweep_last_finished_timestamp_seconds", "gauge", "When the sweep's last run ended.")
    claimed = Family("modelforge_sweep_runs_total", "counter", "Ticks the sweep was claimed for.")
    for tick in db.session.scalars(sa.select(SweepTick)):
        label_text = labels(sweep=tick.name)
        claimed.add(label_text, tick.runs or 0)
        duration.add(label_text, tick.completed_runs or 0, "_count")
        duration.add(label_text, tick.duration_seconds_total or 0.0, "_sum")
        if tick.last_duration_seconds is not None:
            last.add(label_text, tick.last_duration_seconds)
        if tick.last_finished_at is not None:
            finished.add(label_text, tick.last_finished_at.timestamp())
    return [duration, last, finished, claimed]
