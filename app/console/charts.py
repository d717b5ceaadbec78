"""Small server-rendered SVG line charts of measured telemetry (C3); no JavaScript, no database.

P3: a None point is a break in the line and a series with no numbers says so in words; no
chart ever draws a flat zero line for data that does not exist. Colours come from the
stylesheet (`currentColor` and the `mf-chart*` classes), never from here.
"""

from __future__ import annotations

import math
from datetime import datetime

from markupsafe import Markup

from app.console.formatting import human_bytes
from app.nodes.telemetry_history import Series

# A series with more points than this is reduced to the min and max of each pixel column.
DECIMATE_ABOVE = 400
NO_SAMPLES = "no samples in this window"
_LABEL_ROW = 12  # room above and below the plot for the value labels
_FORMATS = {
    "utilization_gpu_percent": lambda value: f"{_trim(value)}%",
    "memory_used_bytes": human_bytes,
    "temperature_c": lambda value: f"{_trim(value)} °C",
    "power_w": lambda value: f"{_trim(value)} W",
}

Coordinate = tuple[float, float]


def format_value(metric: str, value: float | None) -> str:
    """A metric's value as a person reads it: '37%', '1.9 GiB', '51 °C', '123.4 W'; None → '—'."""
    if value is None:
        return "—"
    formatter = _FORMATS.get(metric)
    return formatter(value) if formatter else _trim(value)


def line_chart(
    series: Series,
    start: datetime,
    end: datetime,
    *,
    label: str,
    unit: str,
    y_max: float | None = None,
    width: int = 320,
    height: int = 80,
) -> Markup:
    """A small inline SVG line chart of one series; gaps are breaks in the line."""
    if end <= start:
        raise ValueError("end must be after start")
    runs = _runs(series, start, end)
    values = [value for run in runs for _, value in run]
    title = f"{label} ({unit})"
    if not values:
        return _svg(
            width,
            height,
            title,
            NO_SAMPLES,
            [
                Markup('<text class="mf-chart-gap-note" x="{}" y="{}" text-anchor="middle">{}</text>').format(
                    _num(width / 2), _num(height / 2 + 3), NO_SAMPLES
                )
            ],
        )

    def shown(value: float) -> str:
        text = format_value(series.metric, value)
        return text if series.metric in _FORMATS else f"{text} {unit}"

    low, high, latest = min(values), max(values), values[-1]
    bottom = min(0.0, -_nice_ceiling(-low)) if low < 0 else 0.0
    top = y_max if y_max is not None and y_max > 0 and high <= y_max else _nice_ceiling(high)
    plot_top, plot_bottom = _LABEL_ROW, height - _LABEL_ROW
    span = (end - start).total_seconds()

    def place(moment: datetime, value: float) -> Coordinate:
        x = (moment - start).total_seconds() / span * width
        y = plot_bottom - (value - bottom) / (top - bottom) * (plot_bottom - plot_top)
        return x, y

    placed = [[place(moment, value) for moment, value in run] for run in runs]
    if len(values) > DECIMATE_ABOVE:
        placed = [_decimate(run, width) for run in placed]
    summary = f"latest {shown(latest)}, min {shown(low)}, max {shown(high)}"
    elements = [_gridline(y, width, "mf-chart-grid") for y in (plot_top, (plot_top + plot_bottom) / 2)]
    elements.append(_gridline(plot_bottom, width, "mf-chart-grid mf-chart-baseline"))
    elements += [_draw(run) for run in placed]
    labels = (
        ("mf-chart-max", 2, 9, "start", f"max {shown(high)}"),
        ("mf-chart-latest", width - 2, 9, "end", f"latest {shown(latest)}"),
        ("mf-chart-min", 2, height - 2, "start", f"min {shown(low)}"),
        ("mf-chart-scale", width - 2, height - 2, "end", f"axis {shown(bottom)} – {shown(top)}"),
    )
    elements += [
        Markup('<text class="mf-chart-label {}" x="{}" y="{}" text-anchor="{}">{}</text>').format(
            css, _num(x), _num(y), anchor, text
        )
        for css, x, y, anchor, text in labels
    ]
    return _svg(width, height, title, summary, elements)


def _svg(width: int, height: int, title: str, summary: str, elements: list[Markup]) -> Markup:
    return Markup(
        '<svg xmlns="http://www.w3.org/2000/svg" class="mf-chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}"'
        ' role="img" aria-label="{label}" fill="currentColor" font-size="9"><title>{title}</title>{body}</svg>'
    ).format(
        w=width, h=height, label=f"{title}: {summary}", title=f"{title}: {summary}", body=Markup("").join(elements)
    )


def _runs(series: Series, start: datetime, end: datetime) -> list[list[tuple[datetime, float]]]:
    """Contiguous stretches of numbers in [start, end]; None (or a non-finite value) ends one."""
    runs: list[list[tuple[datetime, float]]] = [[]]
    for moment, value in series.points:
        if value is None or not math.isfinite(value):
            if runs[-1]:
                runs.append([])
        elif start <= moment <= end:
            runs[-1].append((moment, float(value)))
    return [run for run in runs if run]


def _decimate(run: list[Coordinate], width: int) -> list[Coordinate]:
    """Per pixel column, only the lowest and the highest point, in time order (peaks survive)."""
    columns: dict[int, list[tuple[int, Coordinate]]] = {}
    for order, point in enumerate(run):
        columns.setdefault(min(int(point[0]), width - 1), []).append((order, point))
    kept: list[tuple[int, Coordinate]] = []
    for members in columns.values():
        # SVG y grows downwards: the highest value has the smallest y.
        highest = min(members, key=lambda member: member[1][1])
        lowest = max(members, key=lambda member: member[1][1])
        kept += sorted({highest, lowest})
    return [point for _, point in sorted(kept)]


def _draw(run: list[Coordinate]) -> Markup:
    """A polyline through a run, or a dot for a lone point."""
    coordinates: list[str] = []
    for x, y in run:
        text = f"{_num(x)},{_num(y)}"
        if not coordinates or coordinates[-1] != text:
            coordinates.append(text)
    if len(coordinates) == 1:
        x, y = coordinates[0].split(",")
        return Markup(
            '<circle class="mf-chart-point" cx="{}" cy="{}" r="1" fill="none" stroke="currentColor" stroke-width="2"/>'
        ).format(x, y)
    return Markup(
        '<polyline class="mf-chart-line" points="{}" fill="none" stroke="currentColor" stroke-width="1.5"'
        ' stroke-linejoin="round"/>'
    ).format(" ".join(coordinates))


def _gridline(y: float, width: int, css: str) -> Markup:
    return Markup(
        '<line class="{}" x1="0" y1="{}" x2="{}" y2="{}" stroke="currentColor" stroke-opacity="0.15"/>'
    ).format(css, _num(y), width, _num(y))


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10ⁿ at or above value (1 for nothing above zero)."""
    if value <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    raise AssertionError("unreachable")


def _num(value: float) -> str:
    """A coordinate with at most one decimal and no trailing '.0'."""
    text = f"{value:.1f}"
    text = text[:-2] if text.endswith(".0") else text
    return "0" if text == "-0" else text


def _trim(value: float) -> str:
    """A value with at most one decimal and no trailing '.0'."""
    return _num(value)
