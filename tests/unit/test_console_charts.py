"""Inline SVG charts of measured telemetry: gaps stay gaps, labels are escaped, output stays small (C3, P3)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import Markup

from app.console.charts import DECIMATE_ABOVE, NO_SAMPLES, format_value, line_chart
from app.nodes.telemetry_history import Series

SVG = "{http://www.w3.org/2000/svg}"
START = datetime(2026, 3, 10, 11, 0, tzinfo=UTC)
END = START + timedelta(hours=1)


def minutes(n: float) -> datetime:
    return START + timedelta(minutes=n)


def render(points, metric="utilization_gpu_percent", **kwargs) -> tuple[str, ET.Element]:
    options = {"label": "Utilisation — RTX 4080", "unit": "%", **kwargs}
    chart = line_chart(Series(metric, points), START, END, **options)
    assert isinstance(chart, Markup)
    return str(chart), ET.fromstring(str(chart))


def lines(svg: ET.Element) -> list[list[tuple[float, float]]]:
    """Each polyline's points as (x, y) pairs."""
    return [
        [tuple(float(number) for number in pair.split(",")) for pair in line.get("points").split()]
        for line in svg.iter(f"{SVG}polyline")
    ]


def texts(svg: ET.Element) -> dict[str, str]:
    return {text.get("class"): text.text for text in svg.iter(f"{SVG}text")}


def assert_inside_viewbox(svg: ET.Element, coordinates) -> None:
    _, _, width, height = (float(number) for number in svg.get("viewBox").split())
    for x, y in coordinates:
        assert 0 <= x <= width and 0 <= y <= height, (x, y)


def test_a_series_is_a_valid_svg_with_one_line_per_contiguous_run():
    points = [(minutes(0), 10.0), (minutes(10), 50.0), (minutes(20), None), (minutes(30), 30.0), (minutes(60), 100.0)]
    text, svg = render(points, y_max=100.0)

    assert svg.tag == f"{SVG}svg" and svg.get("class") == "mf-chart"
    assert svg.get("viewBox") == "0 0 320 80" and svg.get("role") == "img"
    assert svg.get("aria-label") == "Utilisation — RTX 4080 (%): latest 100%, min 10%, max 100%"
    assert svg.find(f"{SVG}title").text == svg.get("aria-label")
    runs = lines(svg)
    assert len(runs) == 2  # the None breaks the line: no interpolation across it (P3)
    first, second = runs
    # x over [start, end]; y over [0, 100] inside the plot area between the label rows (12 .. 68).
    assert first == [(0.0, 62.4), (53.3, 40.0)]
    assert second == [(160.0, 51.2), (320.0, 12.0)]
    assert_inside_viewbox(svg, first + second)
    assert all(line.get("class") == "mf-chart-line" for line in svg.iter(f"{SVG}polyline"))
    assert texts(svg) == {
        "mf-chart-label mf-chart-max": "max 100%",
        "mf-chart-label mf-chart-latest": "latest 100%",
        "mf-chart-label mf-chart-min": "min 10%",
        "mf-chart-label mf-chart-scale": "axis 0% – 100%",
    }
    assert len([line for line in svg.iter(f"{SVG}line") if "mf-chart-grid" in line.get("class")]) == 3
    # Colours are the stylesheet's: nothing but currentColor.
    assert "#" not in text and "rgb" not in text
    assert {svg.get("fill")} | {e.get("stroke") for e in svg.iter() if e.get("stroke")} == {"currentColor"}


def test_a_lone_point_between_gaps_is_a_dot_and_coordinates_are_short():
    points = [(minutes(0), 1 / 3), (minutes(0.5), 2 / 3), (minutes(5), None), (minutes(7), 0.5), (minutes(9), None)]
    text, svg = render(points, metric="power_w", label="Power", unit="W")

    assert len(lines(svg)) == 1
    [dot] = svg.iter(f"{SVG}circle")
    assert dot.get("class") == "mf-chart-point"
    assert_inside_viewbox(svg, [(float(dot.get("cx")), float(dot.get("cy")))])
    # Scale 0..1 (a nice ceiling of 2/3); one decimal at most, no trailing ".0".
    assert lines(svg)[0] == [(0.0, 49.3), (2.7, 30.7)]
    assert (dot.get("cx"), dot.get("cy")) == ("37.3", "40")
    assert texts(svg)["mf-chart-label mf-chart-latest"] == "latest 0.5 W"


@pytest.mark.parametrize("points", [[], [(minutes(0), None)], [(minutes(0), None), (minutes(30), None)]])
def test_no_numbers_says_so_and_draws_no_line(points):
    _, svg = render(points)

    notes = [text for text in svg.iter(f"{SVG}text") if text.get("class") == "mf-chart-gap-note"]
    assert [note.text for note in notes] == [NO_SAMPLES]
    assert svg.get("aria-label").endswith(NO_SAMPLES)
    # P3: no line at all — not a polyline, not a dot, not even a baseline that reads as zero.
    for tag in ("polyline", "path", "circle", "line"):
        assert list(svg.iter(f"{SVG}{tag}")) == []


