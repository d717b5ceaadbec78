"""artifact.acquire.v1 against a hostile or slow Hub (J2, J3; issue 22 items 1 and 2).

The agent's acquire code runs in a thread of this process against the stand-in Hub
(tests/support/hub.py) over loopback, as the agent's job thread runs it; the operator's cancel is
the JobControl the agent's progress reporter sets. Every wait here has a bound: a case the agent
does not cut off fails the test instead of hanging it.
"""

from __future__ import annotations

import logging
import time

import pytest

import modelforge_agent_acquire as acquire_job
import modelforge_node_agent as agent
from tests.support import wait_until
from tests.support.acquire import AttemptInThread
from tests.support.hub import Generated, StandinHub

MiB = 1 << 20
TOKEN = "hf_" + "H0stileHubT0ken" * 3
REPO = "org/model"
FILES = {"config.json": b'{"architectures": ["Llama"]}\n', "weights/model.gguf": Generated(2 * MiB, seed=4)}
CUT_OFF = 2.0  # generous on a loaded box: the agent looks every GUARD_POLL_SECONDS (0.1 s)


@pytest.fixture
def repo(hub) -> str:
    """The repository's commit on the stand-in Hub."""
    return hub.add_repo(REPO, FILES, gated=True, token=TOKEN)


def tree_path(commit: str) -> str:
    return f"/api/models/{REPO}/tree/{commit}"


def tree_requests(standin: StandinHub) -> list:
    return [record for record in standin.requests if "/tree/" in record.path]


def attempt(hub: StandinHub, tmp_path, **settings) -> AttemptInThread:
    """One acquire attempt of REPO with the token, started in a thread."""
    return AttemptInThread(hub.url, tmp_path, {"repo_id": REPO}, token=TOKEN, **settings).start()


# --------------------------------------------------------------------------- item 1: the token stays home


@pytest.mark.parametrize("where", ["another-host", "same-server-other-name", "https"])
def test_a_tree_page_that_continues_on_another_origin_is_refused_and_the_token_never_goes_there(
    hub, repo, tmp_path, where
):
    with StandinHub() as other:
        other.serve_any_tree([])  # what the other host would make the tree: nothing
        base = {
            "another-host": other.url,
            "same-server-other-name": hub.url.replace("127.0.0.1", "localhost"),
            "https": other.url.replace("http://", "https://"),
        }[where]
        hub.link_tree_to(base)
        run = attempt(hub, tmp_path)
        outcome = run.outcome(timeout=30)
        assert isinstance(outcome, agent.JobFailure), outcome
        assert (outcome.code, outcome.retryable) == (acquire_job.HUB_TREE_INVALID, False)
        assert "another origin" in outcome.message and TOKEN not in outcome.message
        assert other.requests == []  # refused before sending: no request, so no Authorization
    # Only the first page was asked for, at the Hub; nothing of the repository was written.
    pages = tree_requests(hub)
    assert len(pages) == 1 and pages[0].headers.get("authorization") == f"Bearer {TOKEN}"
    assert [record for record in hub.requests if "/resolve/" in record.path] == []
    assert not (run.root / "models").exists() and not run.partial().exists()


def test_pages_on_the_hubs_own_origin_are_followed_with_the_token(tmp_path):
    with StandinHub(tree_page_size=2) as paged:
        files = {f"f{index}.txt": b"%d\n" % index for index in range(7)}
        paged.add_repo(REPO, files, gated=True, token=TOKEN)
        outcome = AttemptInThread(paged.url, tmp_path, {"repo_id": REPO}, token=TOKEN).start().outcome(timeout=30)
        assert outcome["files"] == 7, outcome
        pages = tree_requests(paged)
        assert len(pages) == 4 and all(page.headers.get("authorization") == f"Bearer {TOKEN}" for page in pages)


# --------------------------------------------------------------------------- item 2: Retry-After bombs


@pytest.mark.parametrize("status", [429, 503])
def test_a_retry_after_bomb_is_capped_and_cancel_cuts_the_wait(hub, repo, tmp_path, status, caplog):
    hub.fail_next(10**6, status, path=tree_path(repo), headers={"Retry-After": "100000"})
    caplog.set_level(logging.WARNING)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent.log, "propagate", True)
        run = attempt(hub, tmp_path)  # the default deadline, longer than the cap
        wait_until(lambda: "asked to wait 100000s" in caplog.text, "the agent's wait after the bomb", timeout=30)
        assert f"waiting {acquire_job.HUB_RETRY_AFTER_MAX_SECONDS:g}s" in caplog.text  # the cap, not 100000 s
        took = run.cancel()
    assert took < CUT_OFF, took
    assert (run.result.code, run.result.retryable) == (agent.JOB_CANCELLED, False)
    assert len(tree_requests(hub)) == 1


def test_a_retry_after_bomb_fails_the_attempt_within_the_deadline_without_a_cancel(hub, repo, tmp_path):
    hub.fail_next(10**6, 429, path=tree_path(repo), headers={"Retry-After": "100000"})
    run = attempt(hub, tmp_path, deadline=3)
    outcome = run.outcome(timeout=3 + CUT_OFF)
    assert isinstance(outcome, agent.JobFailure), outcome
    assert (outcome.code, outcome.retryable) == (acquire_job.HUB_UNAVAILABLE, True)
    assert "HTTP 429" in outcome.message and "100000" in outcome.message


