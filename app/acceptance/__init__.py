"""Acceptance evidence per node (V1): the checklist, its verdict, and the bundle a release note cites.

The console and the API use only what is named here.
"""

from app.acceptance.checklist import ITEMS, Checklist, Item, evaluate, set_production_eligible, verdicts
from app.acceptance.container import inspect_command, record_container_status
from app.acceptance.export import export_bundle
from app.acceptance.uploads import (
    MAX_SCREENSHOT_BYTES,
    Screenshot,
    add_screenshot,
    screenshot_file,
    screenshots,
)

__all__ = [
    "ITEMS",
    "MAX_SCREENSHOT_BYTES",
    "Checklist",
    "Item",
    "Screenshot",
    "add_screenshot",
    "evaluate",
    "export_bundle",
    "inspect_command",
    "record_container_status",
    "screenshot_file",
    "screenshots",
    "set_production_eligible",
    "verdicts",
]
