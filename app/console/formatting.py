"""Jinja filters for the console: ages, sizes, times and node facts a person reads at a glance."""

from __future__ import annotations

import math
from datetime import UTC, datetime

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


def utc(value: datetime | str | None) -> str:
    """An RFC 3339 string or datetime as '2026-11-30 04:18:33 UTC'; None → '—'."""
    moment = _moment(value)
    if moment is None:
        return "—"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def age_since(value: datetime | str | None, now: datetime | None = None) -> str:
    """How long ago a moment was, e.g. '12 s ago'; None → 'never'."""
    moment = _moment(value)
    if moment is None:
        return "never"
    now = now or datetime.now(UTC)
    return human_age(max((now - moment).total_seconds(), 0)) + " ago"


def human_rate(bytes_per_second: float | None) -> str:
    """A transfer rate in decimal megabytes, as download tools show it: 12.3 MB/s; None → '—'."""
    if bytes_per_second is None or bytes_per_second < 0:
        return "—"
    if bytes_per_second < 100_000:
        return f"{bytes_per_second / 1000:.1f} kB/s"
    return f"{bytes_per_second / 1_000_000:.1f} MB/s"


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


FILTERS = {
    "mean_sd": mean_sd,
    "seconds": seconds,
    "human_bytes": human_bytes,
    "human_age": human_age,
    "utc": utc,
    "age_since": age_since,
    "human_rate": human_rate,
    "eta": eta,
    "short_commit": short_commit,
    "gpu_text": gpu_text,
    "gpu_models": gpu_models,
    "eligibility_text": eligibility_text,
}
