"""WSGI entry point: `gunicorn wsgi:app`."""

import sys

from app import ConfigError, create_app

try:
    app = create_app()
except ConfigError as error:
    # One line naming the variable, not a traceback (STYLE guideline 2).
    print(f"modelforge: configuration error: {error}", file=sys.stderr)
    raise SystemExit(2) from None
