"""Rules stated once (app/rules.py) and applied alike by the API, the console and the deploy scripts."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from app import rules
from app.console import commands
from tests.support.deploy import GOOD_ENV, PREFLIGHT, with_line


@pytest.mark.parametrize(
    ("text", "allowed"),
    [
        ("GPU box 1", True),
        ("Bob's Ryzen — 4080 ✓ 😀", True),
        ("", True),
        ("tab\there", False),
        ("new\nline", False),
        ("nul\x00", False),
        ("c1 \x85 control", False),
        ("no-break\xa0space", False),
        ("ideographic\u3000space", False),
        ("line\u2028separator", False),
        ("zero\u200bwidth", False),
        ("bidi \u202e override", False),
        ("isolate \u2066", False),
        # Issue 15: every bidi control (embeddings, overrides, isolates, marks) is refused.
        *((f"bidi {chr(code)} control", False) for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))),
        ("left-to-right mark \u200e", False),
        ("right-to-left mark \u200f", False),
        ("arabic letter mark \u061c", False),
        ("\u0627\u0644\u0639\u0631\u0628\u064a\u0629 (Arabic) and \u05e2\u05d1\u05e8\u05d9\u05ea", True),
        ("soft\xadhyphen", False),
        ("bom\ufeff", False),
        ("lone \ud800 surrogate", False),
    ],
)
def test_one_text_rule(text, allowed):
    assert rules.is_text(text) is allowed
    # The published pattern says the same (a lone surrogate aside: no portable pattern names it).
    if "\ud800" not in text:
        assert (re.search(rules.TEXT_PATTERN, text) is not None) is allowed


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("site", "office", True),
        ("team.gpu/rack-2_a", "x" * rules.MAX_LABEL_VALUE_LENGTH, True),
        ("site\n", "office", False),  # `$` would have let this one through
        ("-site", "office", False),
        ("s" * 64, "office", False),
        ("site", "x" * (rules.MAX_LABEL_VALUE_LENGTH + 1), False),
        ("site", "bad\x00value", False),
        ("site", 5, False),
        ("site", "\x1b[31mred", False),
        ("site", "two\nlines", False),
        ("site", "\ud800", False),
        ("site", "bidi \u202e", False),
        ("site\x00", "office", False),
    ],
)
def test_one_label_rule(key, value, allowed):
    assert (rules.label_problem(key, value) is None) is allowed


IMAGES = [
    ("modelforge-node-agent:1.3.0-rc.1", True),
    ("modelforge-node-agent:local", True),
    ("registry.lan:5000/team/modelforge-node-agent:1.3.0", True),
    ("registry.lan/modelforge-node-agent@sha256:" + "a" * 64, True),
    ("registry.lan/modelforge-node-agent:latest@sha256:" + "a" * 64, True),
    ("modelforge-node-agent", False),
    ("registry.lan:5000/modelforge-node-agent", False),
    ("modelforge-node-agent:latest", False),
    ("modelforge-node-agent@sha256:abc", False),
    ("Modelforge-Node-Agent:1.0", False),
    ("modelforge-node-agent:1.0; rm -rf /", False),
]


@pytest.mark.parametrize(("image", "allowed"), IMAGES)
def test_the_wizard_and_env_preflight_apply_one_image_rule(tmp_path, image, allowed):
    env = commands.AgentEnv(
        control_plane_url="https://modelforge.lan",
        display_name="GPU",
        accelerator_mode="nvidia",
        image=image,
    )
    try:
        commands.env_file(env)
        wizard_allows = True
    except ValueError:
        wizard_allows = False
    env_file = tmp_path / "node.env"
    env_file.write_text(with_line(GOOD_ENV, "MODELFORGE_NODE_AGENT_IMAGE", image), encoding="utf-8")
    preflight = subprocess.run([sys.executable, str(PREFLIGHT), str(env_file)], capture_output=True, text=True)
    assert (wizard_allows, preflight.returncode == 0) == (allowed, allowed), preflight.stderr


def test_a_digest_is_required_where_the_wizard_pins_a_registry_image():
    assert rules.image_reference_problem("registry.lan/agent:1.0", digest_required=True)
    assert rules.image_reference_problem("registry.lan/agent@sha256:" + "0" * 64, digest_required=True) is None
