"""Settings validation: each refusal names the variable (STYLE 2, L1, spec "Names")."""

from __future__ import annotations

import stat

import pytest

from app.config import ConfigError, ensure_instance_secrets, load_settings, normalize_origin
from tests.support import OPERATOR_KEY

BASE = {"MODELFORGE_OPERATOR_API_KEY": OPERATOR_KEY, "MODELFORGE_SECRET_KEY": "s"}


def settings(tmp_path, **env):
    return load_settings({**BASE, **env}, tmp_path)


def test_defaults_match_the_spec(tmp_path):
    loaded = settings(tmp_path)
    assert loaded.bind == "127.0.0.1:8000"
    assert loaded.heartbeat_interval_seconds == 15
    assert loaded.node_stale_after_seconds == 45
    assert loaded.node_offline_after_seconds == 120
    assert loaded.sweep_interval_seconds == 5
    assert loaded.database_url == f"sqlite:///{tmp_path / 'modelforge.sqlite3'}"
    assert loaded.public_api_origin is None


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MODELFORGE_OPERATOR_API_KEY": "short"}, "MODELFORGE_OPERATOR_API_KEY"),
        (
            {"MODELFORGE_NODE_STALE_AFTER_SECONDS": "60", "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "60"},
            "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS (60) must exceed MODELFORGE_NODE_STALE_AFTER_SECONDS",
        ),
        ({"MODELFORGE_NODE_STALE_AFTER_SECONDS": "0"}, "MODELFORGE_NODE_STALE_AFTER_SECONDS"),
        (
            {"MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": "45"},
            "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS (45) must be less than MODELFORGE_NODE_STALE_AFTER_SECONDS (45)",
        ),
        ({"MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": "fast"}, "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS"),
        ({"MODELFORGE_DATABASE_URL": "mysql://root@db/x"}, "MODELFORGE_DATABASE_URL"),
        ({"MODELFORGE_DATABASE_URL": "sqlite://relative.db"}, "MODELFORGE_DATABASE_URL"),
        ({"MODELFORGE_PUBLIC_API_ORIGIN": "not a url"}, "MODELFORGE_PUBLIC_API_ORIGIN"),
        ({"MODELFORGE_TRUSTED_PROXY_HOPS": "yes"}, "MODELFORGE_TRUSTED_PROXY_HOPS must be a whole number of proxies"),
        ({"MODELFORGE_TRUSTED_PROXY_HOPS": "-1"}, "MODELFORGE_TRUSTED_PROXY_HOPS must be at least 0"),
    ],
)
def test_refusals_name_the_variable(tmp_path, env, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
        settings(tmp_path, **env)


def test_missing_operator_key_points_at_make_run(tmp_path):
    with pytest.raises(ConfigError, match="MODELFORGE_OPERATOR_API_KEY.*make run"):
        load_settings({"MODELFORGE_SECRET_KEY": "s"}, tmp_path)


def test_postgresql_urls_use_psycopg3(tmp_path):
    loaded = settings(tmp_path, MODELFORGE_DATABASE_URL="postgresql://u@db/modelforge")
    assert loaded.database_url == "postgresql+psycopg://u@db/modelforge"


def test_instance_secrets_are_generated_once_with_mode_0600(tmp_path):
    created = ensure_instance_secrets(tmp_path)
    assert set(created) == {"operator-api-key", "secret-key"}
    key = (tmp_path / "operator-api-key").read_text().strip()
    for path in created.values():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_instance_secrets(tmp_path) == {}
    assert (tmp_path / "operator-api-key").read_text().strip() == key
    loaded = load_settings({}, tmp_path)
    assert loaded.operator_api_key == key and len(key) >= 32


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://ModelForge.LAN:443/api", "https://modelforge.lan"),
        ("http://10.0.0.5:8000/", "http://10.0.0.5:8000"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        ("ftp://x", None),
        ("https://modelforge.example:99999", None),
    ],
)
def test_normalize_origin(url, origin):
    assert normalize_origin(url) == origin


def test_secrets_set_in_the_environment_are_not_generated(tmp_path):
    created = ensure_instance_secrets(tmp_path, {"MODELFORGE_OPERATOR_API_KEY": OPERATOR_KEY})
    assert set(created) == {"secret-key"}
    assert not (tmp_path / "operator-api-key").exists()
