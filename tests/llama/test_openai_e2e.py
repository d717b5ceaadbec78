"""The OpenAI-compatible API end to end: the official `openai` client at the control plane, the
request relayed over the agent's own outbound WebSocket to the runtime worker (S4, S5, P1).

gunicorn, the agent process and the runtime worker process on the tiny random llama acquired
through the stand-in Hub. The tiny model never emits end of text, so every answer runs to its
`max_tokens`.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import openai
import pytest
import requests

from tests.support import ADMIN, wait_until
from tests.support.acquire import api, start_agent
from tests.support.serving import NAME, SERVE, deploy_ready, mint_key, runtime_node, wait_capabilities
from tests.support.worker import call


@pytest.fixture
def serving(tmp_path, socket_dir, jobs_server, hub, model_repo):
    """A runtime node with one ready deployment, and a client key."""
    agent, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, jobs_server, hub, model_repo)
    wait_capabilities(jobs_server, node_id, {SERVE})
    deployment = deploy_ready(jobs_server, artifact_id)
    key = mint_key(jobs_server)
    client = openai.OpenAI(base_url=jobs_server.url + "/v1", api_key=key, max_retries=0, timeout=60)
    wait_until(lambda: "relay: connected" in agent.log(), "the agent's relay connection", 20)
    with client:
        yield {
            "agent": agent,
            "worker": worker,
            "node_id": node_id,
            "client": client,
            "key": key,
            "deployment": deployment,
        }


MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello\nin two lines."}]


def hang_up_and_see_the_node_stop(client, worker, deployment_id: str, where: str) -> None:
    """A greedy stream (it never draws the end-of-text token, so it would run to ~8,000 tokens)
    left after four chunks: the worker has nothing in flight within a second (S5)."""
    stream = client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=0, stream=True)
    chunks = iter(stream)
    for _ in range(4):
        next(chunks)
    stream.close()
    see_the_node_stop(worker, deployment_id, f"a stream, {where}")


def give_up_on_a_whole_answer_and_see_the_node_stop(base_url: str, key: str, worker, deployment_id: str, where: str):
    """The same greedy answer asked whole, its client gone after 0.5 s."""
    body = {"model": NAME, "messages": MESSAGES, "temperature": 0}
    with pytest.raises(requests.Timeout):
        requests.post(
            base_url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=(5, 0.5)
        )
    see_the_node_stop(worker, deployment_id, f"a whole answer, {where}")


def see_the_node_stop(worker, deployment_id: str, what: str) -> None:
    """The client just hung up: within a second the worker has nothing in flight, and the
    generation did not run to its limit."""
    hung_up = time.monotonic()

    def idle():
        answer = call(worker.socket_path, "GET", f"/v1/deployments/{deployment_id}")[1]
        return answer if answer["in_flight"] == 0 else None

    after = wait_until(idle, f"the generation to end ({what})", 5)
    assert time.monotonic() - hung_up < 1.5  # within a second, plus this poll's own step
    assert after["measured"]["generated_tokens"] < 8000


def test_the_official_client_chats_and_completes_streaming_or_not_with_usage_counted(serving, jobs_server):
    client = serving["client"]
    assert NAME in [model.id for model in client.models.list()]

    whole = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=12, temperature=0.9, seed=7)
    assert whole.object == "chat.completion" and whole.model == NAME
    text = whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant" and text
    assert whole.choices[0].finish_reason == "length"  # the tiny model never ends by itself
    usage = whole.usage
    assert usage.completion_tokens == 12 and usage.prompt_tokens > 5
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    # The same seed gives the same text; streamed, its pieces join to the whole, and usage comes last.
    chunks = list(
        client.chat.completions.create(
            model=NAME, messages=MESSAGES, max_tokens=12, temperature=0.9, seed=7, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    pieces = [chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices]
    assert "".join(pieces) == text
    assert sum(1 for piece in pieces if piece) >= 2  # token by token, not one buffered block
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == usage.model_dump()

    other = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=12, temperature=0.9, seed=8)
    assert other.choices[0].message.content != text  # the seed is honoured, not ignored

    completion = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert completion.object == "text_completion" and completion.choices[0].text
    assert completion.usage.completion_tokens == 8
    streamed = client.completions.create(
        model=NAME, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed) == completion.choices[0].text

    # S7: five requests answered, their tokens counted, none in flight.
    series = metric_values(jobs_server)
    assert series[f'modelforge_inference_requests_total{{deployment="{NAME}",status="ok"}}'] == 5
    assert series[f'modelforge_inference_generated_tokens_total{{deployment="{NAME}"}}'] == 12 * 3 + 8 * 2
    assert series[f'modelforge_inference_time_to_first_token_seconds_count{{deployment="{NAME}"}}'] == 5
    assert series[f'modelforge_inference_tokens_per_second_count{{deployment="{NAME}"}}'] == 5
    assert series[f'modelforge_inference_in_flight{{deployment="{NAME}"}}'] == 0
    # S2: the deployment's own figures, for its page and the admin API.
    shown = api(jobs_server, "GET", f"/api/v1/admin/deployments/{serving['deployment']['id']}").json()
    assert shown["measured"]["requests"] == 5 and shown["measured"]["generated_tokens"] == 52
    assert shown["measured"]["time_to_first_token_seconds"] > 0 and shown["measured"]["tokens_per_second"] > 0
    assert shown["measured"]["load_seconds"] > 0 and shown["last_request_at"]  # the node's figures stay


def metric_values(server) -> dict[str, float]:
    """GET /metrics as {series with labels: value}."""
    text = requests.get(server.url + "/metrics", headers=ADMIN, timeout=10).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_refusals_come_in_openai_shape_and_the_client_raises_the_matching_error(serving, jobs_server):
    client = serving["client"]
    for key in ("mfk_" + "0" * 43, ADMIN["X-ModelForge-Admin-Token"]):  # S1: the operator key is not a client key
        with (
            openai.OpenAI(base_url=jobs_server.url + "/v1", api_key=key, max_retries=0) as stranger,
            pytest.raises(openai.AuthenticationError) as refused,
        ):
            stranger.models.list()
        assert refused.value.body["code"] == "API_KEY_INVALID"

    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert missing.value.body["code"] == "model_not_found" and missing.value.body["param"] == "model"

    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=5)
    assert "temperature" in bad.value.body["message"] and bad.value.body["next_step"]
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=NAME, messages=MESSAGES, n=2)
    assert bad.value.body["param"] == "n"

    answer = requests.post(
        jobs_server.url + "/v1/chat/completions",
        data=b"{not json",
        headers={"Authorization": f"Bearer {serving['key']}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert answer.status_code == 400 and set(answer.json()["error"]) >= {"message", "type", "code", "param"}
    assert serving["key"] not in jobs_server.log()  # P2: the key is never logged


def listening_sockets() -> set[str]:
    """Socket inodes in TCP LISTEN state, and every bound UDP socket, in this network namespace."""
    found = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        path = Path("/proc/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if table.startswith("udp") or fields[3] == "0A":
                found.add(fields[9])
    return found


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (any of its threads may have started one)."""
    below = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = task / "children"
        below += [int(each) for each in children.read_text().split()] if children.exists() else []
    return [pid, *(grandchild for child in below for grandchild in process_tree(child))]


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def test_the_node_side_listens_on_no_port_while_it_serves(serving):
    client = serving["client"]
    stream = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=40, stream=True)
    next(iter(stream))  # mid-generation: the engine process is working
    pids = process_tree(serving["agent"].process.pid) + process_tree(serving["worker"].process.pid)
    assert len(pids) >= 3  # agent, worker, and the deployment's engine process
    listening = listening_sockets()
    held = {pid: socket_inodes(pid) & listening for pid in pids}
    assert not any(held.values()), held  # S5: neither agent nor worker listens on TCP or UDP
    stream.close()


