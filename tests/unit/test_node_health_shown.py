"""A node whose agent reports degraded health says so: in its node list row (a Beszel-style dot
and "online · degraded") and in readiness, whose next step names the directory to fix (C2, R1)."""

from __future__ import annotations

import re

from tests.support import ADMIN, factories
from tests.support.console import HTMX
from tests.support.nodes import beat, online_node, publish_inventory, silence

DETAIL = "hf-cache directory: /data/hf-cache does not exist; quarantine directory: /data/quarantine does not exist"
BROKEN_STORAGE = {
    "state": {"path": "/srv/agent/state", "total_bytes": 100, "free_bytes": 50},
    "hf-cache": {
        "path": "/data/hf-cache",
        "total_bytes": None,
        "free_bytes": None,
        "unknown_reason": "No such file or directory",
        "problem": "/data/hf-cache does not exist",
    },
    # What an agent from before `problem` sends for a missing directory: statvfs's reason alone.
    "quarantine": {
        "path": "/data/quarantine",
        "total_bytes": None,
        "free_bytes": None,
        "unknown_reason": "No such file",
    },
}


def row(html: str, node_id: str) -> str:
    (found,) = re.findall(rf'<tr data-node-id="{node_id}">.*?</tr>', html, re.S)
    return found


def status_cell(html: str, node_id: str) -> tuple[str, str, str | None]:
    """The row's dot level, its status badge's words, and the badge's title."""
    cells = row(html, node_id)
    dot = re.search(r'class="mf-dot mf-dot-(\w+)"', cells)[1]
    badge = re.search(r'<span data-testid="row-status" class="[^"]*"(?: title="([^"]*)")?>([^<]*)</span>', cells)
    return dot, badge[2], badge[1]


def readiness(client, node_id: str) -> dict[str, dict]:
    body = client.get(f"/api/v1/admin/nodes/{node_id}/readiness", headers=ADMIN).get_json()
    return {check["name"]: check for check in body["checks"]}


def test_the_node_list_shows_each_rows_agent_health_beside_its_liveness(app, console):
    healthy = online_node(console, hostname="healthy")
    degraded = online_node(console, hostname="degraded")
    beat(console, degraded, health={"status": "degraded", "detail": DETAIL})
    failing = online_node(console, hostname="failing")
    beat(console, failing, health={"status": "failing", "detail": "GPU-1: utilization_gpu_percent NVMLError_GpuIsLost"})
    quiet = online_node(console, hostname="quiet")
    beat(console, quiet, health={"status": "degraded", "detail": DETAIL})
    silence(app, quiet["id"], seconds=60)  # stale: its last health report is old news
    html = console.get("/hardware/nodes", headers=HTMX).get_data(as_text=True)

    assert status_cell(html, healthy["id"]) == ("ok", "online", None)
    assert status_cell(html, degraded["id"]) == ("warn", "online · degraded", DETAIL)
    assert 'mf-health-degraded"' in row(html, degraded["id"])
    assert status_cell(html, failing["id"])[:2] == ("bad", "online · failing")
    assert status_cell(html, quiet["id"]) == ("warn", "stale", None)
    # The dot is decoration: the badge's words carry the state for a screen reader.
    assert 'class="mf-dot mf-dot-warn" aria-hidden="true"' in row(html, degraded["id"])


def test_an_offline_node_shows_a_red_dot_whatever_its_agent_last_said(app, console):
    node = online_node(console)
    silence(app, node["id"], seconds=3600)
    html = console.get("/hardware/nodes", headers=HTMX).get_data(as_text=True)
    assert status_cell(html, node["id"]) == ("bad", "offline", None)


def test_readiness_names_the_directory_to_create_and_its_variable(console):
    node = online_node(console)
    publish_inventory(console, node, inventory={**factories.inventory_body()["inventory"], "storage": BROKEN_STORAGE})
    beat(console, node, health={"status": "degraded", "detail": DETAIL})
    health = readiness(console, node["id"])["agent_health"]
    assert health["status"] == "fail" and DETAIL in health["detail"]
    step = health["next_step"]
    assert step.startswith(
        "Create the hf-cache directory (`mkdir -p /data/hf-cache`) writable by the agent's user, "
        "or set MODELFORGE_AGENT_HF_CACHE_DIR to one that is; "
        "create the quarantine directory (`mkdir -p /data/quarantine`) writable by the agent's user, "
        "or set MODELFORGE_AGENT_QUARANTINE_DIR to one that is; then restart the agent"
    ), step
    assert "--preflight" in step and "state directory" not in step


def test_readiness_for_a_failing_reading_still_points_at_preflight_and_nvidia_smi(console):
    node = online_node(console)
    beat(console, node, health={"status": "degraded", "detail": "GPU-1: temperature_c NVMLError_Unknown"})
    step = readiness(console, node["id"])["agent_health"]["next_step"]
    assert "--preflight" in step and "nvidia-smi" in step and "mkdir" not in step