def test_points_outside_the_window_are_not_drawn():
    points = [
        (START - timedelta(minutes=1), 99.0),
        (minutes(30), 10.0),
        (minutes(40), 20.0),
        (END + timedelta(1), 99.0),
    ]
    _, svg = render(points, y_max=100.0)

    assert lines(svg) == [[(160.0, 62.4), (213.3, 56.8)]]
    assert texts(svg)["mf-chart-label mf-chart-max"] == "max 20%"


def test_values_above_y_max_extend_the_scale_instead_of_being_clipped():
    _, svg = render([(minutes(0), 50.0), (minutes(60), 105.0)], metric="temperature_c", unit="°C", y_max=100.0)

    [line] = lines(svg)
    assert_inside_viewbox(svg, line)
    assert line[1][1] > 12.0  # 105 is below the top of a 0..200 scale, not pinned to it
    assert texts(svg)["mf-chart-label mf-chart-scale"] == "axis 0 °C – 200 °C"


def test_a_hostile_label_is_escaped():
    hostile = '<script>alert("x")</script> & "quoted"'
    text, svg = render([(minutes(0), 1.0), (minutes(1), 2.0)], label=hostile, unit="<b>")

    assert "<script>" not in text and "<b>" not in text
    assert svg.find(f"{SVG}title").text.startswith(hostile + " (<b>)")
    assert svg.get("aria-label").startswith(hostile)
    assert list(svg.iter(f"{SVG}script")) == []


def test_a_non_finite_value_is_a_gap_not_a_coordinate():
    points = [(minutes(0), 1.0), (minutes(1), 2.0), (minutes(2), float("nan")), (minutes(3), 1.0), (minutes(4), 3.0)]
    text, svg = render(points)

    assert len(lines(svg)) == 2 and "nan" not in text.lower()


def test_many_points_are_decimated_per_pixel_column_and_the_peak_survives():
    count = 5760  # a day at 15 s
    step = (END - START) / count
    points = [(START + step * n, 20.0 + (n * 7919 % 13)) for n in range(count)]
    points[4321] = (points[4321][0], 97.0)  # one short spike
    points[1234] = (points[1234][0], 3.0)  # one short dip
    points[3000] = (points[3000][0], None)  # and one gap
    text, svg = render(points)

    runs = lines(svg)
    assert len(runs) == 2
    drawn = [point for run in runs for point in run]
    assert len(drawn) <= 2 * 320 + 2 and len(text) < 12_000  # two per column (+ the column the gap splits)
    assert_inside_viewbox(svg, drawn)
    # Scale 0..100, plot 12..68: the spike at y = 68 - 0.97 * 56, the dip at 68 - 0.03 * 56.
    assert min(y for _, y in drawn) == 13.7
    assert max(y for _, y in drawn) == 66.3
    assert texts(svg)["mf-chart-label mf-chart-max"] == "max 97%"
    # Time order is kept within each run.
    assert all([x for x, _ in run] == sorted(x for x, _ in run) for run in runs)


def test_few_points_are_not_decimated():
    points = [(minutes(n * 60 / DECIMATE_ABOVE), float(n % 2)) for n in range(DECIMATE_ABOVE)]
    _, svg = render(points, y_max=1.0)

    assert len(lines(svg)[0]) == DECIMATE_ABOVE


def test_memory_is_labelled_in_binary_units():
    gib = 2**30
    _, svg = render([(minutes(0), 0.5 * gib), (minutes(60), 12 * gib)], metric="memory_used_bytes", unit="bytes")

    assert texts(svg)["mf-chart-label mf-chart-latest"] == "latest 12.0 GiB"
    assert texts(svg)["mf-chart-label mf-chart-min"] == "min 512.0 MiB"


@pytest.mark.parametrize(
    ("metric", "value", "shown"),
    [
        ("utilization_gpu_percent", 37.0, "37%"),
        ("utilization_gpu_percent", 37.25, "37.2%"),
        ("memory_used_bytes", 2_000_000_000, "1.9 GiB"),
        ("memory_used_bytes", 512 * 2**20, "512.0 MiB"),
        ("memory_used_bytes", 0, "0 B"),
        ("temperature_c", 51.0, "51 °C"),
        ("power_w", 123.44, "123.4 W"),
        ("power_w", None, "—"),
        ("something_else", 2.0, "2"),
    ],
)
def test_format_value(metric, value, shown):
    assert format_value(metric, value) == shown


def test_an_empty_or_backwards_window_is_refused():
    with pytest.raises(ValueError, match="end must be after start"):
        line_chart(Series("power_w", []), END, START, label="Power", unit="W")
