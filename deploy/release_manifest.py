#!/usr/bin/env python3
"""Build or check a release manifest (D5): `python3 deploy/release_manifest.py --help`.

The code is app/release_manifest.py (standard library only). It is imported without the `app`
package's Flask factory (deploy/app_modules.py), so this runs on a host without Flask, a node
included.
"""

import sys

from app_modules import load

release_manifest = load("release_manifest")  # and, through its own import, app/rules.py

if __name__ == "__main__":
    sys.exit(release_manifest.main())