def test_retries_that_would_outlast_the_deadline_stop_at_it(hub, repo, tmp_path):
    # A Retry-After the agent honours (1 s), again and again: the deadline ends it, not the bomb.
    hub.fail_next(10**6, 503, path=tree_path(repo), headers={"Retry-After": "1"})
    run = attempt(hub, tmp_path, deadline=2.5)
    outcome = run.outcome(timeout=2.5 + CUT_OFF)
    assert isinstance(outcome, agent.JobFailure), outcome
    assert (outcome.code, outcome.retryable) == (acquire_job.HUB_UNAVAILABLE, True)
    assert 2 <= len(tree_requests(hub)) <= 1 + acquire_job.HUB_API_RETRIES


# --------------------------------------------------------------------------- item 2: drip


@pytest.mark.parametrize("api", ["tree", "revision"])
def test_a_dripped_answer_ends_at_the_deadline_though_no_single_read_stalls(hub, repo, tmp_path, api):
    path = tree_path(repo) if api == "tree" else f"/api/models/{REPO}/revision/main"
    hub.drip(path, seconds=0.5, times=None)  # a byte every 0.5 s: under the 2 s stall limit, forever
    started = time.monotonic()
    outcome = attempt(hub, tmp_path, stall=2, deadline=3).outcome(timeout=3 + CUT_OFF)
    took = time.monotonic() - started
    assert isinstance(outcome, agent.JobFailure), outcome
    assert (outcome.code, outcome.retryable) == (acquire_job.HUB_UNAVAILABLE, True)
    assert "took longer than 3s" in outcome.message
    assert took < 3 + CUT_OFF, took


def test_cancel_cuts_a_dripped_tree_listing_at_once(hub, repo, tmp_path):
    hub.drip(tree_path(repo), seconds=1.5, times=None)
    run = attempt(hub, tmp_path)
    wait_until(lambda: any(record.bytes_sent for record in tree_requests(hub)), "the first dripped byte", timeout=30)
    took = run.cancel()
    assert took < CUT_OFF, took
    assert (run.result.code, run.result.retryable) == (agent.JOB_CANCELLED, False)


def test_cancel_cuts_a_file_read_that_waits_for_its_next_byte(hub, repo, tmp_path):
    # Not only the API: a file whose next byte is 60 s away (the stall limit is 30 s) stops at once too.
    hub.stall("weights/model.gguf", after_bytes=MiB, seconds=60)
    run = attempt(hub, tmp_path, stall=30)
    wait_until(lambda: hub.bytes_served("weights/model.gguf") >= MiB, "the first MiB of the file", timeout=30)
    took = run.cancel()
    assert took < CUT_OFF, took
    assert (run.result.code, run.result.retryable) == (agent.JOB_CANCELLED, False)
    assert not run.partial().exists()


# --------------------------------------------------------------------------- item 2: endless pages


def test_endless_pages_stop_at_the_page_cap(hub, repo, tmp_path):
    hub.endless_tree(per_page=1)
    outcome = attempt(hub, tmp_path).outcome(timeout=120)
    assert isinstance(outcome, agent.JobFailure), outcome
    assert (outcome.code, outcome.retryable) == (acquire_job.HUB_TREE_INVALID, False)
    assert f"more than {acquire_job.MAX_TREE_PAGES} pages" in outcome.message
    assert len(tree_requests(hub)) == acquire_job.MAX_TREE_PAGES


def test_endless_pages_of_many_entries_stop_at_the_entry_cap(hub, repo, tmp_path):
    hub.endless_tree(per_page=1000)
    outcome = attempt(hub, tmp_path).outcome(timeout=120)
    assert isinstance(outcome, agent.JobFailure), outcome
    assert (outcome.code, outcome.retryable) == (acquire_job.HUB_TREE_INVALID, False)
    assert f"more than {acquire_job.MAX_TREE_ENTRIES} entries" in outcome.message
    assert len(tree_requests(hub)) == acquire_job.MAX_TREE_ENTRIES // 1000 + 1


def test_cancel_stops_endless_pages_between_two_pages(hub, repo, tmp_path):
    hub.endless_tree(per_page=1)
    hub.stall(tree_path(repo), after_bytes=0, seconds=0.05, times=None)  # slow enough to be cancelled
    run = attempt(hub, tmp_path)
    wait_until(lambda: len(tree_requests(hub)) >= 10, "ten pages", timeout=30)
    took = run.cancel()
    assert took < CUT_OFF, took
    assert (run.result.code, run.result.retryable) == (agent.JOB_CANCELLED, False)
    asked = len(tree_requests(hub))
    time.sleep(0.5)  # no page is asked for after the attempt ended
    assert len(tree_requests(hub)) == asked < acquire_job.MAX_TREE_PAGES


# --------------------------------------------------------------------------- the setting


def test_the_hub_deadline_is_a_setting_with_a_sane_range(tmp_path):
    env = {"MODELFORGE_AGENT_CONTROL_PLANE_URL": "http://127.0.0.1:9"}
    assert agent.load_config(env).hub.deadline_seconds == agent.HUB_DEADLINE_SECONDS
    assert agent.load_config({**env, "MODELFORGE_AGENT_HUB_DEADLINE_SECONDS": "4.5"}).hub.deadline_seconds == 4.5
    for bad in ("0", "-1", "soon", "100000"):
        with pytest.raises(agent.ConfigError, match="MODELFORGE_AGENT_HUB_DEADLINE_SECONDS"):
            agent.load_config({**env, "MODELFORGE_AGENT_HUB_DEADLINE_SECONDS": bad})
