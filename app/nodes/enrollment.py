"""Minting, claiming, revoking and expiring enrolment tokens (E1–E5, I4)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from app import audit, tokens
from app.acceptance import checklist as acceptance
from app.errors import DomainError
from app.extensions import db
from app.models import Credential, Enrollment, EnrollmentState, Node, NodeLease
from app.timeutil import utcnow

MIN_EXPIRY_SECONDS = 60
# Why a credential was revoked when a retried claim replaced it (credentials.revoked_reason).
REISSUED = "reissued"
MAX_EXPIRY_SECONDS = 86_400


@dataclass
class EnrollmentRequest:
    """What an operator asks for when minting a token (E1)."""

    display_name: str
    expires_in_seconds: int
    api_origin: str
    role: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    production_eligible: bool = False
    lab_eligible: bool = False
    benchmark_eligible: bool = False
    agent_image: dict | None = None  # the console wizard's image source (C4, D5)


@dataclass
class Claim:
    """What an agent presents to enrol (E2, E3)."""

    token: str
    node_id: str
    hostname: str
    origin: str
    agent_version: str
    protocol_version: int
    compatibility: str


@dataclass
class ClaimResult:
    """The winner's spoils: the node and its credential, shown once."""

    node: Node
    enrollment: Enrollment
    credential_secret: str
    reissued: bool = False  # a retried claim whose first reply was lost


def create(request: EnrollmentRequest, actor: str = audit.OPERATOR) -> tuple[Enrollment, str]:
    """Mint a token; return the enrolment and the token, which exists nowhere else."""
    issued = tokens.issue(tokens.ENROLLMENT_TOKEN_PREFIX)
    now = utcnow()
    enrollment = Enrollment(
        token_hash=issued.digest,
        token_prefix=issued.visible_prefix,
        display_name=request.display_name,
        role=request.role,
        labels=request.labels,
        production_eligible=request.production_eligible,
        lab_eligible=request.lab_eligible,
        benchmark_eligible=request.benchmark_eligible,
        api_origin=request.api_origin,
        agent_image=request.agent_image,
        state=EnrollmentState.PENDING,
        created_at=now,
        expires_at=now + timedelta(seconds=request.expires_in_seconds),
    )
    db.session.add(enrollment)
    db.session.flush()
    audit.record(
        actor,
        "enrollment.created",
        enrollment_id=enrollment.id,
        display_name=enrollment.display_name,
        expires_at=enrollment.expires_at.isoformat(),
        api_origin=enrollment.api_origin,
        production_eligible=enrollment.production_eligible,
        **({"agent_image": request.agent_image["reference"]} if request.agent_image else {}),
    )
    db.session.commit()
    return enrollment, issued.secret


def get(enrollment_id: str) -> Enrollment:
    """The enrolment with this id, or ENROLLMENT_NOT_FOUND."""
    enrollment = db.session.get(Enrollment, enrollment_id)
    if enrollment is None:
        raise DomainError(
            "ENROLLMENT_NOT_FOUND",
            f"No enrolment has id {enrollment_id!r}.",
            "List enrolments with GET /api/v1/admin/node-enrollments.",
        )
    return enrollment


def revoke(enrollment_id: str, actor: str = audit.OPERATOR) -> Enrollment:
    """Revoke an unused token; a consumed, expired or revoked one is refused."""
    now = utcnow()
    revoked = db.session.execute(
        sa.update(Enrollment)
        .where(
            Enrollment.id == enrollment_id,
            Enrollment.state == EnrollmentState.PENDING,
            Enrollment.expires_at > now,
        )
        .values(state=EnrollmentState.REVOKED, revoked_at=now)
    ).rowcount
    if not revoked:
        enrollment = get(enrollment_id)
        db.session.rollback()
        raise DomainError(
            "ENROLLMENT_NOT_PENDING",
            f"Enrolment {enrollment_id} is {effective_state(enrollment, now)}; only an unused, "
            "unexpired token can be revoked.",
            "Nothing to do: the token can no longer be claimed. To remove an enrolled node's "
            "access, revoke its credential instead.",
        )
    audit.record(actor, "enrollment.revoked", enrollment_id=enrollment_id)
    db.session.commit()
    db.session.expire_all()
    return get(enrollment_id)


