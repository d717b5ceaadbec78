"""A hostile or slow Hub through the real gunicorn and the real agent process (J2, J3; issue 22
items 1 and 2).

The Hub is tests/support/hub.py on loopback, serving the hostile answers; a second stand-in on
another port is "another host" and records every header it is sent. A cancel goes through the
admin API and is measured until the job reads `cancelled`: the target is one progress interval
(the jobs_server's, from its settings) and a second.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support import ACQUIRE, assert_no_secrets, wait_until
from tests.support.acquire import (
    HF_TOKEN,
    acquire,
    api,
    online_agent_with_root,
    progress_interval,
    wait_job,
    wait_job_fast,
)
from tests.support.hub import StandinHub

HOSTILE = "org/hostile"
NEXT = "org/next"
FILES = {"config.json": b'{"architectures": ["LlamaForCausalLM"]}\n', "README.md": b"# hostile\n"}
DEADLINE_SECONDS = 5  # MODELFORGE_AGENT_HUB_DEADLINE_SECONDS for the part without a cancel
SLACK_SECONDS = 1.0  # this box is loaded; the polling itself is 50 ms


def tree_path(commit: str) -> str:
    return f"/api/models/{HOSTILE}/tree/{commit}"


def tree_requests(standin: StandinHub, commit: str) -> list:
    return [record for record in standin.requests if record.path == tree_path(commit)]


def test_a_tree_that_continues_on_another_host_fails_the_job_not_retried_and_the_token_stays_home(
    tmp_path, jobs_server, hub
):
    commit = hub.add_repo(HOSTILE, FILES, gated=True, token=HF_TOKEN)
    with StandinHub() as other:
        other.serve_any_tree([])  # the other host would make the tree empty
        hub.link_tree_to(other.url)
        agent, node_id, root_dir, root = online_agent_with_root(tmp_path, jobs_server, hub)
        job = acquire(jobs_server, node_id, root["id"], repo_id=HOSTILE)
        done = wait_job(jobs_server, job["id"], {"succeeded", "failed"}, timeout=60)
        assert done["state"] == "failed", done
        assert (done["error"]["code"], done["attempt"]) == ("HUB_TREE_INVALID", 1), done
        assert done["max_attempts"] > 1  # failed at its first attempt: never retried
        assert [record.headers.get("authorization") for record in other.requests] == []  # not even asked
    assert [record.headers.get("authorization") for record in tree_requests(hub, commit)] == [f"Bearer {HF_TOKEN}"]
    assert "another origin" in done["error"]["message"] and HF_TOKEN not in json.dumps(done)
    assert not (root_dir / "models").exists()
    agent.stop()
    assert_no_secrets(agent.log(), HF_TOKEN, agent.credential())


def make_hostile(hub: StandinHub, case: str, commit: str, *, slow: bool) -> None:
    """The case's hostile answer on the tree listing of HOSTILE (NEXT stays a good repository)."""
    if case == "retry-after-bomb":
        hub.fail_next(10**6, 429, path=tree_path(commit), headers={"Retry-After": "100000"})
    elif case == "drip":
        hub.drip(tree_path(commit), seconds=1.5, times=None)
    else:
        hub.endless_tree(per_page=1 if slow else 1000, repo_id=HOSTILE)
        if slow:  # pages a cancel can land between; the fast ones meet the caps
            hub.stall(tree_path(commit), after_bytes=0, seconds=0.05, times=None)


def hostile_under_way(hub: StandinHub, case: str, commit: str) -> bool:
    """The agent is inside the hostile answer: waiting after the bomb, reading the drip, paging."""
    asked = tree_requests(hub, commit)
    if case == "drip":
        return any(record.bytes_sent for record in asked)
    return len(asked) >= (3 if case == "endless-pages" else 1)


# What a hostile answer ends as with no cancel: a clear failure, within the deadline.
EXPECTED = {
    "retry-after-bomb": ({"HUB_UNAVAILABLE"}, "Retry-After"),
    "drip": ({"HUB_UNAVAILABLE"}, f"took longer than {DEADLINE_SECONDS}s"),
    "endless-pages": ({"HUB_TREE_INVALID", "HUB_UNAVAILABLE"}, ""),  # the entry cap, or the deadline if slower
}


@pytest.mark.parametrize("case", ["retry-after-bomb", "drip", "endless-pages"])
def test_a_hostile_hub_is_cut_off_by_a_cancel_within_one_progress_interval_and_else_by_the_deadline(
    tmp_path, jobs_server, hub, case
):
    commit = hub.add_repo(HOSTILE, FILES)
    hub.add_repo(NEXT, FILES)
    interval = progress_interval(jobs_server)
    agent, node_id, root_dir, root = online_agent_with_root(tmp_path, jobs_server, hub)

    # 1. A cancel through the admin API lands within one progress interval + 1 s, and the next
    #    job queued for the node is claimed and runs.
    make_hostile(hub, case, commit, slow=True)
    job = acquire(jobs_server, node_id, root["id"], repo_id=HOSTILE)
    wait_job(jobs_server, job["id"], {"running"}, timeout=15)
    wait_until(lambda: hostile_under_way(hub, case, commit), f"the agent inside the {case}", timeout=30)
    following = acquire(jobs_server, node_id, root["id"], repo_id=NEXT)
    asked = time.monotonic()
    response = api(jobs_server, "POST", f"/api/v1/admin/jobs/{job['id']}/cancel")
    assert response.status_code == 200, response.text
    cancelled, seen = wait_job_fast(jobs_server, job["id"], {"cancelled", "failed", "succeeded"}, timeout=30)
    took = seen - asked
    print(f"{case}: cancel -> cancelled in {took:.2f}s (progress interval {interval:g}s)")
    assert cancelled["state"] == "cancelled", cancelled
    assert took <= interval + 1 + SLACK_SECONDS, took
    done = wait_job(jobs_server, following["id"], {"succeeded", "failed"}, timeout=30)
    assert done["state"] == "succeeded", done

    # 2. Without a cancel, the attempt ends in a clear failure within the Hub deadline.
    agent.stop()
    hub.reset_faults()
    hub.clear_requests()
    make_hostile(hub, case, commit, slow=False)
    agent.env["MODELFORGE_AGENT_HUB_DEADLINE_SECONDS"] = str(DEADLINE_SECONDS)
    agent.start()
    body = {"type": ACQUIRE, "node_id": node_id, "params": {"repo_id": HOSTILE, "storage_root_id": root["id"]}}
    response = api(jobs_server, "POST", "/api/v1/admin/jobs", json={**body, "max_attempts": 1})
    assert response.status_code == 201, response.text
    alone = response.json()
    # The deadline is the tree listing's: it counts from the first page asked for (the agent's first
    # job after a start imports its acquire module first, seconds on this box).
    wait_until(lambda: tree_requests(hub, commit), "the listing asked for", timeout=30, interval=0.02)
    listing = time.monotonic()
    failed, ended = wait_job_fast(jobs_server, alone["id"], {"failed", "succeeded", "cancelled"}, timeout=60)
    print(f"{case}: listing -> {failed['state']} in {ended - listing:.2f}s (deadline {DEADLINE_SECONDS}s)")
    codes, words = EXPECTED[case]
    assert failed["state"] == "failed" and failed["error"]["code"] in codes, failed
    assert words in failed["error"]["message"], failed
    assert ended - listing <= DEADLINE_SECONDS + SLACK_SECONDS, ended - listing
    agent.stop()
    assert_no_secrets(agent.log(), HF_TOKEN, agent.credential())
