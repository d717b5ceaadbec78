"""Console login with the operator key, sessions, logout and the login rate limit (C1, P2)."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from datetime import timedelta
from functools import wraps
from urllib.parse import urlsplit

import sqlalchemy as sa
from flask import current_app, flash, redirect, render_template, request, session, url_for
from werkzeug.wrappers import Response

from app import audit, tokens
from app.config import current_settings
from app.console import bp
from app.console.forms import LoginForm
from app.db import begin_read_only
from app.extensions import db
from app.models import AuditEvent
from app.timeutil import utcnow

LOGIN_FAILED = "console.login_failed"
# Failed logins per client address in the window before the next attempt is refused. Counted in
# the audit table, so the limit holds across gunicorn workers and control-plane replicas.
MAX_FAILED_LOGINS = 10
FAILED_LOGIN_WINDOW = timedelta(minutes=10)


def _key_fingerprint() -> str:
    """Ties a session to the operator key in force: changing the key logs every session out.

    An HMAC under the session secret, so the signed cookie never carries anything derived from
    the key alone (P2).
    """
    settings = current_settings()
    return hmac.new(
        settings.secret_key.encode(), b"operator-session:" + settings.operator_api_key.encode(), hashlib.sha256
    ).hexdigest()[:32]


def signed_in() -> bool:
    """Whether this request carries a live operator session."""
    fingerprint = session.get("operator")
    return isinstance(fingerprint, str) and hmac.compare_digest(fingerprint, _key_fingerprint())


def _safe_next(target: str | None) -> str:
    """Only same-site relative paths; anything else goes to the nodes page (no open redirect)."""
    if target and target.startswith("/") and not target.startswith(("//", "/\\")) and target.isprintable():
        parts = urlsplit(target)
        if not parts.scheme and not parts.netloc:
            return target
    return url_for("console.nodes_page")


def client_key(address: str | None) -> str:
    """Who the login limit counts: the IPv4 address, or the /64 of an IPv6 one (one host's share)."""
    try:
        parsed = ipaddress.ip_address(address or "")
    except ValueError:
        return "unknown"
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


def login_required(view):
    """Send a visitor without a session to the login page; htmx gets a 401 and HX-Redirect."""

    @wraps(view)
    def wrapper(*args, **kwargs):
        if not signed_in():
            if request.headers.get("HX-Request") == "true":  # a fragment or a boosted navigation
                response = Response("Your session ended; sign in again.", 401, mimetype="text/plain")
                response.headers["HX-Redirect"] = url_for("console.login")
                return response
            return redirect(url_for("console.login", next=request.full_path.rstrip("?")))
        return view(*args, **kwargs)

    return wrapper


def _recent_failures(address: str) -> int:
    since = utcnow() - FAILED_LOGIN_WINDOW
    return db.session.scalar(
        sa.select(sa.func.count())
        .select_from(AuditEvent)
        .where(AuditEvent.action == LOGIN_FAILED, AuditEvent.at >= since)
        .where(AuditEvent.details["remote_addr"].as_string() == address)
    )


@bp.route("/login", methods=["GET", "POST"])
def login():
    """C1: exchange the operator key for a session cookie."""
    form = LoginForm()
    address = client_key(request.remote_addr)
    status, error = 200, None
    if request.method == "POST":
        if form.validate_on_submit():
            expected = current_settings().operator_api_key
            if tokens.same_secret(expected, form.operator_key.data.strip()):
                # The right key always gets in, even over the limit: anyone who can reach /login
                # could otherwise lock the operator out. The key is long and random (at least 32
                # characters), so the limit is there to stop noise, not guessing.
                session.clear()  # a fresh session (and CSRF token) on every sign-in
                session.permanent = True
                session["operator"] = _key_fingerprint()
                audit.record(audit.OPERATOR, "console.login", remote_addr=address)
                db.session.commit()
                return redirect(_safe_next(request.args.get("next")))
            if _recent_failures(address) >= MAX_FAILED_LOGINS:
                # Over the limit: refused without another audit row or log line, so a script
                # hammering the form cannot flood either.
                db.session.rollback()
                error = f"Too many failed sign-ins from {address}. Wait {FAILED_LOGIN_WINDOW.seconds // 60} minutes."
                response = Response(render_template("login.html", form=form, error=error), 429)
                response.headers["Retry-After"] = str(FAILED_LOGIN_WINDOW.seconds)
                return response
            audit.record("anonymous", LOGIN_FAILED, remote_addr=address)
            db.session.commit()
            current_app.logger.warning("console sign-in refused from %s", address)
            error, status = "That is not the operator key.", 401
        else:
            status = 400
    else:
        begin_read_only()
        if signed_in():
            return redirect(_safe_next(request.args.get("next")))
    form.operator_key.data = ""  # never render the typed key back into the page
    return render_template("login.html", form=form, error=error), status


@bp.post("/logout")
@login_required
def logout():
    """End the session; the next request needs the operator key again (CSRFProtect checked the form)."""
    session.clear()
    flash("Signed out.")
    return redirect(url_for("console.login"))