def effective_state(enrollment: Enrollment, now: datetime) -> str:
    """The state as a reader should see it: a pending token past its expiry is expired, swept or not (E5)."""
    if enrollment.state == EnrollmentState.PENDING and enrollment.expires_at <= now:
        return EnrollmentState.EXPIRED
    return enrollment.state


def list_all(state: str | None = None, limit: int = 200) -> list[Enrollment]:
    """Enrolments, newest first, optionally filtered by state."""
    query = sa.select(Enrollment).order_by(Enrollment.created_at.desc()).limit(limit)
    if state:
        query = query.where(Enrollment.state == state)
    return list(db.session.scalars(query))


def pending(now: datetime, limit: int = 200) -> list[Enrollment]:
    """Tokens a node can still claim (pending and unexpired), newest first."""
    query = (
        sa.select(Enrollment)
        .where(Enrollment.state == EnrollmentState.PENDING, Enrollment.expires_at > now)
        .order_by(Enrollment.created_at.desc())
        .limit(limit)
    )
    return list(db.session.scalars(query))


def finished(now: datetime, limit: int = 50) -> list[Enrollment]:
    """Tokens no node can claim any more (used, revoked, expired whether swept or not), newest first."""
    query = (
        sa.select(Enrollment)
        .where(sa.or_(Enrollment.state != EnrollmentState.PENDING, Enrollment.expires_at <= now))
        .order_by(Enrollment.created_at.desc())
        .limit(limit)
    )
    return list(db.session.scalars(query))


def sweep_expired(now: datetime | None = None) -> int:
    """E5: mark pending tokens past their expiry as expired; return how many changed.

    One conditional UPDATE … RETURNING: a second run at the same moment changes nothing,
    so each expiry is audited exactly once.
    """
    now = now or utcnow()
    expired_ids = db.session.scalars(
        sa.update(Enrollment)
        .where(Enrollment.state == EnrollmentState.PENDING, Enrollment.expires_at <= now)
        .values(state=EnrollmentState.EXPIRED)
        .returning(Enrollment.id)
        .execution_options(synchronize_session=False)
    ).all()
    for enrollment_id in expired_ids:
        audit.record(audit.SYSTEM, "enrollment.expired", enrollment_id=enrollment_id)
    db.session.commit()
    return len(expired_ids)


def _refusal(token_hash: str, origin: str, now: datetime) -> DomainError:
    """Explain why a claim's conditional UPDATE matched no row."""
    enrollment = db.session.scalar(sa.select(Enrollment).where(Enrollment.token_hash == token_hash))
    if enrollment is None:
        return DomainError(
            "ENROLLMENT_TOKEN_INVALID",
            "The enrolment token is not known to this control plane.",
            "Mint a new token in Console → Hardware → Enroll node and paste it exactly.",
        )
    state = effective_state(enrollment, now)
    if state == EnrollmentState.CONSUMED:
        return DomainError(
            "ENROLLMENT_TOKEN_CONSUMED",
            "The enrolment token has already been used by another node.",
            "Tokens are single use: mint a new one for this node.",
        )
    if state == EnrollmentState.REVOKED:
        return DomainError(
            "ENROLLMENT_TOKEN_REVOKED",
            "The enrolment token was revoked.",
            "Mint a new token for this node.",
        )
    if state == EnrollmentState.EXPIRED:
        return DomainError(
            "ENROLLMENT_TOKEN_EXPIRED",
            "The enrolment token has expired.",
            "Mint a new token with a longer expiry, and start the agent before it runs out.",
        )
    # Still pending and unexpired: only the origin can have kept the row from matching (E3).
    return DomainError(
        "API_ORIGIN_MISMATCH",
        f"This token was minted for {enrollment.api_origin}, but the agent used {origin}.",
        f"Set MODELFORGE_AGENT_CONTROL_PLANE_URL={enrollment.api_origin} on the node.",
        expected_origin=enrollment.api_origin,
    )


