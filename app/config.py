"""Settings read from MODELFORGE_* variables, validated once at start-up.

Every refusal is a `ConfigError` whose message names the variable, so an admin reading
one line of a failed start knows what to change (STYLE guideline 2).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from flask import Flask, current_app

MIN_OPERATOR_KEY_LENGTH = 32
OPERATOR_KEY_FILE = "operator-api-key"
SECRET_KEY_FILE = "secret-key"
SETTINGS_KEY = "MODELFORGE"  # where create_app keeps the Settings in app.config


class ConfigError(Exception):
    """A setting is missing or invalid; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    """The control plane's validated configuration."""

    instance_path: Path
    operator_api_key: str
    secret_key: str
    database_url: str
    bind: str
    public_api_origin: str | None
    heartbeat_interval_seconds: int
    node_stale_after_seconds: int
    node_offline_after_seconds: int
    sweep_interval_seconds: int
    job_lease_seconds: int
    job_progress_interval_seconds: int
    max_request_bytes: int
    trusted_proxy_hops: int
    telemetry_raw_retention_seconds: int
    telemetry_rollup_retention_seconds: int
    run_scheduler: bool
    # A2, P5: heartbeats and inventories sooner than half the interval after the node's last
    # accepted one get 429 (app.nodes.rate_limits). Off until the test suite's in-process fixtures,
    # which publish back to back, opt out of it; turned on in production and by its own tests.
    node_rate_limit: bool = True
    # O1: a second secret that reads GET /metrics only (Prometheus's bearer token); None: only the
    # operator key reads it. Kept out of repr so no log of the settings carries it (P2).
    metrics_token: str | None = field(default=None, repr=False)
    # O2: apprise URLs that alerts go to (they carry the services' secrets: kept out of repr, shown
    # masked, read by app.alerts.targets only).
    alert_urls: tuple[str, ...] = field(default=(), repr=False)
    # Which variable they came from, for the settings page ("from MODELFORGE_ALERT_URLS_FILE").
    alert_urls_source: str = "MODELFORGE_ALERT_URLS"

    def as_flask_config(self) -> dict[str, object]:
        """The Flask config keys these settings fill in."""
        return {
            "SECRET_KEY": self.secret_key,
            "SQLALCHEMY_DATABASE_URI": self.database_url,
            "MAX_CONTENT_LENGTH": self.max_request_bytes,
            SETTINGS_KEY: self,
        }


def current_settings(app: Flask | None = None) -> Settings:
    """The running control plane's settings: `app`'s, else the current app's."""
    return (current_app if app is None else app).config[SETTINGS_KEY]


def _int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 1, unit: str = "seconds") -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number of {unit}, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _read_instance_secret(instance_path: Path, filename: str) -> str | None:
    path = instance_path / filename
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def ensure_instance_secrets(instance_path: Path, env: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Create the operator key and session secret once, mode 0600, unless the environment sets
    them; return the files made."""
    env = env or {}
    instance_path.mkdir(parents=True, exist_ok=True)
    created = {}
    for filename, variable in (
        (OPERATOR_KEY_FILE, "MODELFORGE_OPERATOR_API_KEY"),
        (SECRET_KEY_FILE, "MODELFORGE_SECRET_KEY"),
    ):
        path = instance_path / filename
        if path.exists() or env.get(variable, "").strip():
            continue
        # O_EXCL: two starts racing never overwrite each other's key.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")
        created[filename] = path
    return created


def _database_url(env: Mapping[str, str], instance_path: Path) -> str:
    name = "MODELFORGE_DATABASE_URL"
    url = env.get(name, "").strip()
    if not url:
        return f"sqlite:///{instance_path / 'modelforge.sqlite3'}"
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme == "sqlite":
        if not url.startswith("sqlite:///"):
            raise ConfigError(f"{name}: SQLite URLs look like sqlite:////absolute/path.sqlite3")
        return url
    if scheme in {"postgresql", "postgresql+psycopg"}:
        # One driver everywhere: psycopg 3.
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    raise ConfigError(f"{name} must start with sqlite:/// or postgresql+psycopg://, got scheme {scheme or '(none)'!r}")


def normalize_origin(url: str) -> str | None:
    """Return scheme://host[:port] in lower case with default ports dropped, or None if not a URL."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    default_port = {"http": 80, "https": 443}[parts.scheme]
    if port is None or port == default_port:
        return f"{parts.scheme}://{host}"
    return f"{parts.scheme}://{host}:{port}"


MIN_METRICS_TOKEN_LENGTH = 32


def _metrics_token(env: Mapping[str, str]) -> str | None:
    """O1: MODELFORGE_METRICS_TOKEN, long and plain enough to be a bearer token, or None when unset."""
    name = "MODELFORGE_METRICS_TOKEN"
    token = env.get(name, "").strip()
    if not token:
        return None
    # The value itself never appears in a refusal (P2): it is a secret even when it is wrong.
    if len(token) < MIN_METRICS_TOKEN_LENGTH:
        raise ConfigError(f"{name} must be at least {MIN_METRICS_TOKEN_LENGTH} characters")
    if not all("!" <= character <= "~" for character in token):
        raise ConfigError(f"{name} must be printable ASCII without spaces (it travels as a bearer token)")
    return token


def _alert_urls(env: Mapping[str, str]) -> tuple[tuple[str, ...], str]:
    """O2: MODELFORGE_ALERT_URLS, or the file MODELFORGE_ALERT_URLS_FILE names (each URL one apprise
    reads), and the variable they came from.

    No refusal quotes a URL, since each carries its service's secret: entries are named by
    position and scheme.
    """
    inline, file_name = "MODELFORGE_ALERT_URLS", "MODELFORGE_ALERT_URLS_FILE"
    text, path = env.get(inline, "").strip(), env.get(file_name, "").strip()
    if text and path:
        raise ConfigError(f"set {inline} or {file_name}, not both")
    source = inline
    if path:
        source = f"{file_name} ({path})"
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"{file_name}: cannot read {path}: {type(error).__name__}") from None
        text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    if not text:
        return (), inline
    from app.alerts import targets  # apprise is imported only when alerts are configured

    urls = targets.split_urls(text)
    for number, scheme in targets.unreadable(urls):
        raise ConfigError(
            f"{source}: entry {number} of {len(urls)} ({scheme}) is not a URL apprise can send to; "
            "see https://github.com/caronc/apprise/wiki for each service's URL"
        )
    return tuple(urls), file_name if path else inline