def test_a_client_that_hangs_up_stops_the_generation_on_the_node_within_a_second(serving, jobs_server):
    client = serving["client"]
    hang_up_and_see_the_node_stop(client, serving["worker"], serving["deployment"]["id"], "direct")
    assert "hung up; cancelling it" in serving["worker"].log()
    assert "cancelling it on the node" in jobs_server.log()
    series = metric_values(jobs_server)
    assert series[f'modelforge_inference_requests_total{{deployment="{NAME}",status="cancelled"}}'] == 1
    # The next request is served at once: nothing is left generating.
    started = time.monotonic()
    client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=4)
    assert time.monotonic() - started < 5


def test_a_client_that_gives_up_on_a_whole_answer_stops_the_generation_too(serving, jobs_server):
    """S5: not streamed, the control plane waits for the whole answer; a client that hangs up
    meanwhile is noticed there and the node stops, as for a stream."""
    give_up_on_a_whole_answer_and_see_the_node_stop(
        jobs_server.url, serving["key"], serving["worker"], serving["deployment"]["id"], "direct"
    )
    assert "cancelling it on the node" in jobs_server.log()


def test_an_agent_that_drops_fails_its_requests_with_503_and_serves_again_once_it_is_back(
    serving, jobs_server, tmp_path, hub
):
    client, agent = serving["client"], serving["agent"]
    stream = client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=0, stream=True)
    chunks = iter(stream)
    next(chunks)
    agent.process.kill()
    agent.process.wait()
    with stream, pytest.raises(openai.APIError) as lost:  # the stream in flight ends with an error event
        for _ in chunks:
            pass
    assert "NODE_UNAVAILABLE" in str(lost.value.body) or "not connected" in str(lost.value)
    with pytest.raises(openai.InternalServerError) as unavailable:
        client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=4)
    assert unavailable.value.status_code == 503 and unavailable.value.body["code"] == "NODE_UNAVAILABLE"
    assert unavailable.value.body["next_step"]

    connected = agent.log().count("relay: connected")  # the restarted agent writes to the same log
    restarted = start_agent(
        tmp_path, jobs_server, hub, MODELFORGE_AGENT_WORKER_SOCKET=str(serving["worker"].socket_path)
    )
    came_back = time.monotonic()
    wait_until(
        lambda: restarted.log().count("relay: connected") > connected, "the restarted agent's relay connection", 30
    )
    answer = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=4)
    assert answer.usage.completion_tokens == 4
    assert time.monotonic() - came_back < 30


