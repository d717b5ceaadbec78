"""The alert sweep (O2): queue new alerting audit events, then send what is due.

It runs in the scheduler process (app.scheduler), every sweep interval, each tick claimed by
one scheduler, whether or not any target is configured (the console adds them while it runs);
the deliveries' own unique key and claims keep it exactly once even when two ticks overlap (a
slow target) on two replicas.
"""

from __future__ import annotations

import logging

from app.alerts import deliveries, sender
from app.alerts import targets as alert_targets
from app.config import Settings
from app.models import AlertDeliveryState

log = logging.getLogger("modelforge.alerts")


def sweep(settings: Settings) -> dict[str, int]:
    """Queue and send; counts of what was queued, sent, left to retry and given up."""
    targets = alert_targets.configured(settings)  # before any write: it may create the salt
    if not targets:
        # Nothing to send to, so no write either: a target added later gets only what follows
        # (Target.since), and the environment's exist from the start.
        return {"queued": 0, "sent": 0, "retrying": 0, "failed": 0}
    counts = {"queued": deliveries.enqueue_new(targets), "sent": 0, "retrying": 0, "failed": 0}
    for _ in range(deliveries.BATCH):
        claimed = deliveries.claim_next(targets)
        if claimed is None:
            break
        if claimed.alert is None:
            error = "the audit event behind this alert no longer exists"
        else:
            error = sender.send(claimed.target, claimed.alert)
        state = deliveries.record_result(claimed, error)
        if state == AlertDeliveryState.SENT:
            counts["sent"] += 1
            continue
        counts["failed" if state == AlertDeliveryState.FAILED else "retrying"] += 1
        log.warning(
            "alert %d to %s not delivered (attempt %d): %s", claimed.id, claimed.target.label, claimed.attempts, error
        )
    return counts
