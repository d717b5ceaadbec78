"""Import the standard-library-only modules of `app/` for the deploy scripts, without Flask.

`import app.x` would run `app/__init__.py`, which needs Flask; a node or a release host may not
have it. So, unless the real package is already imported, `app` is registered as a bare package
over the app/ directory (its `__init__.py` left unrun) and the modules are imported under the
names they have in the control plane (`app.rules`, `app.release_manifest`): one name for each, so
`from app import rules` reads the same here and there. They import nothing from the app but each
other, so they load on any Python 3.11+.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

APP = Path(__file__).resolve().parent.parent / "app"


def load(name: str) -> ModuleType:
    """`app/<name>.py` as the module `app.<name>` (imported once)."""
    if "app" not in sys.modules:
        spec = importlib.machinery.ModuleSpec("app", None, is_package=True)
        spec.submodule_search_locations = [str(APP)]
        sys.modules["app"] = importlib.util.module_from_spec(spec)
    return importlib.import_module(f"app.{name}")
