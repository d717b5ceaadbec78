"""Alerts (O2) in process, on SQLite and PostgreSQL, sent through apprise to a real HTTP receiver.

One notification per audited transition and target however many sweeps race, retried with
backoff while the receiver is down, never a secret in a payload, an error or the settings page,
and a configuration that refuses what apprise cannot read without quoting it.
"""

from __future__ import annotations

import base64
import logging
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from app import audit, create_app
from app.alerts import deliveries, messages, sender
from app.alerts import sweep as alerts
from app.alerts import targets as alert_targets
from app.alerts.targets import split_urls, targets_for
from app.config import ConfigError, current_settings, load_settings
from app.extensions import db
from app.models import AlertCursor, AlertDelivery, AlertDeliveryState, AlertTarget, AuditEvent
from app.nodes import liveness
from app.timeutil import utcnow
from tests.support import ACQUIRE, ADMIN, OPERATOR_KEY, app_env, factories
from tests.support.alerts import HOOK_SECRET
from tests.support.console import HTMX, csrf_from, sign_in, signed_in
from tests.support.jobs import add_job, add_root, claim
from tests.support.nodes import agent


@pytest.fixture
def alert_app(database_url, tmp_path, receiver):
    """The control plane with one alert target: the receiver."""
    application = create_app(app_env(database_url, tmp_path, MODELFORGE_ALERT_URLS=receiver.url()))
    yield application
    with application.app_context():
        db.session.remove()
        db.engine.dispose()


def targets(app):
    """The app's configured targets (called inside its app context, as the sweep is)."""
    return alert_targets.configured(current_settings(app))


def sweep(app) -> dict[str, int]:
    with app.app_context():
        return alerts.sweep(current_settings(app))


def delivery_rows(app) -> list[AlertDelivery]:
    with app.app_context():
        rows = list(db.session.scalars(sa.select(AlertDelivery).order_by(AlertDelivery.id)))
        db.session.expunge_all()
        return rows


def record(app, action: str, node_id: str | None = None, **details) -> int:
    with app.app_context():
        event = audit.record(audit.SYSTEM, action, node_id, **details)
        db.session.commit()
        return event.id


# --------------------------------------------------------------------------- configuration

BASE = {"MODELFORGE_OPERATOR_API_KEY": OPERATOR_KEY, "MODELFORGE_SECRET_KEY": "s"}


def test_alert_urls_are_read_from_the_variable_or_a_file_with_comments(tmp_path):
    inline = load_settings(
        {**BASE, "MODELFORGE_ALERT_URLS": "json://a:pw@127.0.0.1:9/x, ntfy://ntfy.sh/topic"}, tmp_path
    )
    assert inline.alert_urls == ("json://a:pw@127.0.0.1:9/x", "ntfy://ntfy.sh/topic")
    listed = tmp_path / "alert-urls"
    listed.write_text("# phone\nntfy://ntfy.sh/topic\n\n  # team\ndiscord://1234/abcdef\n")
    from_file = load_settings({**BASE, "MODELFORGE_ALERT_URLS_FILE": str(listed)}, tmp_path)
    assert from_file.alert_urls == ("ntfy://ntfy.sh/topic", "discord://1234/abcdef")
    assert load_settings(BASE, tmp_path).alert_urls == ()
    assert "pw@" not in repr(inline)  # P2: no log of the settings carries a target's secret


def test_a_comma_inside_a_url_query_does_not_split_it():
    assert split_urls("mailto://u:p@example.com?to=a@x.org,b@y.org,gotify://g.lan/tok") == [
        "mailto://u:p@example.com?to=a@x.org,b@y.org",
        "gotify://g.lan/tok",
    ]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        (
            {"MODELFORGE_ALERT_URLS": "ntfy://ntfy.sh/t", "MODELFORGE_ALERT_URLS_FILE": "/etc/x"},
            "set MODELFORGE_ALERT_URLS or MODELFORGE_ALERT_URLS_FILE, not both",
        ),
        ({"MODELFORGE_ALERT_URLS_FILE": "/nonexistent/alert-urls"}, "MODELFORGE_ALERT_URLS_FILE: cannot read"),
        (
            {"MODELFORGE_ALERT_URLS": "ntfy://ntfy.sh/t nosuchservice://user:s3cret-in-url@host/path"},
            "MODELFORGE_ALERT_URLS: entry 2 of 2 (nosuchservice://…) is not a URL apprise can send to",
        ),
        ({"MODELFORGE_ALERT_URLS": "s3cret-without-scheme"}, "entry 1 of 1 ((not a URL))"),
    ],
)
def test_alert_url_refusals_name_the_variable_and_never_quote_the_url(tmp_path, env, named):
    with pytest.raises(ConfigError) as refused:
        load_settings({**BASE, **env}, tmp_path)
    assert named in str(refused.value)
    assert "s3cret" not in str(refused.value)


