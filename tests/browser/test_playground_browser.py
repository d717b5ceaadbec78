"""The deployment page's playground in Chromium (S6): a chat answer streams into the page token by
token from a real node — gunicorn, the agent's relay, the runtime worker on the tiny llama — with
the strict CSP in place (any violation fails the test, tests/browser/conftest.py); Stop cancels
the generation on the node.
"""

from __future__ import annotations

import time

from tests.support.browser import expect, sign_in
from tests.support.serving import SERVE, deploy_ready, runtime_node, wait_capabilities
from tests.support.worker import call


def test_the_playground_streams_an_answer_token_by_token_and_stop_cancels_it(
    tmp_path, socket_dir, jobs_server, hub, model_repo, page
):
    agent, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, jobs_server, hub, model_repo)
    wait_capabilities(jobs_server, node_id, {SERVE})
    deployment = deploy_ready(jobs_server, artifact_id)
    sign_in(page, jobs_server.url, f"/deployments/{deployment['id']}")
    expect(page.locator("[data-testid=deployment-state]")).to_have_text("ready")

    # Pieces arrive one by one: the answer grows in several steps (separate reads of the stream,
    # each a callback of this observer), while the status counts them.
    page.evaluate(
        """() => {
            window.growth = [];
            const answer = document.querySelector("[data-testid=playground-answer]");
            new MutationObserver(() => window.growth.push(answer.textContent.length))
                .observe(answer, {childList: true, characterData: true, subtree: true});
        }"""
    )
    page.fill("#playground-temperature", "0")  # greedy: the tiny model then never ends early
    page.fill("#playground-message", "Tell me a story\nin two lines.")
    page.click("[data-playground-send]")
    status = page.locator("[data-testid=playground-status]")
    expect(status).to_contain_text("Done: ", timeout=30_000)
    pieces = int(status.inner_text().split()[1])
    assert pieces >= 200  # 256 tokens, a few held back while they are parts of one character
    growth = page.evaluate("window.growth")
    assert len(growth) > 2 and growth == sorted(growth), growth  # not one block at the end
    assert growth[-1] == len(page.locator("[data-testid=playground-answer]").text_content())
    page.steps.shot("answered")

    # Stop: the request is aborted and the node's generation ends.
    page.fill("#playground-message", "And another, a long one.")
    page.click("[data-playground-send]")
    expect(status).to_contain_text("Generating", timeout=15_000)
    page.click("[data-playground-stop]")
    expect(status).to_have_text("Stopped.")

    def idle():
        answered = call(worker.socket_path, "GET", f"/v1/deployments/{deployment['id']}")[1]
        return answered["in_flight"] == 0

    started = time.monotonic()
    while not idle():
        assert time.monotonic() - started < 5, "the node kept generating after Stop"
        time.sleep(0.1)
    page.steps.shot("stopped")
    page.close()
