"""Console login with the operator key, sessions, logout and the login rate limit (C1, P2)."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from datetime import timedelta
from functools import wraps
from urllib.parse import urlsplit

import sqlalchemy as sa
from flask import current_app, flash, g, redirect, render_template, request, session, url_for
from werkzeug.wrappers import Response

from app import audit, tokens
from app.config import current_settings
from app.console import bp
from app.console.forms import LoginForm
from app.db import READ_ONLY, begin_read_only
from app.extensions import db
from app.models import AuditEvent, OperatorSession
from app.timeutil import utcnow

LOGIN_FAILED = "console.login_failed"
# Failed logins per client address in the window before the next attempt is refused. Counted in
# the audit table, so the limit holds across gunicorn workers and control-plane replicas.
MAX_FAILED_LOGINS = 10
FAILED_LOGIN_WINDOW = timedelta(minutes=10)
# C1: a session lasts as long as the signed cookie did (12 h); its last-seen time is written at
# most once a minute, so a console request costs one indexed read and almost never a write.
SESSION_LIFETIME = timedelta(hours=12)
LAST_SEEN_RESOLUTION = timedelta(minutes=1)
SIGN_OUT_EVERYWHERE = "console.sign_out_everywhere"


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
    """Whether this request carries a live operator session (checked once per request)."""
    if "operator_session_live" not in g:
        g.operator_session_live = _session_is_live()
    return g.operator_session_live


def _session_is_live() -> bool:
    """The key fingerprint still matches and the server still holds the session, unrevoked."""
    fingerprint, session_id = session.get("operator"), session.get("sid")
    if not (isinstance(fingerprint, str) and hmac.compare_digest(fingerprint, _key_fingerprint())):
        return False
    if not isinstance(session_id, str):
        return False  # a cookie from before server-side sessions: sign in again
    token_hash = tokens.digest(session_id)
    now = utcnow()
    # Its own short connection, so the view's transaction starts as the view wants it (a
    # reader on SQLite), and the rare last-seen write never waits behind the view's.
    with db.engine.connect().execution_options(**{READ_ONLY: True}) as connection:
        row = connection.execute(
            sa.select(OperatorSession.token_hash, OperatorSession.last_seen_at).where(
                OperatorSession.token_hash == token_hash,
                OperatorSession.revoked_at.is_(None),
                OperatorSession.expires_at > now,
            )
        ).first()
    if row is None or not tokens.same_digest(row.token_hash, session_id):
        return False
    # Never while this request's own transaction is open: on SQLite it might hold the write lock.
    if now - row.last_seen_at >= LAST_SEEN_RESOLUTION and not db.session().in_transaction():
        with db.engine.begin() as connection:
            connection.execute(
                sa.update(OperatorSession)
                .where(
                    OperatorSession.token_hash == token_hash, OperatorSession.last_seen_at < now - LAST_SEEN_RESOLUTION
                )
                .values(last_seen_at=now)
            )
    return True


def _start_session(address: str) -> None:
    """A fresh server-side session; the cookie carries its id, the table only the id's hash (P2)."""
    session_id = secrets.token_urlsafe(32)
    now = utcnow()
    # Sessions long expired are of no use to show: dropped here, where sessions begin.
    db.session.execute(sa.delete(OperatorSession).where(OperatorSession.expires_at < now - SESSION_LIFETIME))
    db.session.add(
        OperatorSession(
            token_hash=tokens.digest(session_id),
            created_at=now,
            last_seen_at=now,
            expires_at=now + SESSION_LIFETIME,
            remote_addr=address[:64],
            # Shown to the operator later: printable characters only (PostgreSQL refuses NUL).
            user_agent="".join(char for char in request.user_agent.string if char.isprintable())[:200] or None,
        )
    )
    session.clear()  # a fresh session (and CSRF token) on every sign-in
    session.permanent = True
    session["operator"] = _key_fingerprint()
    session["sid"] = session_id


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
                _start_session(address)
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
    """End this session on the server too, so its cookie is worthless (CSRFProtect checked the form)."""
    now = utcnow()
    db.session.execute(
        sa.update(OperatorSession)
        .where(OperatorSession.token_hash == tokens.digest(session["sid"]), OperatorSession.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    audit.record(audit.OPERATOR, "console.logout", remote_addr=client_key(request.remote_addr))
    db.session.commit()
    session.clear()
    flash("Signed out.")
    return redirect(url_for("console.login"))


@bp.post("/logout/everywhere")
@login_required
def sign_out_everywhere():
    """C1: end every operator session, this one included: a lost laptop's cookie stops working."""
    now = utcnow()
    ended = db.session.execute(
        sa.update(OperatorSession)
        .where(OperatorSession.revoked_at.is_(None), OperatorSession.expires_at > now)
        .values(revoked_at=now)
    ).rowcount
    audit.record(audit.OPERATOR, SIGN_OUT_EVERYWHERE, sessions_ended=ended, remote_addr=client_key(request.remote_addr))
    db.session.commit()
    session.clear()
    flash(f"Signed out everywhere: {ended} session{'s' if ended != 1 else ''} ended.")
    return redirect(url_for("console.login"))
