"""Jinja filters for the console: ages, sizes, times and node facts a person reads at a glance."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from flask import url_for
from markupsafe import Markup

from app.nodes import NodeSummary
from app.timeutil import parse_rfc3339

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(value: float | int | None) -> str:
    """1073741824 → '1.0 GiB'; None or anything not a finite number → '—' (unknown is shown as unknown, P3)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "—"
    try:
        size = float(value)
    except OverflowError:  # a whole number too large for a float (P5: an old row may hold one)
        return "—"
    if not math.isfinite(size):
        return "—"
    for unit in _BYTE_UNITS[:-1]:
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} {_BYTE_UNITS[-1]}"


def human_age(seconds: float | int | None) -> str:
    """A duration in the largest sensible unit: '12 s', '4 min', '3 h 5 min', '2 d'."""
    if seconds is None:
        return "never"
    seconds = int(seconds)
    if seconds < 90:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} d"


def _moment(value: datetime | str | None) -> datetime | None:
    if isinstance(value, str):
        return parse_rfc3339(value)
    return value


def iso(value: datetime | str | None) -> str:
    """A moment as RFC 3339 in UTC to the second, '2026-11-30T04:18:33Z', for attributes; None → ''."""
    moment = _moment(value)
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc(value: datetime | str | None) -> Markup | str:
    """A moment as `<time datetime="…Z">2026-11-30 04:18:33 UTC</time>`, whole seconds; console.js
    shows it in the reader's local time with the UTC text as its title. None → '—'."""
    moment = _moment(value)
    if moment is None:
        return "—"
    text = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup('<time datetime="{}" data-local-time>{}</time>').format(iso(moment), text)


def age_since(value: datetime | str | None, now: datetime | None = None) -> str:
    """How long ago a moment was, e.g. '12 s ago'; None → 'never'."""
    moment = _moment(value)
    if moment is None:
        return "never"
    now = now or datetime.now(UTC)
    return human_age(max((now - moment).total_seconds(), 0)) + " ago"


def human_rate(bytes_per_second: float | None) -> str:
    """A transfer rate in the units sizes are shown in (binary, as everywhere in the console):
    2.0 MiB/s; None → '—'."""
    if not isinstance(bytes_per_second, int | float) or bytes_per_second < 0:
        return "—"
    return human_bytes(bytes_per_second) + "/s"


def eta(seconds: float | None) -> str:
    """Time left, rounded up to whole seconds: 'about 3 min'; None → '—' (no rate measured yet)."""
    if seconds is None or seconds < 0:
        return "—"
    return "about " + human_age(math.ceil(seconds))


def short_commit(commit: str | None, length: int = 7) -> str:
    """A commit as git abbreviates it (the full one belongs in a title); None → '—'."""
    return commit[:length] if commit else "—"


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def mean_sd(rate: object) -> str:
    """W2: a tokens/s figure as llama-bench prints it, '8123.4 ± 51.2'; unreadable → '—'."""
    mean = _finite(rate.get("mean")) if isinstance(rate, dict) else None
    if mean is None:
        return "—"
    stddev = _finite(rate.get("stddev"))
    return f"{mean:.1f}" if stddev is None else f"{mean:.1f} ± {stddev:.1f}"


def seconds(value: object) -> str:
    """A short duration with the precision it deserves: '0.071 s', '12.3 s'; None → '—'."""
    number = _finite(value)
    if number is None or number < 0:
        return "—"
    return f"{number:.3f} s" if number < 10 else f"{number:.1f} s"


def gpu_models(names: list[str] | None) -> str:
    """S3: what a benchmark ran on: 'NVIDIA RTX A6000', '2 × NVIDIA RTX A6000', 'A, B'; [] → 'CPU';
    None → 'not reported' (no run, and no worker has said)."""
    if names is None:
        return "not reported"
    if not names:
        return "CPU"
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(name if count == 1 else f"{count} × {name}" for name, count in counts.items())


def gpu_text(node: NodeSummary) -> str:
    """A node's GPUs: '2 × NVIDIA RTX A6000', or '3 × A (2), B (1)' for a mixed node (C2)."""
    if not node.gpu_models:
        return "none reported"
    if len(node.gpu_models) == 1:
        return f"{node.gpu_count} × {next(iter(node.gpu_models))}"
    mixed = ", ".join(f"{model} ({count})" for model, count in sorted(node.gpu_models.items()))
    return f"{node.gpu_count} × {mixed}"


