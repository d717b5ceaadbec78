"""Alerts (O2): node offline and returned, job failed, credential revoked, node enrolled.

Driven by the audit trail, not by request handlers: a sweep in the scheduler process queues one
delivery per (audit event, target) and sends it through apprise, retrying while a target is
down (app.alerts.deliveries). Requests only ever write rows.
"""