def test_a_url_file_apprise_cannot_read_is_refused_by_position(tmp_path):
    listed = tmp_path / "alert-urls"
    listed.write_text("json://127.0.0.1:9/ok\njson://\n")
    with pytest.raises(ConfigError, match=r"MODELFORGE_ALERT_URLS_FILE \(.*\): entry 2 of 2 \(json://…\)"):
        load_settings({**BASE, "MODELFORGE_ALERT_URLS_FILE": str(listed)}, tmp_path)


def test_the_alert_sweep_is_always_scheduled_and_without_a_target_writes_nothing(database_url, tmp_path):
    from app import scheduler

    # The console adds targets while the control plane runs, so the sweep runs without any too.
    configured = load_settings({**BASE, "MODELFORGE_ALERT_URLS": "ntfy://ntfy.sh/topic"}, tmp_path)
    assert scheduler.sweeps(configured)["alerts"][0] == configured.sweep_interval_seconds
    bare = create_app(app_env(database_url, tmp_path))
    assert "alerts" in scheduler.sweeps(current_settings(bare))
    record(bare, "node.offline", "n-1", previous="online")
    assert sweep(bare) == {"queued": 0, "sent": 0, "retrying": 0, "failed": 0}
    with bare.app_context():
        assert db.session.scalar(sa.select(sa.func.count()).select_from(AlertCursor)) == 0  # not even the cursor
        db.session.remove()
        db.engine.dispose()


def test_targets_are_labelled_masked_and_keyed_without_the_url():
    (target,) = targets_for(("json://alerts:pw-Secret9@127.0.0.1:8080/hooks/topic-secret",), b"salt")
    assert target.label == "json://alerts:****@127.0.0.1:8080/.../t...t"  # short segments: nothing shown
    assert "pw-Secret9" not in target.key and len(target.key) == 64
    assert "pw-Secret9" not in repr(target)
    (ntfy,) = targets_for(("ntfy://ntfy.sh/my-private-topic",), b"salt")
    assert ntfy.label == "ntfy://ntfy.sh/m...c"  # the topic is ntfy's secret; apprise shows it


# --------------------------------------------------------------------------- what alerts say


def test_each_alert_is_a_sentence_naming_the_node_and_what_happened():
    event = AuditEvent(at=utcnow(), actor="system", action="job.failed", node_id="n-1", details={})
    event.details = {"job_id": "j-1", "attempt": 2, "code": "JOB_LEASE_LOST"}
    failed = messages.compose(event, "gpu-01", "model.acquire.v1")
    assert failed.title == "Job failed on gpu-01: JOB_LEASE_LOST"
    assert "Job j-1 (model.acquire.v1) on gpu-01 (node n-1) failed on attempt 2 with JOB_LEASE_LOST" in failed.body
    event.action, event.details = "node.offline", {"previous": "stale"}
    assert messages.compose(event, None).title == "Node offline: node n-1"
    event.action, event.details = "node.enrolled", {"hostname": "mfn_" + "x" * 40, "credential_prefix": "mfn_abcdef"}
    enrolled = messages.compose(event, "gpu-01")
    assert "mfn_" not in enrolled.title + enrolled.body  # the prefix is never read; a token-shaped value is redacted
    assert "[redacted]" in enrolled.body


# Issue 22 item 7: what an agent may put in its hostname, and provider tokens pasted anywhere.
HOSTILE_HOSTNAME = "@everyone [click here](http://evil.example/login) <!channel> <b>bold</b> *x*"
PROVIDER_TOKENS = {
    "hub": "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123",
    "openai": "sk-proj-" + "a1B2c3D4e5F6g7H8i9J0kLmN",
    "github": "ghp_" + "A" * 36,
    "github-fine-grained": "github_pat_" + "11ABCDEFG0" * 4,
    "aws": "AKIA" + "IOSFODNN7EXAMPLE",
    "slack": "xoxb-" + "1234567890-abcdefghij",
    "jwt": "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0." + "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
}


def enrolled_event(hostname: str) -> AuditEvent:
    return AuditEvent(at=utcnow(), actor="agent", action="node.enrolled", node_id="n-1", details={"hostname": hostname})


def test_an_agents_hostname_cannot_mention_everyone_or_hide_a_link_in_any_alert():
    alert = messages.compose(enrolled_event(HOSTILE_HOSTNAME), "gpu-01")
    assert "@everyone" not in alert.body and "@\u200beveryone" in alert.body  # shown, but pings nobody
    assert "](" not in alert.body and "http://evil" not in alert.body  # no masked link, no bare one either
    assert "evil.example/login" in alert.body  # the operator still sees what the agent claimed


