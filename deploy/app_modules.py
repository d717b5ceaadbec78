"""Load the standard-library-only modules of `app/` by path, for the deploy scripts.

`import app.x` would run `app/__init__.py`, which needs Flask; a node or a release host may not
have it. These modules import nothing else from the app, so they load on any Python 3.11+.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

APP = Path(__file__).resolve().parent.parent / "app"


def load(name: str) -> ModuleType:
    """`app/<name>.py` as the module `modelforge_<name>` (loaded once)."""
    module_name = f"modelforge_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, APP / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[module_name]
