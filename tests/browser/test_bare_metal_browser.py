"""What the bare-metal path adds to the console, in Chromium at 1366×900 and 390×844 (C2, C4, R1):
the wizard's virtual-environment command opened beside the Docker one, and a node list with a
degraded agent's row. Each fits the screen and has no axe-core WCAG 2.1 A/AA violation."""

from __future__ import annotations

from tests.support import factories
from tests.support.axe import violations
from tests.support.browser import Api, expect, sign_in
from tests.support.nodes import WORKING_NODE, beat, publish_inventory

SIZES = {"laptop": (1366, 900), "phone": (390, 844)}


def fits_and_passes_axe(page) -> dict[str, object]:
    """For each size: the document width if wider than the screen, and axe's violations."""
    found = {}
    for size, (width, height) in SIZES.items():
        page.set_viewport_size({"width": width, "height": height})
        widths = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
        problems = {"width": widths if widths[0] > widths[1] else None, "axe": violations(page)}
        found[size] = {key: value for key, value in problems.items() if value}
    return found


def test_the_wizards_venv_command_fits_and_passes_axe(server, page):  # the page closes before the server
    sign_in(page, server.url, "/hardware/enroll")
    page.fill("#display_name", "venv node")
    page.click("button:has-text('Create one-time token')")
    option = page.locator("[data-testid=venv-option]")
    option.locator("summary").click()
    command = page.locator("#venv-command")
    expect(command).to_be_visible()
    assert "export MODELFORGE_AGENT_QUARANTINE_DIR=" in command.inner_text()
    assert fits_and_passes_axe(page) == {"laptop": {}, "phone": {}}


def test_a_degraded_nodes_row_fits_and_passes_axe(server, page):
    api = Api(server.url)
    enrolled = factories.enrolled_node(api, WORKING_NODE, control_plane_url=server.url)
    node = {"id": enrolled["node_id"], "auth": factories.bearer(enrolled["credential"])}
    publish_inventory(api, node)
    beat(api, node, health={"status": "degraded", "detail": "hf-cache directory: /data/hf-cache does not exist"})
    sign_in(page, server.url)
    status = page.locator(f"tr[data-node-id='{node['id']}'] [data-testid=row-status]")
    expect(status).to_have_text("online · degraded")
    assert fits_and_passes_axe(page) == {"laptop": {}, "phone": {}}
