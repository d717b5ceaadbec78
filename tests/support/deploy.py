"""The node's env file as the deploy tests write it, and deploy/env_preflight.py."""

from __future__ import annotations

from tests.support import PROJECT_ROOT

DEPLOY = PROJECT_ROOT / "deploy"
PREFLIGHT = DEPLOY / "env_preflight.py"


GOOD_ENV = """\
# a real node
MODELFORGE_AGENT_CONTROL_PLANE_URL=https://modelforge.lan:8000
MODELFORGE_AGENT_HOSTNAME=tower
MODELFORGE_AGENT_TLS_VERIFY=true
MODELFORGE_AGENT_STATE_VOLUME=/mnt/user/appdata/modelforge-node-agent/state
MODELFORGE_AGENT_HF_CACHE_VOLUME="/mnt/cache/appdata/modelforge-node-agent/hf-cache"
MODELFORGE_AGENT_ARTIFACT_VOLUME='/mnt/cache/appdata/modelforge-node-agent/artifacts'
MODELFORGE_AGENT_QUARANTINE_VOLUME=/mnt/cache/appdata/modelforge-node-agent/quarantine
"""


def with_line(content: str, key: str, value: str) -> str:
    """GOOD_ENV with one variable replaced (or added)."""
    lines = [line for line in content.splitlines() if not line.startswith(key + "=")]
    return "\n".join([*lines, f"{key}={value}"]) + "\n"