@pytest.mark.parametrize("shape", sorted(PROVIDER_TOKENS))
def test_provider_tokens_are_redacted_from_alerts_and_their_errors(shape):
    token = PROVIDER_TOKENS[shape]
    alert = messages.compose(enrolled_event(f"host-{shape} {token}"), f"name {token}")
    assert token not in alert.title + alert.body and "[redacted]" in alert.body
    assert token not in sender.scrub(f"HTTP 401: {token} refused", "json://127.0.0.1:9/x")


def test_words_that_merely_start_like_tokens_are_left_alone():
    plain = "disk-usage-report shelf_life_of_gpus ask-operator AKIA"
    assert messages.compose(enrolled_event(plain), "gpu-01").body.count("[redacted]") == 0


def test_each_target_gets_the_agents_text_escaped_for_its_own_format(database_url, tmp_path, receiver):
    """Plain text as it is, Markdown backslash-escaped, HTML entity-escaped: nothing the agent sent is markup."""
    urls = [
        receiver.url(path="hooks/text"),
        receiver.url(path="hooks/markdown") + "?format=markdown",
        receiver.url(path="hooks/html") + "?format=html",
    ]
    application = create_app(app_env(database_url, tmp_path, MODELFORGE_ALERT_URLS=" ".join(urls)))
    try:
        factories.enrolled_node(application.test_client(), hostname=HOSTILE_HOSTNAME)
        assert sweep(application)["sent"] == 3
    finally:
        with application.app_context():
            db.session.remove()
            db.engine.dispose()
    sent = {notification["path"]: notification["message"] for notification in receiver.notifications}
    text, markdown, html = sent["/hooks/text"], sent["/hooks/markdown"], sent["/hooks/html"]
    for body in (text, markdown, html):
        assert "@everyone" not in body and "](" not in body and "<!channel>" not in body and "http://" not in body
    assert "[click here]" in text and "<b>bold</b>" in text  # plain text is shown as it is
    assert "\\[click here\\]" in markdown and "\\*x\\*" in markdown and "\\<b\\>" in markdown
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<" not in html


def test_backoff_doubles_from_two_seconds_up_to_five_minutes():
    assert [deliveries.backoff_seconds(attempt) for attempt in (1, 2, 3, 4, 8, 9, 30)] == [2, 4, 8, 16, 256, 300, 300]


def test_an_error_never_carries_a_part_of_the_target_url():
    url = "gotify://gotify.lan/AbCdEf-Token-123/?priority=high"
    text = "Failed to send to https://gotify.lan/message?token=AbCdEf-Token-123: HTTP 401 mfe_" + "a" * 30
    scrubbed = sender.scrub(text, url)
    assert "AbCdEf-Token-123" not in scrubbed and "mfe_" not in scrubbed
    assert "HTTP 401" in scrubbed


# --------------------------------------------------------------------------- once per transition


def test_every_alerting_transition_is_sent_once_to_the_receiver(alert_app, receiver):
    client = alert_app.test_client()
    node = factories.enrolled_node(client, hostname="gpu-host-7")  # node.enrolled
    node_id, credential = node["node_id"], node["credential"]
    headers = factories.bearer(credential)
    assert client.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=headers).status_code == 200
    with alert_app.app_context():
        settings = current_settings(alert_app)
        later = utcnow() + timedelta(seconds=settings.node_offline_after_seconds + 1)
        assert liveness.sweep(settings, now=later)["offline"] == 1  # node.offline
    assert client.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=headers).status_code == 200
    record(alert_app, "job.failed", node_id, job_id="job-1", attempt=3, code="JOB_LEASE_LOST")
    record(alert_app, "node.stale", node_id, previous="online")  # not an alerting action
    revoked = client.post(f"/api/v1/admin/nodes/{node_id}/credential/revoke", headers=ADMIN)
    assert revoked.status_code == 200

    # Two schedulers' runs back to back, and each queue step twice: one delivery per event.
    first, second = sweep(alert_app), sweep(alert_app)
    with alert_app.app_context():
        assert deliveries.enqueue_new(targets(alert_app)) == 0
        assert deliveries.claim_next(targets(alert_app)) is None
    assert first == {"queued": 5, "sent": 5, "retrying": 0, "failed": 0}
    assert second == {"queued": 0, "sent": 0, "retrying": 0, "failed": 0}
    assert receiver.titles() == [
        "Node enrolled: GPU Node",
        "Node offline: GPU Node",
        "Node back online: GPU Node",
        "Job failed on GPU Node: JOB_LEASE_LOST",
        "Credential revoked: GPU Node",
    ]
    by_title = {notification["title"]: notification for notification in receiver.notifications}
    assert by_title["Node offline: GPU Node"]["type"] == "failure"
    assert f"GPU Node (node {node_id})" in by_title["Node back online: GPU Node"]["message"]
    assert "from host gpu-host-7" in by_title["Node enrolled: GPU Node"]["message"]
    assert {notification["path"] for notification in receiver.notifications} == {"/hooks/modelforge"}
    basic = base64.b64encode(f"alerts:{HOOK_SECRET}".encode()).decode()
    assert set(receiver.authorizations) == {f"Basic {basic}"}  # the secret goes to the service, only there
    payloads = receiver.payloads()
    for secret in (node["token"], credential, OPERATOR_KEY, HOOK_SECRET, credential[:10]):
        assert secret not in payloads
    assert all(row.state == AlertDeliveryState.SENT and row.attempts == 1 for row in delivery_rows(alert_app))


