"""The jobs console in real Chromium against the real gunicorn, with the work done by the real node
agent against the stand-in Hub (J4, J1–J3, C3).

From a node's page: register a storage root, acquire a model, watch the job's progress bar move and
stop when the job ends, find the artifact back on the node page; and cancel a running acquire. The
Hub (tests/support/hub.py) throttles the download with short stalls so the bar visibly moves; each
step is a screenshot under test-artifacts/console/<test name>/.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import requests

from tests.support import ADMIN, assert_no_secrets
from tests.support.agent import AgentProcess, mint_token
from tests.support.browser import expect, sign_in
from tests.support.hub import Generated, StandinHub

HOST_PATH = "/mnt/cache/appdata/modelforge/model-registry"
CHUNK = 256 * 1024


@pytest.fixture
def node_agent(tmp_path, jobs_server, hub):
    """The real agent (cpu mode), enrolled, pointed at the stand-in Hub; its root directory made."""
    agent = AgentProcess(
        tmp_path,
        jobs_server.url,
        name="worker",
        MODELFORGE_AGENT_ENROLLMENT_TOKEN=mint_token(jobs_server.url)["token"],
        HF_ENDPOINT=hub.url,
        MODELFORGE_AGENT_STALL_SECONDS="10",
    )
    agent.container_path = agent.home / "artifacts" / "model-registry"
    agent.container_path.mkdir(parents=True)
    agent.start()
    try:
        agent.wait_for(r"enrolled as node ([0-9a-f-]{36})")
        yield agent
    finally:
        agent.stop()
        print(agent.log()[-20000:])  # shown only when the test fails


def throttle(hub: StandinHub, path: str, size: int, pause: float) -> None:
    """Pause the next download of `path` for `pause` seconds after every 256 KiB."""
    for offset in range(CHUNK, size, CHUNK):
        hub.stall(path, after_bytes=offset, seconds=pause)


def register_root_via_page(page, container_path: Path) -> None:
    """The node page's register form, as an admin fills it in (min free 1 MiB: the test disk is small)."""
    page.fill("#name", "models")
    page.fill("#host_path", HOST_PATH)
    page.fill("#container_path", str(container_path))
    page.fill("#min_free", "1")
    page.select_option("#min_free_unit", "MiB")
    page.click("button:has-text('Register root')")
    expect(page.locator("#storage-root-form .mf-notice")).to_contain_text("Storage root models registered")


def acquire_via_page(page, repo_id: str) -> str:
    """The node page's acquire form; returns the id of the job page it leads to."""
    expect(page.locator("#repo_id")).to_be_visible()  # the panel re-rendered with the new root
    page.fill("#repo_id", repo_id)
    page.click("#node-acquire button:has-text('Acquire')")
    expect(page).to_have_url(re.compile(r"/jobs/[0-9a-f-]{36}$"))
    return page.url.rsplit("/", 1)[1]


def live_panel(page) -> tuple[float | None, str, str]:
    """The bar's value, the job's state and the panel's text, read in one go (the panel swaps every 2 s)."""
    value, state, text = page.locator("#job-live").evaluate(
        "panel => [panel.querySelector('[role=progressbar]')?.getAttribute('aria-valuenow'),"
        " panel.dataset.state, panel.innerText]"
    )
    return (float(value) if value is not None else None), state, text