def test_a_restarted_control_plane_has_the_agent_back_on_its_relay_within_a_heartbeat_interval(serving, jobs_server):
    """S5: the agent dials again at most a heartbeat interval (here 1 s) apart while the control
    plane is away, so the first request after a restart is served."""
    client, agent = serving["client"], serving["agent"]
    connected = agent.log().count("relay: connected")
    jobs_server.stop()
    time.sleep(2)  # a few failed dials while it is down
    jobs_server.start()
    healthy = time.monotonic()
    wait_until(lambda: agent.log().count("relay: connected") > connected, "the relay connection again", 10)
    assert time.monotonic() - healthy < 1 + 2  # one interval, plus a dial on a loaded box
    answer = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=4)
    assert answer.usage.completion_tokens == 4


def test_on_postgresql_a_request_at_one_replica_is_served_by_the_node_connected_to_the_other(
    postgres_database, tmp_path, socket_dir, hub, model_repo
):
    """S5: two control planes on one PostgreSQL, four gthread workers each. The agent's relay
    connection lands in one process of the first; every request goes to the second, so each one
    crosses replicas over LISTEN/NOTIFY — and so does a hang-up."""
    from tests.support import JOB_LEASE_SECONDS, truncate_all
    from tests.support.gunicorn import GunicornServer

    truncate_all(postgres_database)
    fast = {
        "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": "1",
        "MODELFORGE_SWEEP_INTERVAL_SECONDS": "1",
        "MODELFORGE_JOB_LEASE_SECONDS": str(JOB_LEASE_SECONDS),
    }
    servers = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        servers.append(GunicornServer(postgres_database, tmp_path / name, workers=4, **fast))
        servers[-1].start()
    first, second = servers
    try:
        _, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, first, hub, model_repo)
        wait_capabilities(first, node_id, {SERVE})
        deployment = deploy_ready(first, artifact_id)
        wait_until(lambda: "relay: node" in first.log(), "the relay connection at the first replica", 20)
        with openai.OpenAI(base_url=second.url + "/v1", api_key=mint_key(first), max_retries=0, timeout=60) as client:
            texts = set()
            for _ in range(6):  # each lands on any of the second replica's four workers
                answer = client.chat.completions.create(
                    model=NAME, messages=MESSAGES, max_tokens=6, temperature=0.9, seed=3
                )
                assert answer.usage.completion_tokens == 6
                texts.add(answer.choices[0].message.content)
            assert len(texts) == 1  # the same seed, the same text, whichever way it went
            chunks = list(client.chat.completions.create(
                model=NAME, messages=MESSAGES, max_tokens=6, temperature=0.9, seed=3, stream=True
            ))  # fmt: skip
            assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) in texts

            hang_up_and_see_the_node_stop(client, worker, deployment["id"], "across replicas")
        assert "relay: node" not in second.log()  # the node never connected to the second replica
    finally:
        for server in servers:
            server.stop()