def test_a_node_back_from_stale_sends_nothing_and_one_back_from_offline_says_so_once(alert_app, receiver):
    client = alert_app.test_client()
    headers = factories.bearer(factories.enrolled_node(client)["credential"])

    def heartbeat():
        assert (
            client.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=headers).status_code == 200
        )

    heartbeat()
    with alert_app.app_context():
        settings = current_settings(alert_app)
        stale_at = utcnow() + timedelta(seconds=settings.node_stale_after_seconds + 1)
        assert liveness.sweep(settings, now=stale_at) == {"stale": 1, "offline": 0}
    heartbeat()  # stale → online: audited as node.returned, but no offline alert came before it
    assert sweep(alert_app)["sent"] == 1
    assert receiver.titles() == ["Node enrolled: GPU Node"]

    with alert_app.app_context():
        offline_at = utcnow() + timedelta(seconds=settings.node_offline_after_seconds + 1)
        assert liveness.sweep(settings, now=offline_at)["offline"] == 1
    heartbeat()  # offline → online
    assert sweep(alert_app)["sent"] == 2
    assert receiver.titles() == ["Node enrolled: GPU Node", "Node offline: GPU Node", "Node back online: GPU Node"]
    with alert_app.app_context():
        returns = db.session.scalars(sa.select(AuditEvent).where(AuditEvent.action == "node.returned")).all()
        assert sorted(event.details["previous"] for event in returns) == ["offline", "stale"]


