"""`flask --app wsgi modelforge …` commands for operators."""

from __future__ import annotations

import json

import click
from flask import Flask
from flask.cli import AppGroup

from app.config import current_settings

group = AppGroup("modelforge", help="ModelForge operator commands.")


@group.command("sweep")
def sweep_command() -> None:
    """Run the liveness, enrolment-expiry and telemetry-retention sweeps once, now."""
    # Imported here: `python -m app.scheduler` must not find itself already imported by `app`.
    from app import scheduler

    click.echo(json.dumps(scheduler.run_all_now(current_settings()), indent=2))


def init_app(app: Flask) -> None:
    """Register the command group."""
    app.cli.add_command(group)