def wait_for_progress_above(page, floor: float, timeout: float = 30) -> tuple[float, str]:
    """Wait until the bar shows more than `floor` but is not yet full; returns its value and text."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        value, state, text = live_panel(page)
        seen.append((value, state))
        if value is not None and floor < value < 100 and state == "running":
            return value, text
        page.wait_for_timeout(100)
    raise AssertionError(f"the bar never passed {floor} while running: {seen[-10:]}")


def test_acquire_from_the_node_page_watch_the_bar_and_find_the_artifact(page, jobs_server, hub, node_agent):
    size = 8 * 2**20
    commit = hub.add_repo("org/tiny", {"config.json": b'{"model_type": "llama"}\n', "model.gguf": Generated(size)})
    throttle(hub, "model.gguf", size, pause=0.25)  # about 8 s for the whole file
    node_id = node_agent.node_id()
    sign_in(page, jobs_server.url, f"/hardware/nodes/{node_id}")
    expect(page.locator("[data-testid=node-status]")).to_have_text("online", timeout=15_000)
    page.goto(f"{jobs_server.url}/hardware/nodes/{node_id}/storage")  # the Storage & artifacts tab
    expect(page.locator("#node-acquire")).to_contain_text("Register a storage root first")
    page.steps.shot("node-page")

    register_root_via_page(page, node_agent.container_path)
    row = page.locator("#node-roots tbody tr")
    expect(row).to_contain_text(HOST_PATH)
    expect(row).to_contain_text(str(node_agent.container_path))
    # J1: the agent is told of the root at its next heartbeat and reports what it sees of it.
    expect(row.locator("[data-testid=root-observed]")).to_contain_text("writable", timeout=20_000)
    expect(row.locator("[data-testid=root-observed]")).to_contain_text("free of")
    page.steps.shot("root-registered-and-observed")

    job_id = acquire_via_page(page, "org/tiny")
    expect(page.locator("#job-live")).to_have_attribute("data-polling", "true")
    expect(page.locator("[data-testid=job-title]")).to_have_text("Download model org/tiny to agent under test")
    expect(page).to_have_title(re.compile(r"^Download model org/tiny to agent under test"))
    first, _ = wait_for_progress_above(page, 0)
    page.steps.shot("progress-first")
    second, text = wait_for_progress_above(page, first)
    page.steps.shot("progress-second")
    assert second > first
    assert re.search(r"MiB of 8\.0 MiB", text), text
    assert re.search(r"[KM]iB/s", text), text  # measured between two reports the page saw

    panel = page.locator("#job-live")
    expect(panel).to_have_attribute("data-state", "succeeded", timeout=60_000)
    expect(panel.locator("[role=progressbar]")).to_have_attribute("aria-valuenow", "100.0")
    assert panel.get_attribute("hx-trigger") is None and panel.get_attribute("data-polling") == "false"
    expect(panel.locator("[data-testid=job-result]")).to_contain_text(commit)
    expect(panel.locator("[data-testid=job-result]")).to_contain_text(f"{HOST_PATH}/models/org/tiny/{commit}")
    page.steps.shot("job-succeeded")
    polls_after_the_end: list[str] = []
    page.on("request", lambda request: f"/jobs/{job_id}" in request.url and polls_after_the_end.append(request.url))
    page.wait_for_timeout(4_500)
    assert polls_after_the_end == []  # rendered without its trigger: no more polling

    page.click("[data-testid=artifact-link]")
    expect(page).to_have_url(re.compile(rf"/hardware/nodes/{node_id}/storage#artifact-"))
    artifact = page.locator("#node-artifacts tbody tr")
    expect(artifact).to_have_count(1)
    for fact in (
        "org/tiny",
        commit[:7],
        "8.0 MiB",
        f"{HOST_PATH}/models/org/tiny/{commit}",
        str(node_agent.container_path),
    ):
        expect(artifact).to_contain_text(fact)
    page.steps.shot("artifact-on-node-page")
    downloaded = node_agent.container_path / "models" / "org" / "tiny" / commit / "model.gguf"
    assert downloaded.stat().st_size == size

    page.click("nav >> text=Jobs")
    jobs = page.locator(f"#jobs-table tr[data-job-id='{job_id}']")
    expect(jobs).to_contain_text("succeeded")
    expect(jobs).to_contain_text("100 %")
    expect(page.locator("#jobs-table")).to_have_attribute("data-polling", "false")
    page.steps.shot("jobs-page")

    # W2: "Run a model" offers the artifact's own GGUF files; picking another artifact fetches its files.
    hub.add_repo("org/small", {"small.gguf": Generated(4096, seed=5)})
    small = requests.post(
        f"{jobs_server.url}/api/v1/admin/jobs",
        json={
            "type": "artifact.acquire.v1",
            "node_id": node_id,
            "params": {"repo_id": "org/small", **root_of(jobs_server, node_id)},
        },
        headers=ADMIN,
        timeout=10,
    ).json()
    wait_for_state(jobs_server, small["id"], "succeeded")
    page.goto(f"{jobs_server.url}/hardware/nodes/{node_id}/work")
    files = page.locator("#benchmark-model_file")
    expect(files.locator("option")).to_have_count(1)
    expect(files).to_contain_text("small.gguf — header unreadable")  # the newest artifact: random bytes, no GGUF header
    tiny = page.locator("#benchmark-artifact_id option", has_text="org/tiny @").get_attribute("value")
    page.select_option("#benchmark-artifact_id", value=tiny)
    expect(files).to_contain_text("model.gguf — header unreadable")
    expect(files.locator("option")).to_have_count(1)
    page.steps.shot("run-a-model-files")
    assert_no_secrets(jobs_server.log() + node_agent.log(), node_agent.credential())


def root_of(server, node_id: str) -> dict:
    """The node's one storage root, as an acquire job's params name it."""
    listed = requests.get(f"{server.url}/api/v1/admin/nodes/{node_id}/storage-roots", headers=ADMIN, timeout=10)
    (root,) = listed.json()["storage_roots"]
    return {"storage_root_id": root["id"]}


def wait_for_state(server, job_id: str, state: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = requests.get(f"{server.url}/api/v1/admin/jobs/{job_id}", headers=ADMIN, timeout=10).json()
        if job["state"] == state:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never reached {state}: {job}")


def test_cancel_a_running_acquire_from_its_page(page, jobs_server, hub, node_agent):
    size = 16 * 2**20
    hub.add_repo("org/big", {"model.gguf": Generated(size, seed=3)})
    throttle(hub, "model.gguf", size, pause=0.5)  # about half a minute: time to cancel it
    node_id = node_agent.node_id()
    root = {"name": "models", "host_path": HOST_PATH, "container_path": str(node_agent.container_path)}
    created = requests.post(
        f"{jobs_server.url}/api/v1/admin/nodes/{node_id}/storage-roots",
        json={**root, "min_free_bytes": 0},
        headers=ADMIN,
        timeout=10,
    )
    assert created.status_code == 201, created.text
    sign_in(page, jobs_server.url, f"/hardware/nodes/{node_id}/storage")
    job_id = acquire_via_page(page, "org/big")
    wait_for_progress_above(page, 0)
    page.steps.shot("running")

    page.click("#job-live button:has-text('Cancel job')")  # the confirmation is accepted
    expect(page.locator("[data-testid=job-stopping]")).to_be_visible()
    expect(page.locator("#job-live button:has-text('Cancel job')")).to_have_count(0)
    page.steps.shot("stopping")
    panel = page.locator("#job-live")
    expect(panel).to_have_attribute("data-state", "cancelled", timeout=20_000)  # J2: within a progress interval
    assert panel.get_attribute("hx-trigger") is None
    # An operator's cancel is said in neutral words, not as an error; it can run again (a second choice).
    expect(panel.locator("[data-testid=job-cancelled]")).to_contain_text("Cancelled by the operator while it ran.")
    expect(panel.locator("[data-testid=job-error]")).to_have_count(0)
    expect(panel.locator("button.mf-secondary:has-text('Retry job')")).to_be_visible()
    page.steps.shot("cancelled")
    api_job = requests.get(f"{jobs_server.url}/api/v1/admin/jobs/{job_id}", headers=ADMIN, timeout=10).json()
    assert api_job["state"] == "cancelled" and api_job["progress"]["bytes_done"] < size