def _already_enrolled(node_id: str) -> DomainError:
    return DomainError(
        "NODE_ALREADY_ENROLLED",
        f"Node {node_id} already holds an active credential.",
        "Keep using the stored credential, or revoke it (POST "
        f"/api/v1/admin/nodes/{node_id}/credential/revoke) before enrolling this node again.",
    )


def _new_credential(node_id: str, enrollment_id: str, now: datetime) -> tuple[Credential, str]:
    """A fresh credential an enrolment's claim issues (not yet added), and its secret, shown once (I2)."""
    issued = tokens.issue(tokens.NODE_CREDENTIAL_PREFIX)
    credential = Credential(
        node_id=node_id,
        token_hash=issued.digest,
        prefix=issued.visible_prefix,
        created_at=now,
        enrollment_id=enrollment_id,
    )
    return credential, issued.secret


def _note_agent(lease: NodeLease, request: Claim, now: datetime) -> None:
    """What the claiming agent said of itself, on the node's lease."""
    lease.agent_version = request.agent_version
    lease.protocol_version = request.protocol_version
    lease.compatibility = request.compatibility
    lease.last_seen_at = now


def claim(request: Claim) -> ClaimResult:
    """Claim a token exactly once and give the node its credential (E2, E3, I4).

    One conditional UPDATE decides the winner: its row count, not timing and not a Python
    lock, so 60 concurrent claims across processes and replicas yield exactly one node.
    """
    now = utcnow()
    token_hash = tokens.digest(request.token)
    # E2: row count decides the winner. The token is checked before the node ID, so a bad token
    # gets the same answer whether or not that node ID exists: no enumerating node IDs.
    won = db.session.execute(
        sa.update(Enrollment)
        .where(
            Enrollment.token_hash == token_hash,
            Enrollment.state == EnrollmentState.PENDING,
            Enrollment.expires_at > now,
            Enrollment.api_origin == request.origin,
        )
        .values(state=EnrollmentState.CONSUMED, consumed_at=now)
        .execution_options(synchronize_session=False)
    ).rowcount
    if won != 1:
        reissued = _reissue(request, token_hash, now)
        if reissued is not None:
            return reissued
        refusal = _refusal(token_hash, request.origin, now)
        db.session.rollback()
        raise refusal
    active = db.session.scalar(
        sa.select(Credential.id).where(Credential.node_id == request.node_id, Credential.revoked_at.is_(None))
    )
    if active is not None:
        # I4: only a valid token learns the node is enrolled; the rollback leaves the token unspent.
        db.session.rollback()
        raise _already_enrolled(request.node_id)

    enrollment = db.session.scalar(sa.select(Enrollment).where(Enrollment.token_hash == token_hash))
    node = db.session.get(Node, request.node_id)
    returning = node is not None
    if node is None:
        node = Node(id=request.node_id, created_at=now)
        db.session.add(node)
    node.display_name = enrollment.display_name
    node.hostname = request.hostname
    node.role = enrollment.role
    node.labels = enrollment.labels or {}
    # V1: a node is production eligible only once validated (POST …/production-eligibility); an
    # enrolment's flag is the operator's request, recorded in the audit, never a bypass. A returning
    # node that was eligible loses it, audited like any other clearing.
    if returning:
        acceptance.clear_eligibility(node, ["re-enrolled"], audit.agent_actor(node.id))
    node.production_eligible = False
    node.lab_eligible = enrollment.lab_eligible
    node.benchmark_eligible = enrollment.benchmark_eligible
    node.enrolled_at = now
    credential, secret = _new_credential(request.node_id, enrollment.id, now)
    try:
        db.session.flush()  # the node row first: the credential's foreign key needs it
        db.session.add(credential)
        db.session.flush()
        enrollment.node_id = node.id
        lease = db.session.get(NodeLease, node.id)
        if lease is None:
            lease = NodeLease(node_id=node.id, status="pending")
            db.session.add(lease)
        _note_agent(lease, request, now)
        duplicates = db.session.scalar(
            sa.select(sa.func.count(Node.id)).where(Node.hostname == request.hostname, Node.id != node.id)
        )
        audit.record(
            audit.agent_actor(node.id),
            "node.enrolled",
            node.id,
            enrollment_id=enrollment.id,
            hostname=request.hostname,
            credential_id=credential.id,
            credential_prefix=credential.prefix,
            re_enrolled=returning,
            production_eligibility_requested=enrollment.production_eligible,
            hostname_shared_with_other_nodes=duplicates,
        )
        db.session.commit()
    except IntegrityError:
        # Another claim for the same node ID with a different token won the race (I4).
        db.session.rollback()
        raise _already_enrolled(request.node_id) from None
    return ClaimResult(node=node, enrollment=enrollment, credential_secret=secret)