def test_a_job_failed_by_its_agent_alerts_with_type_and_code_but_not_the_agents_message(alert_app, receiver):
    client = alert_app.test_client()
    enrolled = factories.enrolled_node(client)
    node = {"id": enrolled["node_id"], "auth": factories.bearer(enrolled["credential"])}
    inventory = {**factories.inventory_body(), "capabilities": [ACQUIRE]}
    assert client.post("/api/v1/agent/inventory", json=inventory, headers=node["auth"]).status_code == 200
    assert (
        client.post("/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=node["auth"]).status_code == 200
    )
    job = add_job(client, node["id"], add_root(client, node["id"]).get_json()["id"])
    claim(client, node)
    error = {"code": "HUB_REPO_NOT_FOUND", "message": "owner/tiny does not exist; token mfe_" + "z" * 30}
    failed = agent(client, node, f"jobs/{job['id']}/fail", attempt=1, error=error, retryable=False)
    assert failed.status_code == 200
    sweep(alert_app)
    (notification,) = [n for n in receiver.notifications if n["title"].startswith("Job failed")]
    assert notification["title"] == "Job failed on GPU Node: HUB_REPO_NOT_FOUND"
    assert f"Job {job['id']} (artifact.acquire.v1) on GPU Node" in notification["message"]
    assert "owner/tiny" not in notification["message"] and "mfe_" not in notification["message"]


def test_a_transition_queued_by_two_schedulers_at_once_is_one_delivery(alert_app):
    event_id = record(alert_app, "node.offline", "n-race", previous="online")
    barrier, counts, errors = threading.Barrier(2), [], []

    def enqueue():
        try:
            with alert_app.app_context():
                barrier.wait()
                counts.append(deliveries.enqueue_event(event_id, targets(alert_app)))
                db.session.commit()
        except Exception as error:  # the assertion below reports it
            errors.append(error)

    threads = [threading.Thread(target=enqueue) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and sorted(counts) == [0, 1]
    with alert_app.app_context():
        assert deliveries.claim_next(targets(alert_app)) is not None
        assert deliveries.claim_next(targets(alert_app)) is None  # claimed: the other scheduler gets nothing


def test_a_replica_that_lacks_a_target_leaves_its_deliveries_to_the_replicas_that_have_it(alert_app, receiver):
    record(alert_app, "node.offline", "n-1", previous="stale")
    with alert_app.app_context():
        other = targets_for(("json://127.0.0.1:9/elsewhere",), alert_targets.target_salt())
        assert deliveries.enqueue_new(targets(alert_app)) == 1
        assert deliveries.claim_next(other) is None and deliveries.claim_next(()) is None
    assert sweep(alert_app)["sent"] == 1 and receiver.titles() == ["Node offline: node n-1"]


def test_replicas_with_different_secret_keys_send_one_alert_and_share_its_history(
    database_url, tmp_path, alert_app, receiver
):
    # Each replica generates its own instance/secret-key unless one is set; a rotated key is the
    # same case. A target is named alike by all of them, so the second replica's sweep finds the
    # delivery already queued and sent, and its settings page shows it.
    (tmp_path / "b").mkdir()
    other = create_app(
        app_env(
            database_url, tmp_path / "b", MODELFORGE_ALERT_URLS=receiver.url(), MODELFORGE_SECRET_KEY="replica-b-key"
        )
    )
    assert current_settings(other).secret_key != current_settings(alert_app).secret_key
    record(alert_app, "node.offline", "n-1", previous="online")
    assert sweep(alert_app)["sent"] == 1
    assert sweep(other) == {"queued": 0, "sent": 0, "retrying": 0, "failed": 0}
    assert receiver.titles() == ["Node offline: node n-1"]
    client = other.test_client()
    assert sign_in(client).status_code == 302
    page = client.get("/settings").get_data(as_text=True)
    assert "node.offline" in page and ">sent<" in page
    with other.app_context():
        db.session.remove()
        db.engine.dispose()


def test_replicas_that_first_ask_at_once_agree_on_the_one_target_salt(database_url, tmp_path):
    apps = []
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        apps.append(create_app(app_env(database_url, tmp_path / name, MODELFORGE_SECRET_KEY=f"key-{name}")))
    barrier, salts, errors = threading.Barrier(len(apps)), [], []

    def first_ask(application):
        try:
            with application.app_context():
                barrier.wait()
                salts.append(alert_targets.target_salt())
        except Exception as error:  # the assertion below reports it
            errors.append(error)

    threads = [threading.Thread(target=first_ask, args=(application,)) for application in apps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and len(salts) == 3 and len(set(salts)) == 1 and len(salts[0]) == 8
    for application in apps:
        with application.app_context():
            assert alert_targets.target_salt() == salts[0]  # cached, and what the database holds
            db.session.remove()
            db.engine.dispose()


def test_history_from_before_alerts_ran_is_not_sent(alert_app, receiver):
    with alert_app.app_context():
        db.session.add(AuditEvent(at=utcnow() - timedelta(hours=2), actor="system", action="node.offline"))
        db.session.commit()
    assert sweep(alert_app)["queued"] == 0
    assert receiver.titles() == []


def test_a_target_that_is_down_is_retried_with_backoff_until_it_answers(alert_app, receiver):
    receiver.stop()
    record(alert_app, "node.offline", "n-1", previous="stale")
    assert sweep(alert_app) == {"queued": 1, "sent": 0, "retrying": 1, "failed": 0}
    (row,) = delivery_rows(alert_app)
    assert row.state == AlertDeliveryState.PENDING and row.attempts == 1
    assert 1.5 <= (row.next_attempt_at - row.last_attempt_at).total_seconds() <= 2.5
    assert "connection error" in row.last_error.lower()
    assert HOOK_SECRET not in row.last_error and "hooks/modelforge" not in row.last_error
    assert sweep(alert_app)["sent"] == 0  # not due yet: nothing is tried before its backoff

    with alert_app.app_context():
        later = utcnow() + timedelta(seconds=3)
        claimed = deliveries.claim_next(targets(alert_app), now=later)
        assert deliveries.record_result(claimed, "still down", now=later) == AlertDeliveryState.PENDING
    (row,) = delivery_rows(alert_app)
    assert row.attempts == 2 and (row.next_attempt_at - row.last_attempt_at).total_seconds() == 4

    receiver.start()
    with alert_app.app_context():
        claimed = deliveries.claim_next(targets(alert_app), now=utcnow() + timedelta(seconds=8))
        assert sender.send(claimed.target, claimed.alert) is None
        assert deliveries.record_result(claimed, None) == AlertDeliveryState.SENT
    assert receiver.titles() == ["Node offline: node n-1"]


def test_a_lapsed_claim_is_claimed_again_and_the_late_result_does_not_overwrite_it(alert_app):
    record(alert_app, "node.offline", "n-1", previous="stale")
    with alert_app.app_context():
        deliveries.enqueue_new(targets(alert_app))
        first = deliveries.claim_next(targets(alert_app))
        assert deliveries.claim_next(targets(alert_app), now=utcnow() + timedelta(seconds=30)) is None  # held
        later = utcnow() + timedelta(seconds=deliveries.CLAIM_SECONDS + 1)  # its sender died mid-send
        second = deliveries.claim_next(targets(alert_app), now=later)
        assert (first.id, first.attempts, second.attempts) == (second.id, 1, 2)
        deliveries.record_result(second, None, now=later)
        deliveries.record_result(first, "timed out", now=later)  # fenced out by the attempt number
    (row,) = delivery_rows(alert_app)
    assert (row.state, row.attempts, row.last_error) == (AlertDeliveryState.SENT, 2, None)


def test_an_alert_undelivered_for_a_day_is_given_up(alert_app, receiver):
    receiver.stop()
    record(alert_app, "node.returned", "n-1", previous="offline")
    sweep(alert_app)
    with alert_app.app_context():
        much_later = utcnow() + deliveries.GIVE_UP_AFTER
        claimed = deliveries.claim_next(targets(alert_app), now=much_later)
        assert deliveries.record_result(claimed, "down", now=much_later) == AlertDeliveryState.FAILED
        assert deliveries.claim_next(targets(alert_app), now=much_later + timedelta(days=1)) is None


# --------------------------------------------------------------------------- the settings page


@pytest.fixture
def console(alert_app):
    return signed_in(alert_app.test_client(), "/settings")


def test_the_settings_page_shows_targets_masked_and_the_test_alert_goes_through_the_scheduler(
    alert_app, console, receiver
):
    page = console.get("/settings").get_data(as_text=True)
    assert "json://alerts:****@127.0.0.1:" in page and HOOK_SECRET not in page
    assert "none yet" in page and 'hx-trigger="every 2s"' not in page

    queued = console.post("/settings/alerts/test", headers={**HTMX, "X-CSRFToken": console.csrf})
    assert queued.status_code == 200
    fragment = queued.get_data(as_text=True)
    assert fragment.startswith("<section") or "<html" not in fragment
    assert "Test alert queued for 1 target(s)" in fragment
    assert 'hx-trigger="every 2s"' in fragment  # polls while the delivery waits
    assert receiver.titles() == []  # the request only queued it: requests never send
    with alert_app.app_context():
        tests = db.session.scalars(sa.select(AuditEvent).where(AuditEvent.action == "alert.test")).all()
        assert [(event.actor, event.details) for event in tests] == [("operator", {"targets": 1})]

    assert sweep(alert_app)["sent"] == 1
    assert receiver.titles() == ["ModelForge test alert"]
    page = console.get("/settings", headers=HTMX).get_data(as_text=True)
    assert "alert.test" in page and "mf-ok" in page and ">sent<" in page
    assert 'hx-trigger="every 2s"' not in page  # nothing waits: polling stops


def test_the_settings_page_shows_the_last_error_of_a_target_that_is_down(alert_app, console, receiver):
    receiver.stop()
    record(alert_app, "node.offline", "n-1", previous="stale")
    sweep(alert_app)
    page = console.get("/settings").get_data(as_text=True)
    assert "error, retrying" in page and "Connection error" in page
    assert HOOK_SECRET not in page and "1 alert(s) waiting" in page


def test_the_test_alert_refuses_without_csrf_or_without_targets(database_url, tmp_path, alert_app, console):
    refused = console.post("/settings/alerts/test", headers=HTMX)
    assert refused.status_code == 400
    bare = create_app(app_env(database_url, tmp_path))
    client = bare.test_client()
    assert sign_in(client).status_code == 302
    page = client.get("/settings").get_data(as_text=True)
    assert "No targets configured" in page and "disabled" in page
    nothing = client.post("/settings/alerts/test", headers={**HTMX, "X-CSRFToken": csrf_from(page)})
    assert nothing.status_code == 409 and "set MODELFORGE_ALERT_URLS" in nothing.get_data(as_text=True)
    with bare.app_context():
        assert db.session.scalar(sa.select(sa.func.count(AlertDelivery.id))) == 0
        assert db.session.scalar(sa.select(sa.func.count(AuditEvent.id)).where(AuditEvent.action == "alert.test")) == 0
        db.session.remove()
        db.engine.dispose()


# --------------------------------------------------------------------------- targets added in the console


@pytest.fixture
def bare_app(database_url, tmp_path):
    """The control plane with no target in its environment."""
    application = create_app(app_env(database_url, tmp_path))
    yield application
    with application.app_context():
        db.session.remove()
        db.engine.dispose()


def webhook_of(receiver, secret: str = HOOK_SECRET) -> str:
    """The receiver as an operator pastes a webhook: http(s)://, its secret in the password."""
    return receiver.url(secret).replace("json://", "http://", 1)


def add_target(console, url: str):
    return console.post("/settings/alerts/targets", data={"url": url}, headers={**HTMX, "X-CSRFToken": console.csrf})


def stored_text(app) -> str:
    """Every row of every table as text: what anyone reading the database sees."""
    with app.app_context():
        found = []
        for table in db.metadata.sorted_tables:
            found += [repr(tuple(row)) for row in db.session.execute(sa.select(table)).all()]
        db.session.remove()
    return "\n".join(found)


def database_file_bytes(database_url: str) -> bytes:
    """The SQLite file and its write-ahead log as bytes (empty on PostgreSQL)."""
    if not database_url.startswith("sqlite:///"):
        return b""
    path = database_url.removeprefix("sqlite:///")
    return b"".join(Path(name).read_bytes() for name in (path, path + "-wal") if Path(name).exists())


def test_a_target_added_in_the_console_is_stored_encrypted_shown_masked_and_receives_test_and_real_alerts(
    bare_app, database_url, receiver, caplog
):
    caplog.set_level(logging.DEBUG)
    console = signed_in(bare_app.test_client(), "/settings")
    page = console.get("/settings").get_data(as_text=True)
    assert "No alert target: add one below" in page and 'aria-describedby="alerts-test-why"' in page
    record(bare_app, "node.offline", "n-0", previous="online")  # before the target: never sent to it

    added = add_target(console, webhook_of(receiver))
    assert added.status_code == 200
    fragment = added.get_data(as_text=True)
    assert "Alert target added: json://alerts:****@127.0.0.1:" in fragment and "added here" in fragment
    assert HOOK_SECRET not in fragment and "hooks/modelforge" not in fragment
    assert 'value=""' in fragment  # the form is emptied, never refilled
    with bare_app.app_context():
        (row,) = db.session.scalars(sa.select(AlertTarget)).all()
        assert row.enabled and row.label.startswith("json://alerts:****@127.0.0.1:")
        event = db.session.scalar(sa.select(AuditEvent).where(AuditEvent.action == "alert_target.added"))
        assert (event.actor, event.details) == ("operator", {"target": row.label})
        db.session.remove()

    one = console.post(
        "/settings/alerts/test", data={"target": row.target_key}, headers={**HTMX, "X-CSRFToken": console.csrf}
    )
    assert one.status_code == 200 and f"Test alert queued to {row.label}" in one.get_data(as_text=True)
    assert sweep(bare_app)["sent"] == 1 and receiver.titles() == ["ModelForge test alert"]
    record(bare_app, "node.offline", "n-1", previous="online")
    assert sweep(bare_app) == {"queued": 1, "sent": 1, "retrying": 0, "failed": 0}
    assert receiver.titles() == ["ModelForge test alert", "Node offline: node n-1"]
    assert receiver.notifications[-1]["path"] == "/hooks/modelforge"
    assert receiver.authorizations[-1] == "Basic " + base64.b64encode(f"alerts:{HOOK_SECRET}".encode()).decode()
    page = console.get("/settings").get_data(as_text=True)
    assert "node.offline" in page and ">sent<" in page

    # P2: the URL is in no page, no log line, no audit detail, no row and no byte of the database file.
    for shown in (page, caplog.text, stored_text(bare_app)):
        assert HOOK_SECRET not in shown and "hooks/modelforge" not in shown
    on_disk = database_file_bytes(database_url)
    assert HOOK_SECRET.encode() not in on_disk
    assert row.label.encode() in on_disk or not database_url.startswith("sqlite")  # the grep reads the rows


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("", "Enter the URL alerts should go to."),
        ("hooks.example.lan/" + HOOK_SECRET, "That is not a URL"),
        ("https://" + "a" * 2001, "characters long; at most 2000"),
        ("https:///" + HOOK_SECRET, "no host"),
        ("https://hooks.example.lan/a b" + HOOK_SECRET, "no spaces"),
        ("nosuchservice://hooks.example.lan/" + HOOK_SECRET, "apprise cannot send to that URL (nosuchservice://…)"),
    ],
)
def test_a_bad_target_url_is_refused_inline_with_400_and_never_shown_back(bare_app, url, said, caplog):
    caplog.set_level(logging.DEBUG)
    console = signed_in(bare_app.test_client(), "/settings")
    refused = add_target(console, url)
    assert refused.status_code == 400
    fragment = refused.get_data(as_text=True)
    assert 'data-testid="alert-target-error"' in fragment and said in fragment
    assert 'aria-invalid="true"' in fragment
    assert HOOK_SECRET not in fragment and HOOK_SECRET not in caplog.text
    with bare_app.app_context():
        assert db.session.scalar(sa.select(sa.func.count(AlertTarget.id))) == 0
        assert db.session.scalar(sa.select(sa.func.count(AuditEvent.id))) == 1  # the sign-in only
        db.session.remove()


def test_a_target_already_listed_is_refused_whether_from_the_console_or_the_environment(alert_app, receiver):
    console = signed_in(alert_app.test_client(), "/settings")
    page = console.get("/settings").get_data(as_text=True)
    assert "from <code>MODELFORGE_ALERT_URLS</code> (read-only)" in page
    assert "Remove json://" not in page  # the environment's target has no remove, nor disable
    again = add_target(console, receiver.url())
    assert again.status_code == 400 and "already set in MODELFORGE_ALERT_URLS" in again.get_data(as_text=True)
    other = receiver.url(path="hooks/other")
    assert add_target(console, other).status_code == 200
    twice = add_target(console, other)
    assert twice.status_code == 400 and "already in the list" in twice.get_data(as_text=True)
    with alert_app.app_context():
        assert len(targets(alert_app)) == 2  # the environment's and the console's: merged
        db.session.remove()


def test_a_target_disabled_gets_nothing_and_one_removed_gives_up_what_waited(bare_app, receiver):
    console = signed_in(bare_app.test_client(), "/settings")
    assert add_target(console, receiver.url()).status_code == 200
    with bare_app.app_context():
        row_id = db.session.scalar(sa.select(AlertTarget.id))
        db.session.remove()
    csrf = {**HTMX, "X-CSRFToken": console.csrf}

    disabled = console.post(f"/settings/alerts/targets/{row_id}/disable", headers=csrf)
    assert disabled.status_code == 200 and 'data-testid="alert-target-disabled"' in disabled.get_data(as_text=True)
    page = disabled.get_data(as_text=True)
    assert "Send test to" not in page and "every one is disabled or unreadable" in page
    record(bare_app, "node.offline", "n-1", previous="online")
    assert sweep(bare_app)["queued"] == 0 and receiver.titles() == []

    assert console.post(f"/settings/alerts/targets/{row_id}/enable", headers=csrf).status_code == 200
    record(bare_app, "node.offline", "n-2", previous="online")
    receiver.stop()
    assert sweep(bare_app)["retrying"] == 1
    removed = console.post(f"/settings/alerts/targets/{row_id}/remove", headers=csrf)
    assert removed.status_code == 200 and "Alert target removed: json://alerts:****@" in removed.get_data(as_text=True)
    assert "No alert target: add one below" in removed.get_data(as_text=True)
    assert console.post(f"/settings/alerts/targets/{row_id}/remove", headers=csrf).status_code == 404
    with bare_app.app_context():
        states = [row.state for row in db.session.scalars(sa.select(AlertDelivery))]
        trail = db.session.execute(
            sa.select(AuditEvent.action, AuditEvent.details).where(AuditEvent.action.like("alert_target.%"))
        ).all()
        db.session.remove()
    assert states == [AlertDeliveryState.FAILED]
    assert [action for action, _ in trail] == [
        "alert_target.added",
        "alert_target.disabled",
        "alert_target.enabled",
        "alert_target.removed",
    ]
    assert all(set(details) == {"target"} and HOOK_SECRET not in details["target"] for _, details in trail)


def test_a_target_stored_under_another_operator_key_is_shown_unreadable_and_can_be_removed(
    bare_app, database_url, tmp_path, receiver
):
    console = signed_in(bare_app.test_client(), "/settings")
    assert add_target(console, receiver.url()).status_code == 200
    other_key = "another-operator-key-" + "x" * 32
    (tmp_path / "b").mkdir()
    rotated = create_app(app_env(database_url, tmp_path / "b", MODELFORGE_OPERATOR_API_KEY=other_key))
    try:
        with rotated.app_context():
            assert alert_targets.configured(current_settings(rotated)) == ()
        client = rotated.test_client()
        assert sign_in(client, other_key).status_code == 302
        page = client.get("/settings").get_data(as_text=True)
        assert "Stored under another operator key" in page and "Send test to" not in page
        client.csrf = csrf_from(page)
        with rotated.app_context():
            row_id = db.session.scalar(sa.select(AlertTarget.id))
        removed = client.post(f"/settings/alerts/targets/{row_id}/remove", headers={**HTMX, "X-CSRFToken": client.csrf})
        assert removed.status_code == 200
    finally:
        with rotated.app_context():
            db.session.remove()
            db.engine.dispose()


def test_the_env_file_source_is_named_and_a_service_id_in_the_hosts_place_is_masked(tmp_path):
    listing = tmp_path / "alert-urls"
    listing.write_text("ntfy://ntfy.sh/topic\n")
    settings = load_settings({**BASE, "MODELFORGE_ALERT_URLS_FILE": str(listing)}, tmp_path)
    assert settings.alert_urls_source == "MODELFORGE_ALERT_URLS_FILE"
    assert load_settings(BASE, tmp_path).alert_urls_source == "MODELFORGE_ALERT_URLS"
    # apprise reads https://ntfy.sh/<topic> as ntfys://<topic>: the topic, its secret, is in the host's place.
    (ntfy,) = targets_for(("https://ntfy.sh/my-private-topic",), b"salt")
    assert "private" not in ntfy.label and ntfy.label == "ntfys://m...c"
    assert alert_targets.prepare("https://ntfy.sh/my-private-topic") == "https://ntfy.sh/my-private-topic"
    assert alert_targets.prepare(" https://hooks.lan/x?token=abc ") == "jsons://hooks.lan/x?-token=abc"
