"""The console in real Chromium (Debian's /usr/bin/chromium, driven by Playwright) against the
real gunicorn, with the real node agent started by the wizard's own start command (C1–C5, R2).

Each step is saved as a screenshot under test-artifacts/console/ (MODELFORGE_TEST_ARTIFACTS
moves it). CI installs Chromium; without it these tests skip, and CI fails on a skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support import PROJECT_ROOT, assert_no_secrets
from tests.support.agent import FAKE_NVML_DIR, nvidia_agent
from tests.support.browser import expect, sign_in

GPU_SCENARIO = json.dumps(
    {
        "gpus": [
            {
                "uuid": "GPU-2f6a1c0e-0000-4000-8000-00000000c0de",
                "name": "NVIDIA GeForce RTX 4090",
                "memory_total": 25_757_220_864,
                "memory_used": 3_221_225_472,
                "utilization": 41,
                "temperature": 56,
                "power_mw": 212_000,
                "pci_bus_id": "00000000:01:00.0",
            }
        ]
    }
)

# The stand-in `docker` for the wizard's start and recreate commands: it reads the env files
# the command passes, interpolates docker-compose.node-agent.yml's `environment:` block with
# them exactly as Compose would, maps the container paths to the test's "volumes", and runs
# the real agent in the background. It records which env files it got and their modes (never
# their contents), so the test can check the token file was 0600 and dropped on recreate.
STANDIN_DOCKER = r"""#!{python}
import json, os, re, signal, subprocess, sys, time
import yaml

home = os.environ["STANDIN_HOME"]
args = sys.argv[1:]
env_files = [args[i + 1] for i, arg in enumerate(args) if arg == "--env-file"]
compose_file = args[args.index("-f") + 1]
sys.path.insert(0, {project_root!r})
from tests.support.compose_dotenv import read_compose_dotenv  # Compose's own .env rules

files = {{path: read_compose_dotenv(open(path, encoding="utf-8").read()) for path in env_files}}
values = {{key: value for read in files.values() for key, value in read.items()}}
with open(os.path.join(home, "docker-calls.jsonl"), "a", encoding="utf-8") as log:
    log.write(json.dumps({{"argv": args, "env_files": [
        {{"path": path, "mode": oct(os.stat(path).st_mode & 0o777), "keys": sorted(read)}}
        for path, read in files.items()]}}) + "\n")

def interpolate(text):
    def one(match):
        name, op, default = match.group(1), match.group(2), match.group(3) or ""
        value = values.get(name, "")
        if op == ":?" and not value:
            sys.exit(f"standin docker: required variable {{name}} is missing")
        return value or (default if op == ":-" else "")
    return re.sub(r"\$\{{([A-Z0-9_]+)(?:(:[-?])([^}}]*))?\}}", one, str(text))

service = yaml.safe_load(open(compose_file, encoding="utf-8"))["services"]["node-agent"]
env = {{key: interpolate(value) for key, value in service["environment"].items()}}
for container_dir in ("state", "hf-cache", "artifacts", "quarantine"):
    os.makedirs(os.path.join(home, container_dir), exist_ok=True)
env = {{key: (os.path.join(home, value[len("/data/"):]) if value.startswith("/data/") else value)
       for key, value in env.items()}}
env.update(PATH=os.environ["PATH"], PYTHONPATH={fake_nvml!r}, FAKE_NVML_SCENARIO=os.environ["STANDIN_SCENARIO"])
pid_file = os.path.join(home, "agent.pid")
if os.path.exists(pid_file):
    try:
        os.kill(int(open(pid_file).read()), signal.SIGTERM)
        time.sleep(1)
    except ProcessLookupError:
        pass
with open(os.path.join(home, "agent.log"), "ab") as agent_log:
    process = subprocess.Popen([sys.executable, "-m", "modelforge_node_agent"], env=env, stdout=agent_log,
                               stderr=subprocess.STDOUT, start_new_session=True)
