"""Gunicorn settings for `make run` and the tests: `gunicorn -c python:app.gunicorn_conf wsgi:app`."""

import gc
import os
import shutil
import signal
import sys
import tempfile
import threading

bind = os.environ.get("MODELFORGE_BIND", "127.0.0.1:8000")
# S5: threads, not sync workers. A relay connection (an agent's WebSocket) and a client's token
# stream each hold one thread for as long as they last; with sync workers four streams would lock
# the console and the agent API out. bench/relay.py chose this over chunked long-poll (+227 ms per
# token) and an asyncio service (0.5 ms faster per token, a second server to run).
worker_class = "gthread"
# 64: room for relay.STREAMS_PER_PROCESS (16) streams, one connection per node, and the console
# and API beside them; an idle keep-alive connection waits in gthread's poller, not on a thread.
threads = int(os.environ.get("MODELFORGE_WEB_THREADS", "64"))
# On SQLite, one process holds every relay connection: a request meets its node's connection in
# memory, and SQLite has one writer anyway (bench/heartbeat.py: one threaded worker carries 0.54 of
# /healthz's rate in heartbeats, four threaded workers only 0.33). On PostgreSQL, WEB_CONCURRENCY
# workers (and replicas) reach the process that holds a node's connection with LISTEN/NOTIFY.
ON_SQLITE = os.environ.get("MODELFORGE_DATABASE_URL", "sqlite:").startswith("sqlite:")
workers = 1 if ON_SQLITE else int(os.environ.get("WEB_CONCURRENCY", "4"))
# No keep-alive, as with the sync workers before: a browser that reuses an idle connection just as
# gunicorn closes it gets a reset (htmx:sendError). A stream or a relay connection is one request,
# so nothing long-lived needs it; behind nginx, the client's keep-alive is nginx's.
keepalive = 0
# Load the app once in the master so a configuration error stops start-up with one line.
preload_app = True
timeout = 30
graceful_timeout = 5
accesslog = "-"
# Secrets travel only in bodies and headers, so the request line and status are safe to log.
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms'
# Gunicorn would otherwise believe X-Forwarded-Proto and friends from 127.0.0.1 by itself. What a
# proxy may tell us is decided in one place, MODELFORGE_TRUSTED_PROXY_HOPS (ProxyFix, app/__init__.py):
# with its default 0, nothing forwarded is believed from anyone (C1, E3).
forwarded_allow_ips = ""

# O1: prometheus_client's multi-process mode. Each worker keeps its HTTP series in files of its own
# in this directory and GET /metrics, in whichever worker answers, sums them all. A fresh private
# directory (0700) per master, made before the app (and so prometheus_client) is imported, so no
# file of an earlier run or of another server on the host is ever counted; removed on exit.
metrics_dir = tempfile.mkdtemp(prefix="modelforge-metrics-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir


def pre_fork(server, worker):
    """Freeze what the master preloaded (app, modules, ~100,000 objects) before each fork.

    The worker's full garbage collections then skip those objects, which otherwise cost a 60 ms
    pause on about one request in ten of the 1,000-node page (bench/console.py), and the pages
    holding them stay shared with the master instead of being copied on write.
    """
    gc.freeze()


def post_fork(server, worker):
    """Each worker opens its own database connections; never share the master's sockets."""
    from app.extensions import db

    with worker.app.wsgi().app_context():
        db.engine.dispose(close=False)


def child_exit(server, worker):
    """O1: a dead worker's live gauges stop counting; its counters stay in the sums."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def _spawn_scheduler() -> int:
    """Start `python -m app.scheduler` and return its pid.

    os.posix_spawn, not subprocess.Popen: Popen waits on a close-on-exec pipe until the child has
    exec'd, and a worker that the master's main thread forks at that moment keeps a copy of the
    pipe's write end (workers never exec), so Popen blocked until that worker exited. CI saw it: a
    killed scheduler was never replaced, because the watcher was still inside the first Popen.
    posix_spawn reports exec failures without a pipe.
    """
    argv = [sys.executable, "-m", "app.scheduler", "--parent-pid", str(os.getpid())]
    return os.posix_spawn(sys.executable, argv, dict(os.environ))


def _run_scheduler(server, stopping: threading.Event) -> None:
    """Keep one sweep process alive beside the workers; it touches the database, we never do."""
    while not stopping.is_set():
        try:
            pid = _spawn_scheduler()
        except OSError as error:  # fork or exec refused (process or memory limits): try again, never give up
            server.log.error("could not start the scheduler process (%s); retrying in 5 s", error)
            stopping.wait(5)
            continue
        exited = threading.Event()
        server.modelforge_scheduler = (pid, exited)
        server.log.info("started the scheduler as process %s", pid)
        _, status = os.waitpid(pid, 0)
        exited.set()
        if not stopping.wait(5):
            server.log.warning("scheduler process exited with %s; starting another", os.waitstatus_to_exitcode(status))


def when_ready(server):
    """One scheduler per process group, as its own process — never one per worker (L3).

    Not a thread in this master: a fork of a process whose other thread holds a database
    connection or lock would hand each new worker a copy it can never release.
    """
    if server.app.wsgi().config["MODELFORGE"].run_scheduler:
        server.modelforge_stopping = threading.Event()
        threading.Thread(target=_run_scheduler, args=(server, server.modelforge_stopping), daemon=True).start()


def on_exit(server):
    """Stop the scheduler with the master, and remove the metrics files."""
    shutil.rmtree(metrics_dir, ignore_errors=True)
    stopping = getattr(server, "modelforge_stopping", None)
    if stopping is not None:
        stopping.set()
        scheduler = getattr(server, "modelforge_scheduler", None)
        if scheduler is None:
            return
        pid, exited = scheduler  # the watcher thread reaps it and sets `exited`
        try:
            os.kill(pid, signal.SIGTERM)
            if not exited.wait(10):
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
