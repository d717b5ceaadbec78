#!/usr/bin/env python3
"""Build or check a release manifest (D5): `python3 deploy/release_manifest.py --help`.

The code is app/release_manifest.py (standard library only). It is loaded here by path rather
than imported through the `app` package, so this runs on a host without Flask, a node included.
"""

import importlib.util
import sys
from pathlib import Path

_SOURCE = Path(__file__).resolve().parent.parent / "app" / "release_manifest.py"
_spec = importlib.util.spec_from_file_location("modelforge_release_manifest", _SOURCE)
release_manifest = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = release_manifest  # dataclasses look their module up there
_spec.loader.exec_module(release_manifest)

if __name__ == "__main__":
    sys.exit(release_manifest.main())