def load_settings(env: Mapping[str, str], instance_path: Path) -> Settings:
    """Parse and validate every MODELFORGE_* setting, or raise ConfigError naming the variable."""
    instance_path = Path(env.get("MODELFORGE_INSTANCE_PATH") or instance_path)

    operator_key = env.get("MODELFORGE_OPERATOR_API_KEY", "").strip() or _read_instance_secret(
        instance_path, OPERATOR_KEY_FILE
    )
    if not operator_key:
        raise ConfigError(
            "MODELFORGE_OPERATOR_API_KEY is not set and instance/operator-api-key does not exist; "
            "run `make run` once or set the variable"
        )
    if len(operator_key) < MIN_OPERATOR_KEY_LENGTH:
        raise ConfigError(f"MODELFORGE_OPERATOR_API_KEY must be at least {MIN_OPERATOR_KEY_LENGTH} characters")

    secret_key = env.get("MODELFORGE_SECRET_KEY", "").strip() or _read_instance_secret(instance_path, SECRET_KEY_FILE)
    if not secret_key:
        raise ConfigError(
            "MODELFORGE_SECRET_KEY is not set and instance/secret-key does not exist; "
            "run `make run` once or set the variable"
        )

    public_origin = env.get("MODELFORGE_PUBLIC_API_ORIGIN", "").strip() or None
    if public_origin is not None:
        normalized = normalize_origin(public_origin)
        if normalized is None:
            raise ConfigError(
                "MODELFORGE_PUBLIC_API_ORIGIN must be an http(s) origin such as "
                f"https://modelforge.lan, got {public_origin!r}"
            )
        public_origin = normalized

    stale = _int(env, "MODELFORGE_NODE_STALE_AFTER_SECONDS", 45)
    offline = _int(env, "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS", 120)
    if offline <= stale:
        # L1: refuse to start, naming both variables.
        raise ConfigError(
            f"MODELFORGE_NODE_OFFLINE_AFTER_SECONDS ({offline}) must exceed "
            f"MODELFORGE_NODE_STALE_AFTER_SECONDS ({stale})"
        )

    raw_retention = _int(env, "MODELFORGE_TELEMETRY_RAW_RETENTION_SECONDS", 6 * 3600, minimum=300)
    rollup_retention = _int(env, "MODELFORGE_TELEMETRY_ROLLUP_RETENTION_SECONDS", 7 * 86400, minimum=300)
    if rollup_retention < raw_retention:
        raise ConfigError(
            f"MODELFORGE_TELEMETRY_ROLLUP_RETENTION_SECONDS ({rollup_retention}) must be at least "
            f"MODELFORGE_TELEMETRY_RAW_RETENTION_SECONDS ({raw_retention})"
        )

    heartbeat_interval = _int(env, "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS", 15)
    if heartbeat_interval >= stale:
        # Every node would flap between online and stale between two heartbeats.
        raise ConfigError(
            f"MODELFORGE_HEARTBEAT_INTERVAL_SECONDS ({heartbeat_interval}) must be less than "
            f"MODELFORGE_NODE_STALE_AFTER_SECONDS ({stale})"
        )

    bind = env.get("MODELFORGE_BIND", "").strip() or "127.0.0.1:8000"
    # J2: an agent reports at least three times per lease, so one lost report never costs the job.
    lease = _int(env, "MODELFORGE_JOB_LEASE_SECONDS", 60, minimum=3)
    alert_urls, alert_urls_source = _alert_urls(env)
    return Settings(
        instance_path=instance_path,
        operator_api_key=operator_key,
        secret_key=secret_key,
        database_url=_database_url(env, instance_path),
        bind=bind,
        public_api_origin=public_origin,
        heartbeat_interval_seconds=heartbeat_interval,
        node_stale_after_seconds=stale,
        node_offline_after_seconds=offline,
        sweep_interval_seconds=_int(env, "MODELFORGE_SWEEP_INTERVAL_SECONDS", 5),
        job_lease_seconds=lease,
        job_progress_interval_seconds=max(1, min(5, lease // 3)),
        max_request_bytes=_int(env, "MODELFORGE_MAX_REQUEST_BYTES", 256 * 1024, minimum=1024, unit="bytes"),
        trusted_proxy_hops=_int(env, "MODELFORGE_TRUSTED_PROXY_HOPS", 0, minimum=0, unit="proxies"),
        telemetry_raw_retention_seconds=raw_retention,
        telemetry_rollup_retention_seconds=rollup_retention,
        run_scheduler=_bool(env, "MODELFORGE_SCHEDULER", True),
        node_rate_limit=_bool(env, "MODELFORGE_NODE_RATE_LIMIT", True),
        metrics_token=_metrics_token(env),
        alert_urls=alert_urls,
        alert_urls_source=alert_urls_source,
    )