# C2, R1: a row's one-glance health (Beszel's dot): liveness first, then what its agent reports.
# A stale or offline node's last health report is old news, so only an online node's is shown.


def health_level(node: NodeSummary) -> str:
    """ok | warn | bad | pending for a node list row."""
    if node.disabled or node.status == "offline":
        return "bad"
    if node.status == "stale":
        return "warn"
    if node.status != "online":
        return "pending"
    if node.health_status == "failing":
        return "bad"
    if node.health_status not in (None, "ok"):
        return "warn"
    return "ok"


def shown_health(node: NodeSummary) -> str | None:
    """The agent's health as the row adds it to the status ("degraded"), only when online and not ok."""
    if node.status != "online" or node.health_status in (None, "ok"):
        return None
    return node.health_status


def eligibility_text(node: NodeSummary) -> str:
    """A node's eligibility flags in words; a disabled node is eligible for nothing (L4)."""
    if node.disabled:
        return "none (disabled)"
    flags = [
        name
        for name, flag in (
            ("production", node.production_eligible),
            ("lab", node.lab_eligible),
            ("benchmark", node.benchmark_eligible),
        )
        if flag
    ]
    return ", ".join(flags) or "none"


def plain(value: object) -> str:
    """A stored value in words, never a Python repr: None → 'none', True → 'yes', [] → 'none',
    a list joined with commas, a mapping as 'key: value' pairs, bytes as text."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(plain(item) for item in value) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{_label(key)}: {plain(item)}" for key, item in value.items()) or "none"
    return str(value)


def _label(key: object) -> str:
    return str(key).replace("_", " ")


# Audit details that name something with its own page (C5): the id becomes a link to it.
_DETAIL_LINKS = {
    "job_id": ("console.job_page", "job_id"),
    "deployment_id": ("console.deployment_page", "deployment_id"),
    "node_id": ("console.node_page", "node_id"),
    "enrollment_id": ("console.enrollment_progress", "enrollment_id"),
}


def audit_details(details: dict[str, object] | None, node_names: dict[str, str] | None = None) -> Markup:
    """An audit event's details as labelled words (`previous: none`, `production eligible: no`),
    ids of jobs, deployments, nodes and enrolments as links to their pages."""
    pieces = []
    for key, value in sorted((details or {}).items()):
        moment = parse_rfc3339(value) if isinstance(value, str) and "T" in value else None
        text = utc(moment) if moment else plain(value)
        link = _DETAIL_LINKS.get(key)
        if link and isinstance(value, str) and value:
            endpoint, argument = link
            shown = (node_names or {}).get(value, value) if key == "node_id" else value
            text = Markup('<a href="{}">{}</a>').format(url_for(endpoint, **{argument: value}), shown)
        pieces.append(Markup('<span class="mf-label">{}: {}</span>').format(_label(key), text))
    return Markup(" ").join(pieces) if pieces else Markup("—")


def audit_actor(actor: str, node_names: dict[str, str] | None = None) -> Markup | str:
    """Who did it: 'operator', 'ModelForge' for the control plane's own sweeps, or 'agent on
    <node name>' linked to the node for `agent:<node id>`."""
    kind, _, node_id = actor.partition(":")
    if kind == "agent" and node_id:
        name = (node_names or {}).get(node_id, node_id)
        return Markup('agent on <a href="{}"><bdi>{}</bdi></a>').format(
            url_for("console.node_page", node_id=node_id), name
        )
    return "ModelForge" if actor == "system" else actor


FILTERS = {
    "plain": plain,
    "audit_details": audit_details,
    "audit_actor": audit_actor,
    "mean_sd": mean_sd,
    "seconds": seconds,
    "human_bytes": human_bytes,
    "human_age": human_age,
    "utc": utc,
    "iso": iso,
    "age_since": age_since,
    "human_rate": human_rate,
    "eta": eta,
    "short_commit": short_commit,
    "gpu_text": gpu_text,
    "gpu_models": gpu_models,
    "eligibility_text": eligibility_text,
    "health_level": health_level,
    "shown_health": shown_health,
}
