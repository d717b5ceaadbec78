"""S5: a stream that has nothing to say yet (a model loading, a long prompt, a queued request)
still tells its client something at least every 15 s, and one whose node says nothing at all
ends with relay_lost instead of waiting forever. The relay's own Stream, with its interval shortened."""

from __future__ import annotations

import time

from app.serving import relay


def test_silence_brings_a_keepalive_each_interval_then_the_events_and_a_silent_node_ends_the_stream(monkeypatch):
    assert relay.KEEPALIVE_SECONDS <= 15  # S5: a comment line at least every 15 s
    monkeypatch.setattr(relay, "KEEPALIVE_SECONDS", 0.05)
    stream = relay.Stream(id="r-1", deployment_id="d-1", connection=None)
    events = stream.iterate(deadline_seconds=0.4)
    started = time.monotonic()
    assert next(events) is None and next(events) is None  # two keep-alives (": keep-alive" lines in SSE)
    assert time.monotonic() - started >= 0.1
    stream.events.put({"event": "token", "text": "Hi"})
    assert next(events) == {"event": "token", "text": "Hi"}
    quiet = time.monotonic()
    ends = [event for event in events if event is not None]  # keep-alives until the node's deadline
    assert time.monotonic() - quiet >= 0.4
    assert [event["event"] for event in ends] == [relay.RELAY_LOST] and stream.done
