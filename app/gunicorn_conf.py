"""Gunicorn settings for `make run` and the tests: `gunicorn -c python:app.gunicorn_conf wsgi:app`."""

import os

bind = os.environ.get("MODELFORGE_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "4"))
worker_class = "sync"
# Load the app once in the master so a configuration error stops start-up with one line.
preload_app = True
timeout = 30
graceful_timeout = 5
accesslog = "-"
# Secrets travel only in bodies and headers, so the request line and status are safe to log.
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms'


def post_fork(server, worker):
    """Each worker opens its own database connections; never share the master's sockets."""
    from app.extensions import db

    with worker.app.wsgi().app_context():
        db.engine.dispose(close=False)


def when_ready(server):
    """One scheduler per process group, in the master — never one per worker (L3)."""
    app = server.app.wsgi()
    if app.config["MODELFORGE"].run_scheduler:
        from app import scheduler

        server.modelforge_scheduler = scheduler.start(app)


def on_exit(server):
    """Stop the scheduler with the master."""
    running = getattr(server, "modelforge_scheduler", None)
    if running is not None:
        running.shutdown(wait=False)
