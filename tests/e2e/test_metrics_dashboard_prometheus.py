"""O1: the operator guide's scrape job is a configuration Prometheus's promtool accepts."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.support import PROJECT_ROOT


def test_the_operator_guides_scrape_job_is_a_config_prometheus_accepts(tmp_path):
    if PROMTOOL is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    section = GUIDE.read_text(encoding="utf-8").split("## 13. Prometheus and Grafana", 1)[1]
    (scrape_config,) = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert "metrics_path: /metrics" in scrape_config and "credentials_file:" in scrape_config
    token = tmp_path / "modelforge-metrics-token"
    token.write_text("t" * 40)
    config = tmp_path / "prometheus.yml"
    config.write_text(scrape_config.replace("/etc/prometheus/modelforge-metrics-token", str(token)))
    checked = subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


PROMTOOL = shutil.which("promtool")


GUIDE = PROJECT_ROOT / "docs" / "operator-guide.md"