def _reissue(request: Claim, token_hash: str, now: datetime) -> ClaimResult | None:
    """A claim retried after its reply was lost: the same token, the same node ID, the token
    still within its lifetime, and the credential that claim issued never presented. Revoke that
    credential and issue a fresh one; None (refused as before) in every other case.

    The credential's conditional UPDATE decides, as the token's does for a first claim: of two
    retries at once only one revokes the unused credential (on PostgreSQL the other waits on the
    row, re-checks it and matches nothing; SQLite runs them one after the other, so the second
    replaces the first's still-unused credential). The first authenticated call sets
    first_used_at under the same row lock (app.nodes.publishing.authenticate), so a retry after the
    credential was used matches nothing either. Revoke first, then insert, in one transaction:
    the one-active-credential index holds throughout.
    """
    enrollment = db.session.scalar(sa.select(Enrollment).where(Enrollment.token_hash == token_hash))
    if (
        enrollment is None
        or not tokens.same_digest(enrollment.token_hash, request.token)
        or enrollment.state != EnrollmentState.CONSUMED
        or enrollment.expires_at <= now
        or enrollment.api_origin != request.origin
        or enrollment.node_id is None
        or not hmac.compare_digest(enrollment.node_id.encode(), request.node_id.encode())
    ):
        return None
    revoked = db.session.execute(
        sa.update(Credential)
        .where(
            Credential.node_id == request.node_id,
            Credential.enrollment_id == enrollment.id,
            Credential.revoked_at.is_(None),
            Credential.first_used_at.is_(None),
        )
        .values(revoked_at=now, revoked_reason=REISSUED)
        .returning(Credential.id, Credential.prefix)
        .execution_options(synchronize_session=False)
    ).one_or_none()
    if revoked is None:
        return None
    credential, secret = _new_credential(request.node_id, enrollment.id, now)
    try:
        db.session.add(credential)
        db.session.flush()
    except IntegrityError:
        db.session.rollback()
        raise _already_enrolled(request.node_id) from None
    node = db.session.get(Node, request.node_id)
    lease = db.session.get(NodeLease, request.node_id)
    if lease is not None:
        _note_agent(lease, request, now)
    audit.record(
        audit.agent_actor(request.node_id),
        "credential.reissued",
        request.node_id,
        enrollment_id=enrollment.id,
        reason="the enrol reply was lost; the issued credential was never used",
        revoked_credential_id=revoked.id,
        revoked_credential_prefix=revoked.prefix,
        credential_id=credential.id,
        credential_prefix=credential.prefix,
    )
    db.session.commit()
    return ClaimResult(node=node, enrollment=enrollment, credential_secret=secret, reissued=True)
