"""Fleet series read from the database on each scrape (O1): one query per family.

Why on scrape, not kept in process memory: nodes, samples, jobs and sweeps are already rows,
written by whichever worker, replica or scheduler process handled them; reading them back at
scrape time is the one answer every worker and replica agrees on, and a stopped agent keeps
ageing with no process having to notice. bench/metrics.py measures the scrape at 1,000 nodes x
8 GPUs.

P3: a value is shown only when it was measured. A GPU whose newest sample is older than the
freshness window (MODELFORGE_NODE_STALE_AFTER_SECONDS, the same window after which the console's
charts draw a gap) has no GPU series at all, and a metric NVML could not read has none either.
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta

import sqlalchemy as sa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

from app import liveness
from app.config import Settings
from app.extensions import db
from app.models import Gpu, Job, Node, NodeLease, SweepTick, TelemetrySample
from app.nodes import printable

STATUSES = (liveness.ONLINE, liveness.STALE, liveness.OFFLINE, liveness.PENDING)
MAX_LABEL_LENGTH = 200
NODE_LABELS = ["node_id", "node_name"]
GPU_LABELS = ["node_id", "node_name", "gpu_uuid", "gpu_name"]
# (family, help, sample column or None for the inventory's total memory, scale to the unit)
GPU_FAMILIES = (
    ("modelforge_gpu_utilization_percent", "GPU utilisation, newest fresh sample.", "utilization_gpu_percent"),
    ("modelforge_gpu_memory_used_bytes", "GPU memory in use, newest fresh sample.", "memory_used_bytes"),
    ("modelforge_gpu_memory_total_bytes", "GPU memory, as the inventory reports it.", None),
    ("modelforge_gpu_temperature_celsius", "GPU temperature, newest fresh sample.", "temperature_c"),
    ("modelforge_gpu_power_watts", "GPU power draw, newest fresh sample.", "power_w"),
)


def label(value: object) -> str:
    """A label value that cannot break the exposition: encodable, no control characters, bounded.

    prometheus_client escapes backslash, quote and newline itself; what it cannot do is encode a
    lone surrogate (an old row may hold one) or keep a 4,000-character name readable.
    """
    text = printable("" if value is None else str(value))
    text = "".join("\ufffd" if unicodedata.category(character) == "Cc" else character for character in text)
    return text[:MAX_LABEL_LENGTH]


def _number(value: object) -> float | None:
    """A stored measurement as a float, or None when there is none to show (P3)."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


class DatabaseCollector:
    """A prometheus_client collector that reads the fleet's state in the current app context."""

    def __init__(self, settings: Settings, now: datetime) -> None:
        self.settings = settings
        self.now = now

    def collect(self) -> Iterator[Metric]:
        """Every fleet family, read now."""
        names = yield from self._nodes()
        yield from self._gpus(names)
        yield from self._jobs()
        yield from self._sweeps()

    def _nodes(self) -> Iterator[Metric]:
        by_status = GaugeMetricFamily("modelforge_nodes", "Nodes by liveness status (L1).", labels=["status"])
        disabled = GaugeMetricFamily("modelforge_nodes_disabled", "Nodes the operator disabled.")
        status = GaugeMetricFamily(
            "modelforge_node_status",
            "1 for each node, labelled with its liveness status.",
            labels=[*NODE_LABELS, "status"],
        )
        age = GaugeMetricFamily(
            "modelforge_node_heartbeat_age_seconds",
            "Seconds since the node's last heartbeat; none before its first.",
            labels=NODE_LABELS,
        )
        rows = db.session.execute(
            sa.select(Node.id, Node.display_name, Node.disabled, NodeLease.last_heartbeat_at).outerjoin(
                NodeLease, NodeLease.node_id == Node.id
            )
        )
        counts: Counter[str] = Counter()
        disabled_count = 0
        names: dict[str, str] = {}
        for node_id, display_name, is_disabled, last_heartbeat_at in rows:
            name = names[node_id] = label(display_name)
            node_status, heartbeat_age = liveness.status_of(last_heartbeat_at, self.now, self.settings)
            counts[node_status] += 1
            disabled_count += bool(is_disabled)
            status.add_metric([node_id, name, node_status], 1)
            if heartbeat_age is not None:
                age.add_metric([node_id, name], heartbeat_age)
        for value in STATUSES:
            by_status.add_metric([value], counts[value])
        disabled.add_metric([], disabled_count)
        yield from (by_status, disabled, status, age)
        return names

    def _gpus(self, names: dict[str, str]) -> Iterator[Metric]:
        cutoff = self.now - timedelta(seconds=self.settings.node_stale_after_seconds)
        # The newest fresh sample of each GPU: one probe of the (gpu_id, sampled_at) key per GPU.
        newest = (
            sa.select(sa.func.max(TelemetrySample.sampled_at))
            .where(TelemetrySample.gpu_id == Gpu.id, TelemetrySample.sampled_at >= cutoff)
            .correlate(Gpu)
            .scalar_subquery()
        )
        rows = db.session.execute(
            sa.select(
                Gpu.node_id,
                Gpu.uuid,
                Gpu.name,
                Gpu.memory_total_bytes,
                *(getattr(TelemetrySample, column) for _, _, column in GPU_FAMILIES if column),
            ).join(TelemetrySample, sa.and_(TelemetrySample.gpu_id == Gpu.id, TelemetrySample.sampled_at == newest))
        )
        families = [GaugeMetricFamily(name, text, labels=GPU_LABELS) for name, text, _ in GPU_FAMILIES]
        for node_id, gpu_uuid, gpu_name, memory_total, *measured in rows:
            labels = [node_id, names.get(node_id, ""), label(gpu_uuid), label(gpu_name)]
            values = iter(measured)
            for family, (_, _, column) in zip(families, GPU_FAMILIES, strict=True):
                value = _number(next(values) if column else memory_total)
                if value is not None:
                    family.add_metric(labels, value)
        yield from families

    def _jobs(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("modelforge_jobs", "Jobs by type and state (J2).", labels=["type", "state"])
        rows = db.session.execute(sa.select(Job.type, Job.state, sa.func.count()).group_by(Job.type, Job.state))
        for job_type, state, count in rows:
            jobs.add_metric([label(job_type), label(state)], count)
        yield jobs

    def _sweeps(self) -> Iterator[Metric]:
        duration = SummaryMetricFamily(
            "modelforge_sweep_duration_seconds",
            "Time the periodic sweeps took (L3), across schedulers.",
            labels=["sweep"],
        )
        last = GaugeMetricFamily(
            "modelforge_sweep_last_duration_seconds", "How long the sweep's last run took.", labels=["sweep"]
        )
        finished = GaugeMetricFamily(
            "modelforge_sweep_last_finished_timestamp_seconds", "When the sweep's last run ended.", labels=["sweep"]
        )
        claimed = CounterMetricFamily("modelforge_sweep_runs", "Ticks the sweep was claimed for.", labels=["sweep"])
        for tick in db.session.scalars(sa.select(SweepTick)):
            name = [label(tick.name)]
            claimed.add_metric(name, tick.runs or 0)
            duration.add_metric(
                name, count_value=tick.completed_runs or 0, sum_value=tick.duration_seconds_total or 0.0
            )
            if tick.last_duration_seconds is not None:
                last.add_metric(name, tick.last_duration_seconds)
            if tick.last_finished_at is not None:
                finished.add_metric(name, tick.last_finished_at.timestamp())
        yield from (duration, last, finished, claimed)