open(pid_file, "w").write(str(process.pid))
"""


def fill_wizard(page, display_name: str, expiry: str = "900") -> str:
    """Step 1 of the wizard; returns the revealed token."""
    page.click("nav >> text=Enrol node")
    expect(page.locator("[data-step=form]")).to_be_visible()
    page.fill("#display_name", display_name)
    page.fill("#labels", "rack=a\ngpu=4090")
    page.select_option("#expires_in_seconds", expiry)
    page.select_option("#accelerator_mode", "nvidia")
    page.check("input[name=image_source][value=local]")  # the stand-in docker runs this checkout's agent
    page.steps.shot("wizard-form")
    page.click("button:has-text('Create one-time token')")
    return revealed_secret(page, "#enrollment-token", "mfe_")


def revealed_secret(page, selector: str, prefix: str) -> str:
    """The secret a reveal shows (once), after checking it is visible and shaped right."""
    element = page.locator(selector)
    expect(element).to_be_visible()
    secret = element.inner_text().strip()
    assert secret.startswith(prefix)
    return secret


def run_bash(script: str, cwd: Path, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess:
    """Run a generated command as an admin would paste it into Bash."""
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def node_host(tmp_path):
    """A stand-in node: a deploy/ directory with the real compose file and a `docker` on PATH."""
    deploy = tmp_path / "node" / "deploy"
    deploy.mkdir(parents=True)
    shutil.copy(PROJECT_ROOT / "deploy" / "docker-compose.node-agent.yml", deploy)
    bin_dir = tmp_path / "node" / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(
        STANDIN_DOCKER.format(python=sys.executable, fake_nvml=FAKE_NVML_DIR, project_root=str(PROJECT_ROOT))
    )
    docker.chmod(0o755)
    home = tmp_path / "node" / "volumes"
    home.mkdir()
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path / "node"),
        "STANDIN_HOME": str(home),
        "STANDIN_SCENARIO": GPU_SCENARIO,
    }
    yield {"deploy": deploy, "home": home, "env": env}
    agent_log = home / "agent.log"
    print(agent_log.read_text() if agent_log.exists() else "no agent log")  # shown when the test fails
    pid_file = home / "agent.pid"
    if pid_file.exists():
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)
        except ProcessLookupError:
            pass


def docker_calls(home: Path) -> list[dict]:
    path = home / "docker-calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_wizard_reveals_once_starts_a_real_agent_and_turns_ready_by_itself(page, agent_server, node_host):
    base = agent_server.url
    sign_in(page, base)
    page.steps.shot("signed-in-no-nodes")
    expect(page.locator(".mf-empty")).to_contain_text("No nodes yet")

    token = fill_wizard(page, "Browser node")
    page.steps.shot("token-revealed")
    assert page.locator("[data-testid=api-origin]").count() == 0  # the form step is gone
    env_text = page.locator("#env-file").inner_text()
    start_command = page.locator("#start-command").inner_text()
    assert f"MODELFORGE_AGENT_CONTROL_PLANE_URL={base}" in env_text
    assert token not in env_text and token not in start_command
    assert token not in page.url

    # On the node: save the .env, paste the start command, paste the token at the hidden prompt.
    (node_host["deploy"] / ".env").write_text(env_text)
    started = run_bash(start_command, node_host["deploy"], node_host["env"], stdin=token + "\n")
    assert started.returncode == 0, started.stderr
    assert token not in started.stdout + started.stderr
    (call,) = docker_calls(node_host["home"])
    (token_file,) = call["env_files"]  # .env and the token in one file: any Compose v2 reads it
    assert token_file["mode"] == "0o600" and "MODELFORGE_AGENT_ENROLLMENT_TOKEN" in token_file["keys"]
    assert "MODELFORGE_AGENT_CONTROL_PLANE_URL" in token_file["keys"]
    assert not Path(token_file["path"]).exists()  # removed as soon as the command finished

    # "Check node readiness" takes the token out of the page, then the panel polls by itself.
    page.click("button:has-text('Check node readiness')")
    expect(page.locator("[data-step=progress]")).to_be_visible()
    expect(page.locator("[data-secret]")).to_have_count(0)
    assert token not in page.content()
    page.steps.shot("readiness-waiting")
    panel = page.locator("#readiness-panel")
    expect(panel).to_have_attribute("data-ready", "true", timeout=45_000)
    assert panel.get_attribute("data-polling") == "false"
    expect(page.locator("[data-testid=enrollment-state]")).to_have_text("consumed")
    expect(page.locator("button:has-text('Revoke unused token')")).to_have_count(0)
    for check in ("connection", "inventory", "protocol", "agent_health", "telemetry"):
        expect(page.locator(f"[data-check={check}]")).to_have_attribute("data-status", "pass")
    page.steps.shot("readiness-ready")
    node_id = re.search(r"/hardware/nodes/([0-9a-f-]{36})", panel.inner_html()).group(1)

    # The readiness step has its own URL (no token in it); a reload stays there, and the server
    # never had the token to give back.
    expect(page).to_have_url(re.compile(r"/hardware/enrollments/[0-9a-f-]{36}$"))
    page.reload()
    assert token not in page.content()
    expect(page.locator("#readiness-panel")).to_have_attribute("data-ready", "true")

    # The recreate command drops the token file and keeps the identity (I3).
    recreated = run_bash(page.locator("#recreate-command").inner_text(), node_host["deploy"], node_host["env"])
    assert recreated.returncode == 0, recreated.stderr
    second = docker_calls(node_host["home"])[1]
    assert "--force-recreate" in second["argv"] and len(second["env_files"]) == 1
    deadline = time.monotonic() + 30
    log = node_host["home"] / "agent.log"
    while "starting with its stored credential" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f"node {node_id} starting with its stored credential" in log.read_text()

    page.goto(base + "/hardware/nodes")
    row = page.locator(f"tr[data-node-id='{node_id}']")
    expect(row).to_contain_text("Browser node")
    expect(row).to_contain_text(os.uname().nodename)  # the start command wrote the node's name into .env (I4)
    expect(row).to_contain_text("online")
    expect(row).to_contain_text("1 × NVIDIA GeForce RTX 4090")
    page.steps.shot("nodes-list")
    page.fill("input[name=q]", "no-such-node")
    expect(page.locator("#nodes-table")).to_contain_text("No node matches this filter.")
    expect(page).to_have_url(re.compile(r"[?&]q=no-such-node"))
    page.select_option("select[name=status]", "online")
    page.fill("input[name=q]", "browser")
    expect(page.locator(f"tr[data-node-id='{node_id}']")).to_be_visible()
    page.steps.shot("nodes-filtered")
    assert_no_secrets(agent_server.log() + log.read_text(), token)


def test_closing_the_wizard_removes_the_token_from_the_page_and_history(page, agent_server):
    sign_in(page, agent_server.url)
    token = fill_wizard(page, "Closed wizard")
    page.steps.shot("token-revealed")
    page.click("a:has-text('Close')")
    expect(page).to_have_url(agent_server.url + "/hardware/nodes")
    assert token not in page.content()
    page.go_back()
    expect(page.locator("[data-step=form]")).to_be_visible()
    assert token not in page.content()
    page.steps.shot("after-back")
    assert_no_secrets(agent_server.log(), token)


def test_the_release_bundle_is_one_choice_away_and_its_manifest_entry_is_checked(page, agent_server):
    sign_in(page, agent_server.url)
    page.click("nav >> text=Enrol node")
    # Issue 25: the default is the build from the checkout, which needs no release manifest.
    expect(page.locator("input[name=image_source][value=local]")).to_be_checked()
    expect(page.locator("[data-testid=release-needs]")).to_contain_text("A clone of the repository has none of them")
    page.check("input[name=image_source][value=release]")
    page.fill("#display_name", "Release node")
    page.fill("#release_entry", '{"tag": "modelforge-node-agent:latest"}')
    # The refusal is a 422 that the form swaps in; Chromium and htmx both log such a response.
    page.expected_errors += ["status of 422", "Response Status Error Code 422 from /hardware/enroll"]
    page.click("button:has-text('Create one-time token')")
    expect(page.locator("#image-source .mf-field-error")).to_contain_text("must carry a release version")
    page.steps.shot("release-entry-refused")
    entry = {
        "tag": "modelforge-node-agent:1.3.0-rc.1",
        "architecture": "amd64",
        "rootfs_layers": ["sha256:" + "a" * 64, "sha256:" + "b" * 64],
        "labels": {"org.opencontainers.image.version": "1.3.0-rc.1"},
        "config": {
            "entrypoint": ["/usr/bin/python3"],
            "cmd": [],
            "env": [],
            "volumes": [],
            "exposed_ports": [],
            "user": "65532",
            "working_dir": "",
        },
    }
    page.fill("#release_entry", json.dumps({"images": {"modelforge-node-agent": entry}}, indent=2))
    page.click("button:has-text('Create one-time token')")
    token = revealed_secret(page, "#enrollment-token", "mfe_")
    expect(page.locator("#env-file")).to_contain_text("MODELFORGE_NODE_AGENT_IMAGE=modelforge-node-agent:1.3.0-rc.1")
    expect(page.locator("#start-command")).to_contain_text("expect_image 'RootFS layers'")
    expect(page.locator("#start-command")).to_contain_text("up --no-start --no-build --pull never")
    page.steps.shot("release-reveal")
    page.click("button:has-text('Check node readiness')")
    expect(page.locator("#recreate-command")).to_contain_text("--force-recreate --no-build --pull never")
    assert token not in page.content()


def test_revoking_the_unused_token_clears_it(page, agent_server):
    sign_in(page, agent_server.url)
    token = fill_wizard(page, "Revoked wizard")
    page.click("button:has-text('Revoke unused token')")
    expect(page.locator("[data-testid=enrollment-state]")).to_have_text("revoked")
    assert token not in page.content()
    expect(page.locator("#readiness-panel")).to_have_attribute("data-polling", "false")
    page.steps.shot("revoked")
    refused = requests.post(
        agent_server.url + "/api/v1/agent/enroll",
        json={
            "enrollment_token": token,
            "node_id": "8d1f7c1e-1111-4111-8111-111111111111",
            "hostname": "late-node",
            "control_plane_url": agent_server.url,
            "protocol_version": 1,
            "agent_version": "test",
        },
        timeout=10,
    )
    assert refused.status_code == 410


def test_the_countdown_removes_the_token_at_expiry(page, agent_server):
    page.clock.install()
    sign_in(page, agent_server.url)
    token = fill_wizard(page, "Expiring wizard", expiry="300")
    expect(page.locator(".mf-countdown")).to_contain_text("min")
    page.clock.run_for("04:58")
    assert token in page.content()  # not a moment early
    page.clock.run_for("00:05")
    expect(page.locator("[data-secret]")).to_have_count(0)
    expect(page.locator("[data-secret-cleared=expired]")).to_be_visible()
    assert token not in page.content()
    page.steps.shot("expired")


def test_a_hidden_tab_stops_polling_and_a_shown_one_resumes(page, agent_server):
    page.clock.install()
    sign_in(page, agent_server.url)
    polls: list[str] = []
    page.on("request", lambda request: "/hardware/nodes" in request.url and polls.append(request.url))
    poller = page.locator("#nodes-table")

    def five_seconds_pass(times: int, *, polled: bool) -> None:
        for _ in range(times):
            # Each poll swaps in a fresh #nodes-table, and only that fresh element's timer fires
            # the next one: wait for it (however slow the server is) before moving the clock on.
            poller.evaluate("element => element.setAttribute('data-seen', '')")
            page.clock.run_for(5_100)
            if polled:
                expect(page.locator("#nodes-table:not([data-seen])")).to_have_count(1)
            else:
                page.wait_for_timeout(500)  # time for a request that should not come
                expect(page.locator("#nodes-table[data-seen]")).to_have_count(1)

    five_seconds_pass(2, polled=True)
    assert len(polls) == 2, polls  # visible: the list refreshes every 5 s
    page.evaluate("Object.defineProperty(document, 'hidden', {configurable: true, get: () => true})")
    five_seconds_pass(3, polled=False)
    assert len(polls) == 2, polls  # hidden: nothing
    page.evaluate("Object.defineProperty(document, 'hidden', {configurable: true, get: () => false})")
    five_seconds_pass(1, polled=True)
    assert len(polls) == 3, polls


# The text a field's placeholder needs against the room inside the field, as Chromium lays it out.
PLACEHOLDER_FIT = """input => {
    const style = getComputedStyle(input);
    const context = document.createElement('canvas').getContext('2d');
    context.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    return [context.measureText(input.placeholder).width, room];
}"""


def test_the_node_search_placeholder_is_not_cut_off_on_a_laptop_or_a_phone(page, agent_server):
    sign_in(page, agent_server.url)
    search = page.locator("input[name=q]")
    for width, height in ((1366, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        needed, room = search.evaluate(PLACEHOLDER_FIT)
        assert 0 < needed <= room, (width, needed, room)


def test_over_https_the_session_cookie_is_secure_and_forms_still_pass_csrf(browser_context, tls_server):
    # Chromium is not told about the test's private CA, so it is told to accept the certificate;
    # what is under test is the cookie and Flask-WTF's HTTPS Referer check, not the chain.
    page = browser_context(ignore_https_errors=True)
    sign_in(page, tls_server.url)
    (cookie,) = [cookie for cookie in page.context.cookies() if cookie["name"] == "modelforge_session"]
    assert cookie["secure"] and cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    token = fill_wizard(page, "HTTPS node")
    assert tls_server.url.startswith("https://")
    expect(page.locator("#env-file")).to_contain_text(f"MODELFORGE_AGENT_CONTROL_PLANE_URL={tls_server.url}")
    page.click("button:has-text('Revoke unused token')")
    expect(page.locator("[data-testid=enrollment-state]")).to_have_text("revoked")
    page.steps.shot("https-revoked")
    assert_no_secrets(tls_server.log(), token)


def test_rotate_and_disable_from_the_node_page(page, agent_server, tmp_path):
    agent, minted = nvidia_agent(tmp_path, agent_server, GPU_SCENARIO, name="rotated")
    agent.start()
    try:
        node_id = agent.wait_for(r"enrolled as node ([0-9a-f-]{36})")[0].group(1)
        agent.wait_for(r"inventory", timeout=30)
        sign_in(page, agent_server.url, f"/hardware/nodes/{node_id}")
        expect(page.locator("[data-testid=node-status]")).to_have_text("online", timeout=15_000)
        expect(page.locator("#node-live")).to_contain_text("NVIDIA GeForce RTX 4090")
        page.steps.shot("node-page")
        tabs = page.locator("nav[aria-label='Node sections']")
        tabs.locator("text=GPUs & telemetry").click()
        expect(page).to_have_url(re.compile(rf"/hardware/nodes/{node_id}/gpus$"))
        expect(tabs.locator("[aria-current=page]")).to_have_text("GPUs & telemetry")
        expect(page.locator("#node-charts svg")).to_have_count(4)
        expect(page.locator("#node-gpus")).to_contain_text("NVIDIA GeForce RTX 4090")
        page.steps.shot("node-gpus-tab")

        tabs.locator("text=Credential").click()
        page.click("button:has-text('Rotate credential')")
        credential = revealed_secret(page, "#revealed-credential", "mfn_")
        expect(page.locator("#replace-command")).to_contain_text("node-credential")
        page.steps.shot("credential-rotated")
        # the old credential stopped working at once: the running agent exits 5 (I5)
        assert agent.process.wait(timeout=30) == 5
        page.click("button:has-text('hide the credential')")
        expect(page.locator("[data-secret]")).to_have_count(0)
        assert credential not in page.content()
        expect(page.locator("#node-credential tbody tr")).to_have_count(2)

        tabs.locator("text=Overview").click()
        page.click("#node-actions button:has-text('Disable node')")
        expect(page.locator("[data-testid=node-disabled]")).to_be_visible()
        expect(page.locator("button:has-text('Enable node')")).to_be_visible()
        page.steps.shot("node-disabled")
        page.click("button:has-text('Enable node')")
        expect(page.locator("[data-testid=node-disabled]")).to_have_count(0)
        tabs.locator("text=Audit").click()
        expect(page.locator("#audit-table")).to_contain_text("node.enabled")

        page.click("nav >> text=Audit log")
        expect(page.locator("#audit-table")).to_contain_text("credential.rotated")
        page.select_option("select[name=action]", "node.disabled")
        expect(page.locator("#audit-table tbody tr")).to_have_count(1)
        page.steps.shot("audit-filtered")
        assert_no_secrets(agent_server.log() + agent.log_path.read_text(), minted["token"], credential)
    finally:
        agent.stop()
