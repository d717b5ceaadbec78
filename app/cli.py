"""`flask --app wsgi modelforge …` commands for operators."""

from __future__ import annotations

import json
from pathlib import Path

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


@group.command("backup")
@click.argument("destination", required=False, type=click.Path(path_type=Path))
def backup_command(destination: Path | None) -> None:
    """Copy the database online into DESTINATION (a new file or a directory; default instance/backups/)."""
    from app import backup

    settings = current_settings()
    target = destination or backup.default_destination(settings.instance_path, settings.database_url)
    try:
        done = backup.backup(settings.database_url, target)
    except backup.BackupError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"modelforge: backup written to {done.path} ({done.size_bytes} bytes, schema revision {done.revision})")


@group.command("restore")
@click.argument("backup_file", type=click.Path(path_type=Path))
def restore_command(backup_file: Path) -> None:
    """Put BACKUP_FILE in place of the database; stop the control plane first."""
    from app import backup
    from app.extensions import db

    db.engine.dispose()  # this process keeps no connection of its own to the file it replaces
    try:
        done = backup.restore(current_settings().database_url, backup_file)
    except backup.BackupError as error:
        raise click.ClickException(str(error)) from None
    aside = "".join(f"\n  moved aside: {path}" for path in done.moved_aside)
    click.echo(f"modelforge: restored {backup_file} into {done.database} (schema revision {done.revision}){aside}")
    click.echo("modelforge: now run `flask --app wsgi db upgrade` and start the control plane")


def init_app(app: Flask) -> None:
    """Register the command group."""
    app.cli.add_command(group)