def test_behind_the_bundled_nginx_the_relay_connects_and_tokens_stream_unbuffered(
    tmp_path, socket_dir, jobs_server, hub, model_repo
):
    """S5: deploy/nginx/nginx.conf in front of gunicorn, for the agent's WebSocket and for clients."""
    from tests.support.nginx import NGINX, DeployNginx

    if NGINX is None:
        pytest.skip("nginx is not installed")
    (tmp_path / "nginx").mkdir()
    proxy = DeployNginx(tmp_path / "nginx", jobs_server.port)
    try:

        class ThroughProxy:  # the control plane as the node and the client see it: nginx's address
            url = proxy.url

            def __getattr__(self, name):
                return getattr(jobs_server, name)

        _, worker, node_id, artifact_id = runtime_node(tmp_path, socket_dir, ThroughProxy(), hub, model_repo)
        wait_capabilities(jobs_server, node_id, {SERVE})
        deployment = deploy_ready(jobs_server, artifact_id)
        wait_until(lambda: "relay: node" in jobs_server.log(), "the relay connection through nginx", 20)
        with openai.OpenAI(base_url=proxy.url + "/v1", api_key=mint_key(jobs_server), max_retries=0) as client:
            whole = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=8, temperature=0)
            chunks = list(client.chat.completions.create(
                model=NAME, messages=MESSAGES, max_tokens=8, temperature=0, stream=True
            ))  # fmt: skip
            pieces = [chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices]
            assert "".join(pieces) == whole.choices[0].message.content and sum(map(bool, pieces)) >= 2

            # Unbuffered both ways: a client that leaves is seen through nginx at once.
            hang_up_and_see_the_node_stop(client, worker, deployment["id"], "through nginx")
            give_up_on_a_whole_answer_and_see_the_node_stop(
                proxy.url, client.api_key, worker, deployment["id"], "nginx"
            )
    finally:
        proxy.stop()


def test_streams_are_bounded_per_model_and_never_lock_the_console_or_the_agent_api_out(serving, jobs_server):
    """S5: eight streams in flight (relay.STREAMS_PER_DEPLOYMENT) hold threads, not the server: the
    console, /healthz and the agent's heartbeats still answer; a ninth stream is a clear 429."""
    client, deployment_id = serving["client"], serving["deployment"]["id"]
    leave = threading.Event()

    def hold() -> None:
        with client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=0, stream=True) as stream:
            for _ in stream:
                if leave.is_set():
                    return

    holders = [threading.Thread(target=hold, daemon=True) for _ in range(8)]
    for holder in holders:
        holder.start()
    try:
        wait_until(
            lambda: call(serving["worker"].socket_path, "GET", f"/v1/deployments/{deployment_id}")[1]["in_flight"] == 8,
            "eight requests in the worker's hands",
            20,
        )
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=4)
        assert limited.value.body["code"] == "TOO_MANY_STREAMS" and limited.value.body["next_step"]
        series = metric_values(jobs_server)
        assert series[f'modelforge_inference_requests_total{{deployment="{NAME}",status="TOO_MANY_STREAMS"}}'] == 1
        assert series[f'modelforge_inference_in_flight{{deployment="{NAME}"}}'] == 8
        for _ in range(10):
            assert requests.get(jobs_server.url + "/healthz", timeout=5).status_code == 200
            assert requests.get(jobs_server.url + "/login", timeout=5).status_code == 200
        node = api(jobs_server, "GET", f"/api/v1/hardware/nodes/{serving['node_id']}").json()
        assert node["status"] == "online" and node["heartbeat_age_seconds"] < 5, node  # heartbeats go on
    finally:
        leave.set()
        for holder in holders:
            holder.join(timeout=30)
