"""`python -m app.instance`: create the instance folder's generated secrets once (mode 0600)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from app.config import OPERATOR_KEY_FILE, ensure_instance_secrets

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    """Generate instance/operator-api-key and instance/secret-key if missing; say where."""
    instance = Path(os.environ.get("MODELFORGE_INSTANCE_PATH") or PROJECT_ROOT / "instance")
    created = ensure_instance_secrets(instance, os.environ)
    key_path = instance / OPERATOR_KEY_FILE
    if os.environ.get("MODELFORGE_OPERATOR_API_KEY"):
        print("modelforge: operator API key comes from MODELFORGE_OPERATOR_API_KEY")
    elif OPERATOR_KEY_FILE in created:
        print(f"modelforge: generated the operator API key in {key_path} (mode 0600)")
    else:
        print(f"modelforge: operator API key is in {key_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
