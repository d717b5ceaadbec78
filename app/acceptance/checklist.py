"""V1: the acceptance checklist of a node, its verdict, and the production_eligible flag it gates.

Every item is gathered by the control plane itself where it can be: GPU facts from the agent's
inventory, the node API output from the control plane's own read-back, the restart identity when an
agent restarts, the recovery from the audit trail, the smoke test from the jobs; only the container
status (pasted) and screenshots (uploaded) come from the operator. A node is validated only when
every item is observed and none is contradicted; nothing is a pass by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa

from app import audit, nodes
from app.acceptance import gpu_facts, secrets_scan
from app.errors import DomainError
from app.extensions import db
from app.jobs import runtime
from app.models import (
    AcceptanceEvidence,
    AcceptanceScreenshot,
    AuditEvent,
    Gpu,
    Job,
    JobState,
    Node,
    NodeInventory,
)
from app.timeutil import isoformat, parse_rfc3339, utcnow

MISSING, OBSERVED, CONTRADICTED = "missing", "observed", "contradicted"
STATES = (MISSING, OBSERVED, CONTRADICTED)

GPU_FACTS = "gpu_facts"
CONTAINER_STATUS = "container_status"
NODE_API_OUTPUT = "node_api_output"
RESTART_IDENTITY = "restart_identity"
RECOVERY = "recovery"
RUNTIME_SMOKE_TEST = "runtime_smoke_test"
SCREENSHOTS = "screenshots"

# The checklist, in the order it is shown (spec V1); names are part of the API.
ITEMS: tuple[tuple[str, str], ...] = (
    (GPU_FACTS, "GPU facts (nvidia-smi vs NVML)"),
    (CONTAINER_STATUS, "Node-agent container status"),
    (NODE_API_OUTPUT, "Node API output"),
    (RESTART_IDENTITY, "Restart identity"),
    (RECOVERY, "Stale → offline → recovery"),
    (RUNTIME_SMOKE_TEST, "Runtime smoke test"),
    (SCREENSHOTS, "UI screenshots"),
)
TITLES = dict(ITEMS)
# Items kept as rows (acceptance_evidence): what cannot be read back later from elsewhere.
STORED_ITEMS = (CONTAINER_STATUS, NODE_API_OUTPUT, RESTART_IDENTITY)
# The audit actions the recovery item reads, in the order they must happen (L1).
RECOVERY_ACTIONS = ("node.stale", "node.offline", "node.returned")
SMOKE_TEXT_SHOWN = 2000

ELIGIBILITY_CHANGED = "node.production_eligibility_changed"
ELIGIBILITY_CLEARED = "node.production_eligibility_cleared"
EVIDENCE_RECORDED = "node.acceptance_recorded"


@dataclass
class Item:
    """One checklist item: its state, when and how it was observed, one sentence, and the evidence."""

    name: str
    title: str
    state: str
    observed_at: datetime | None
    source: str
    detail: str
    evidence: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """The item as the API shows it."""
        return {
            "name": self.name,
            "title": self.title,
            "state": self.state,
            "observed_at": isoformat(self.observed_at),
            "source": self.source,
            "detail": self.detail,
            "evidence": self.evidence,
        }


@dataclass
class Checklist:
    """A node's checklist and verdict: validated only when every item is observed."""

    node_id: str
    validated: bool
    production_eligible: bool
    items: list[Item]

    @property
    def missing(self) -> list[str]:
        """The names of the items not observed (missing or contradicted), in checklist order."""
        return [item.name for item in self.items if item.state != OBSERVED]

    def item(self, name: str) -> Item:
        """The item of that name."""
        return next(item for item in self.items if item.name == name)

    def to_dict(self) -> dict[str, object]:
        """The API shape of GET /api/v1/admin/nodes/{id}/acceptance."""
        return {
            "node_id": self.node_id,
            "validated": self.validated,
            "production_eligible": self.production_eligible,
            "items": [item.to_dict() for item in self.items],
        }


@dataclass
class _Gathered:
    """What the control plane holds about one node that the checklist reads."""

    node: Node
    inventory: NodeInventory | None = None
    gpus: list[Gpu] = field(default_factory=list)
    stored: dict[str, AcceptanceEvidence] = field(default_factory=dict)
    transitions: list[tuple[int, str, datetime]] = field(default_factory=list)
    smoke: Job | None = None
    screenshots: list[AcceptanceScreenshot] = field(default_factory=list)


_evidence = AcceptanceEvidence.__table__


def _gather(node_ids: list[str], verdict_only: bool = False) -> dict[str, _Gathered]:
    """Everything the checklists of these nodes read, in seven queries however many nodes there are.

    `verdict_only` (the nodes list) leaves out what only the evidence needs: the stored items'
    documents (a node's read-back is kilobytes) and the smoke test's texts.
    """
    if not node_ids:
        return {}
    found = {node.id: _Gathered(node) for node in db.session.scalars(sa.select(Node).where(Node.id.in_(node_ids)))}
    ids = list(found)
    if not ids:
        return {}
    for inventory in db.session.scalars(sa.select(NodeInventory).where(NodeInventory.node_id.in_(ids))):
        found[inventory.node_id].inventory = inventory
    for gpu in db.session.scalars(
        sa.select(Gpu).where(Gpu.node_id.in_(ids), Gpu.present.is_(True)).order_by(Gpu.pci_bus_id, Gpu.uuid)
    ):
        found[gpu.node_id].gpus.append(gpu)
    if verdict_only:
        evidence = _evidence.c
        for row in db.session.execute(
            sa.select(evidence.node_id, evidence.item, evidence.state, evidence.observed_at, evidence.source).where(
                evidence.node_id.in_(ids)
            )
        ):
            found[row.node_id].stored[row.item] = AcceptanceEvidence(**row._asdict(), detail="", evidence={})
    else:
        for row in db.session.scalars(sa.select(AcceptanceEvidence).where(AcceptanceEvidence.node_id.in_(ids))):
            found[row.node_id].stored[row.item] = row
    for node_id, event_id, action, at in db.session.execute(
        sa.select(AuditEvent.node_id, AuditEvent.id, AuditEvent.action, AuditEvent.at)
        .where(AuditEvent.node_id.in_(ids), AuditEvent.action.in_(RECOVERY_ACTIONS))
        .order_by(AuditEvent.id)
    ):
        found[node_id].transitions.append((event_id, action, at))
    succeeded = (Job.type == runtime.GENERATE, Job.state == JobState.SUCCEEDED, Job.node_id.in_(ids))
    latest = (
        sa.select(Job.node_id, sa.func.max(Job.finished_at).label("finished_at"))
        .where(*succeeded)
        .group_by(Job.node_id)
        .subquery()
    )
    columns = (Job.id, Job.node_id, Job.finished_at) if verdict_only else (Job,)
    for row in db.session.execute(
        sa.select(*columns)
        .join(latest, sa.and_(Job.node_id == latest.c.node_id, Job.finished_at == latest.c.finished_at))
        .where(*succeeded)
    ):
        job = Job(**row._asdict(), params={}, result=None) if verdict_only else row.Job
        found[job.node_id].smoke = found[job.node_id].smoke or job
    for shot in db.session.scalars(
        sa.select(AcceptanceScreenshot).where(AcceptanceScreenshot.node_id.in_(ids)).order_by(AcceptanceScreenshot.id)
    ):
        found[shot.node_id].screenshots.append(shot)
    return found


# --------------------------------------------------------------------------- the items


def _gpu_facts(gathered: _Gathered) -> Item:
    """nvidia-smi's GPUs (relayed by the agent) against NVML's, from the same inventory."""
    name, title = GPU_FACTS, TITLES[GPU_FACTS]
    inventory = gathered.inventory
    if inventory is None:
        return Item(name, title, MISSING, None, "agent inventory", "No inventory from this node yet; start its agent.")
    facts = inventory.facts if isinstance(inventory.facts, dict) else {}
    smi = facts.get("nvidia_smi")
    nvml = [gpu.to_dict() for gpu in gathered.gpus]
    evidence: dict[str, object] = {"query": gpu_facts.NVIDIA_SMI_QUERY, "nvml": nvml}
    if not isinstance(smi, dict):
        return Item(
            name,
            title,
            MISSING,
            None,
            "agent inventory",
            "The agent did not report nvidia-smi output; run an agent version that does (this control plane's).",
            evidence,
        )
    output, problem = smi.get("output"), smi.get("problem")
    evidence |= {"output": output, "problem": problem, "exit_status": smi.get("exit_status")}
    if not isinstance(output, str):
        return Item(
            name,
            title,
            MISSING,
            None,
            "agent inventory",
            f"nvidia-smi could not be run on the node ({problem or 'no reason given'}); make it available "
            "(the NVIDIA container toolkit injects it) and restart the agent.",
            evidence,
        )
    observed_at = inventory.received_at
    try:
        parsed = gpu_facts.parse(output)
    except gpu_facts.UnreadableOutput as error:
        return Item(
            name,
            title,
            CONTRADICTED,
            observed_at,
            "agent inventory",
            f"nvidia-smi printed something other than the queried CSV ({error}).",
            evidence,
        )
    evidence["nvidia_smi"] = [gpu.to_dict() for gpu in parsed]
    if not parsed and not nvml:
        return Item(
            name,
            title,
            MISSING,
            None,
            "agent inventory",
            "nvidia-smi and NVML report no GPU: nothing to compare.",
            evidence,
        )
    problems = gpu_facts.compare(parsed, nvml)
    evidence["mismatches"] = problems
    if problems:
        shown = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
        return Item(
            name,
            title,
            CONTRADICTED,
            observed_at,
            "agent inventory",
            f"nvidia-smi and NVML disagree: {shown}.",
            evidence,
        )
    models = sorted({gpu.name for gpu in parsed})
    drivers = sorted({gpu.driver_version for gpu in parsed})
    return Item(
        name,
        title,
        OBSERVED,
        observed_at,
        "agent inventory",
        f"nvidia-smi and NVML agree on {len(parsed)} GPU(s) by UUID: {', '.join(models)}, driver {', '.join(drivers)}.",
        evidence,
    )


def _stored(gathered: _Gathered, name: str, missing_detail: str, source: str) -> Item:
    """An item kept as a row: as it was recorded, or missing with how to get it."""
    row = gathered.stored.get(name)
    if row is None:
        return Item(name, TITLES[name], MISSING, None, source, missing_detail)
    return Item(name, TITLES[name], row.state, row.observed_at, row.source, row.detail, row.evidence or {})


def _recovery(gathered: _Gathered) -> Item:
    """The latest stale → offline → returned sequence in this node's audit trail.

    A node silent past both limits between two sweeps is audited offline straight from online (L1):
    it was stale on the way, unrecorded, so that sequence counts too and says so.
    """
    name, title = RECOVERY, TITLES[RECOVERY]
    stale = offline = None
    complete = None
    for event in gathered.transitions:
        _, action, _ = event
        if action == "node.stale":
            stale, offline = event, None
        elif action == "node.offline":
            offline = event
        elif action == "node.returned":
            if offline is not None:
                complete = (stale, offline, event)
            stale = offline = None
    if complete is None:
        seen = " (seen so far: stale" + (", offline" if offline else "") + ")" if stale is not None else ""
        return Item(
            name,
            title,
            MISSING,
            None,
            "audit trail",
            "No stale → offline → returned sequence in the audit trail yet" + seen + ": stop the node's agent "
            "until the node shows offline, then start it again.",
        )
    times = [None if event is None else isoformat(event[2]) for event in complete]
    went_stale = (
        f"went stale at {times[0]}"
        if times[0]
        else "went stale (between two sweeps, so unrecorded: it was swept offline straight from online)"
    )
    return Item(
        name,
        title,
        OBSERVED,
        complete[2][2],
        "audit trail",
        f"The node {went_stale}, offline at {times[1]} and returned at {times[2]}.",
        {
            "stale_at": times[0],
            "offline_at": times[1],
            "returned_at": times[2],
            "audit_event_ids": [event[0] for event in complete if event is not None],
        },
    )


def _smoke_test(gathered: _Gathered) -> Item:
    """The node's latest succeeded runtime.generate.v1."""
    name, title = RUNTIME_SMOKE_TEST, TITLES[RUNTIME_SMOKE_TEST]
    job = gathered.smoke
    if job is None:
        return Item(
            name,
            title,
            MISSING,
            None,
            "jobs",
            "No succeeded runtime.generate.v1 job on this node: run a smoke test from the node page.",
        )
    shown = runtime.smoke_test(job)
    outputs = [
        {"prompt": output["prompt"], "text": (output["text"] or "")[:SMOKE_TEXT_SHOWN]} for output in shown["outputs"]
    ]
    first = (outputs[0]["text"] or "").strip().replace("\n", " ") if outputs else ""
    return Item(
        name,
        title,
        OBSERVED,
        job.finished_at,
        f"job {job.id}",
        f"runtime.generate.v1 succeeded with {shown.get('model_file') or 'a model'}: “{first[:120]}”.",
        {"job_id": job.id, "model_file": shown.get("model_file"), "engine": shown.get("engine"), "outputs": outputs},
    )


def _screenshots(gathered: _Gathered) -> Item:
    """At least one uploaded screenshot."""
    from app.acceptance.uploads import MAX_SCREENSHOT_BYTES

    name, title = SCREENSHOTS, TITLES[SCREENSHOTS]
    shots = gathered.screenshots
    if not shots:
        return Item(
            name,
            title,
            MISSING,
            None,
            "upload",
            f"No screenshot uploaded: upload PNG or JPEG screenshots of the console (at most "
            f"{MAX_SCREENSHOT_BYTES // 2**20} MiB each).",
        )
    return Item(
        name,
        title,
        OBSERVED,
        max(shot.uploaded_at for shot in shots),
        "upload",
        f"{len(shots)} screenshot(s) uploaded.",
        {"screenshots": [shot.to_dict() for shot in shots]},
    )


def _items(gathered: _Gathered) -> list[Item]:
    """Every item of one node, in ITEMS order."""
    from app.acceptance.container import inspect_command

    items = [
        _gpu_facts(gathered),
        _stored(
            gathered,
            CONTAINER_STATUS,
            f"Not pasted yet: run `{inspect_command(gathered.node.id)}` on the node's host and paste its output.",
            "operator paste",
        ),
        _stored(
            gathered,
            NODE_API_OUTPUT,
            "Not captured yet: the control plane captures its own read-back of this node at the node's next "
            "inventory (restart the agent to send one now).",
            "control plane read-back",
        ),
        _stored(
            gathered,
            RESTART_IDENTITY,
            "No agent restart seen yet: restart the node-agent container; its next inventory records the node ID "
            "and GPU UUIDs before and after.",
            "agent inventory",
        ),
        _recovery(gathered),
        _smoke_test(gathered),
        _screenshots(gathered),
    ]
    assert tuple(item.name for item in items) == tuple(name for name, _ in ITEMS)
    return items


def _checklist(gathered: _Gathered) -> Checklist:
    items = _items(gathered)
    return Checklist(
        node_id=gathered.node.id,
        validated=all(item.state == OBSERVED for item in items),
        production_eligible=gathered.node.production_eligible,
        items=items,
    )


def evaluate(node_id: str) -> Checklist:
    """The node's checklist as of now; NODE_NOT_FOUND for an unknown node."""
    gathered = _gather([node_id]).get(node_id)
    if gathered is None:
        nodes.get(node_id)  # raises NODE_NOT_FOUND
    return _checklist(gathered)


def verdicts(node_ids: list[str]) -> dict[str, bool]:
    """Whether each of these nodes is validated (for the nodes list), in a fixed number of queries.

    Only a node whose stored items are all observed and that has a screenshot can be validated, so
    one indexed query narrows the list first and the audit trail and jobs are read for those alone:
    the nodes list at 1,000 nodes and 200,000 audit events went from about 980 ms to 56 ms.
    """
    evidence = AcceptanceEvidence
    complete = (
        sa.select(evidence.node_id)
        .where(
            evidence.node_id.in_(node_ids),
            evidence.state == OBSERVED,
            evidence.item.in_(STORED_ITEMS),
            evidence.node_id.in_(sa.select(AcceptanceScreenshot.node_id)),
        )
        .group_by(evidence.node_id)
        .having(sa.func.count() == len(STORED_ITEMS))
    )
    gathered = _gather(list(db.session.scalars(complete)), verdict_only=True)
    return {node_id: _checklist(found).validated if (found := gathered.get(node_id)) else False for node_id in node_ids}


# --------------------------------------------------------------------------- recording


def store(node_id: str, item: Item, actor: str) -> None:
    """Keep a stored item's latest observation (the caller commits); an operator's is audited, without its evidence."""
    row = db.session.scalar(
        sa.select(AcceptanceEvidence).where(AcceptanceEvidence.node_id == node_id, AcceptanceEvidence.item == item.name)
    )
    previous = None if row is None else row.state
    if row is None:
        row = AcceptanceEvidence(node_id=node_id, item=item.name)
        db.session.add(row)
    row.state = item.state
    row.observed_at = item.observed_at or utcnow()
    row.source = item.source[:100]
    row.detail = item.detail[:1000]
    row.evidence = item.evidence
    # P4: what an operator gives (a paste) is audited; what the control plane records from inventories
    # is not — its row says when and how — so an agent flipping its GPUs cannot flood the log (issue 15).
    if actor != audit.SYSTEM and not actor.startswith(audit.agent_actor("")):
        audit.record(actor, EVIDENCE_RECORDED, node_id, item=item.name, state=item.state, previous=previous)


def capture_node_api_output(node_id: str) -> Item:
    """Store the control plane's own read-back of the node (GET /api/v1/hardware/nodes/{id}), checked for secrets.

    Anything secret-looking is removed before storing and makes the item contradicted, naming where it was.
    """
    from app.config import current_settings

    described = nodes.describe([node_id], current_settings())
    if not described:
        nodes.get(node_id)
    document, findings = secrets_scan.scrub_evidence(described[0], node_id)
    now = utcnow()
    if findings:
        item = Item(
            NODE_API_OUTPUT,
            TITLES[NODE_API_OUTPUT],
            CONTRADICTED,
            now,
            "control plane read-back",
            "The node's read-back carried something secret-looking (removed before storing): "
            + ", ".join(findings[:5])
            + ".",
            {"path": f"/api/v1/hardware/nodes/{node_id}", "findings": findings, "read_back": document},
        )
    else:
        item = Item(
            NODE_API_OUTPUT,
            TITLES[NODE_API_OUTPUT],
            OBSERVED,
            now,
            "control plane read-back",
            f"Captured GET /api/v1/hardware/nodes/{node_id} at {isoformat(now)}; it carries no credential, hash, "
            "token or key.",
            {"path": f"/api/v1/hardware/nodes/{node_id}", "findings": [], "read_back": document},
        )
    store(node_id, item, audit.SYSTEM)
    return item


def _agent_start(facts: object) -> tuple[str | None, str | None]:
    """The agent's start id and start time in an inventory's facts, or (None, None)."""
    agent = facts.get("agent") if isinstance(facts, dict) else None
    if not isinstance(agent, dict):
        return None, None
    start_id, started_at = agent.get("start_id"), agent.get("started_at")
    return (start_id if isinstance(start_id, str) else None, started_at if isinstance(started_at, str) else None)


def after_inventory(
    node: Node, previous_facts: object, facts: dict[str, object], gpus_before: list[str], gpus_after: list[str]
) -> None:
    """V1 at each inventory (the caller commits): restart identity, the read-back, and a contradiction's verdict.

    Called by app.nodes.publishing.record_inventory, never on the heartbeat's path.
    """
    before_id, before_at = _agent_start(previous_facts)
    after_id, after_at = _agent_start(facts)
    actor = audit.agent_actor(node.id)
    restart_contradicted = False
    if before_id and after_id and before_id != after_id:
        same = sorted(gpus_before) == sorted(gpus_after)
        restart_contradicted = not same
        started = parse_rfc3339(after_at) if after_at else None
        store(
            node.id,
            Item(
                RESTART_IDENTITY,
                TITLES[RESTART_IDENTITY],
                OBSERVED if same else CONTRADICTED,
                started or utcnow(),
                "agent inventory",
                (
                    f"The agent restarted (start {after_id[:8]}); node ID {node.id} and its {len(gpus_after)} GPU "
                    "UUID(s) are the same before and after."
                    if same
                    else f"The agent restarted (start {after_id[:8]}) and the GPU UUIDs differ: before "
                    f"{', '.join(sorted(gpus_before)) or 'none'}, after {', '.join(sorted(gpus_after)) or 'none'}."
                ),
                {
                    "before": {
                        "node_id": node.id,
                        "start_id": before_id,
                        "started_at": before_at,
                        "gpu_uuids": sorted(gpus_before),
                    },
                    "after": {
                        "node_id": node.id,
                        "start_id": after_id,
                        "started_at": after_at,
                        "gpu_uuids": sorted(gpus_after),
                    },
                },
            ),
            actor,
        )
    elif gpus_before and sorted(gpus_before) != sorted(gpus_after):
        # The GPUs changed under a running agent: the identity observed before no longer holds
        # until a restart shows the node ID and the new GPU UUIDs stay put.
        restart_contradicted = True
        store(
            node.id,
            Item(
                RESTART_IDENTITY,
                TITLES[RESTART_IDENTITY],
                CONTRADICTED,
                utcnow(),
                "agent inventory",
                f"The node's GPU UUIDs changed without a restart: before {', '.join(sorted(gpus_before))}, after "
                f"{', '.join(sorted(gpus_after)) or 'none'}; restart the agent to record its identity again.",
                {
                    "before": {"node_id": node.id, "start_id": before_id, "gpu_uuids": sorted(gpus_before)},
                    "after": {"node_id": node.id, "start_id": after_id, "gpu_uuids": sorted(gpus_after)},
                },
            ),
            actor,
        )
    capture_node_api_output(node.id)
    reasons = []
    if sorted(gpus_before) != sorted(gpus_after):
        reasons.append("GPU UUIDs changed")
    if restart_contradicted:
        reasons.append("restart identity differs")
    recheck(node, actor, reasons)


def recheck(node: Node, actor: str, reasons: list[str] = ()) -> None:
    """V1's rule, after evidence is recorded (the caller commits): a node no longer validated is not eligible.

    Every recording path (an inventory, a paste, an upload) calls this once, last, with the node it
    locked: whichever item regressed — contradicted, or gone back to missing (nvidia-smi lost after a
    restart) — production_eligible goes false, audited with `reasons` and every item not observed.
    """
    if not node.production_eligible:
        return
    db.session.flush()
    checklist = evaluate(node.id)
    if not checklist.validated:
        found = [f"{item.name} {item.state}" for item in checklist.items if item.state != OBSERVED]
        clear_eligibility(node, sorted({*reasons, *found}), actor)


def clear_eligibility(node: Node, reasons: list[str], actor: str) -> None:
    """production_eligible goes false, audited with why (caller commits); nothing when it already is."""
    if node.production_eligible:
        node.production_eligible = False
        audit.record(actor, ELIGIBILITY_CLEARED, node.id, reasons=reasons)


def lock_node(node_id: str) -> Node:
    """The node, locked until commit (PostgreSQL) and read afresh, so writes to its evidence queue up.

    Every path that records evidence or sets the flag takes this first (an inventory too:
    app.nodes.publishing.record_inventory); populate_existing replaces a copy read earlier in the request.
    """
    node = db.session.scalar(
        sa.select(Node).where(Node.id == node_id).with_for_update().execution_options(populate_existing=True)
    )
    if node is None:
        nodes.get(node_id)  # raises NODE_NOT_FOUND
    return node


def set_production_eligible(node_id: str, value: bool, actor: str) -> Checklist:
    """Set or clear production_eligible; true only on a validated node (409 NODE_NOT_VALIDATED naming why)."""
    node = lock_node(node_id)
    checklist = evaluate(node_id)
    if value and not checklist.validated:
        missing = [item.name for item in checklist.items if item.state == MISSING]
        contradicted = [item.name for item in checklist.items if item.state == CONTRADICTED]
        said = []
        if missing:
            said.append("missing: " + ", ".join(missing))
        if contradicted:
            said.append("contradicted: " + ", ".join(contradicted))
        db.session.rollback()
        raise DomainError(
            "NODE_NOT_VALIDATED",
            f"Node {node_id} is not validated ({'; '.join(said)}), so it cannot be production eligible.",
            "Gather the missing acceptance evidence (GET /api/v1/admin/nodes/{id}/acceptance says how for each item).",
            missing=missing,
            contradicted=contradicted,
        )
    if node.production_eligible != value:
        node.production_eligible = value
        details: dict[str, object] = {"old": not value, "new": value}
        if value:
            # What was validated: a later inventory with other GPUs clears the flag (after_inventory).
            details["gpu_uuids"] = sorted(
                str(gpu["uuid"]) for gpu in checklist.item(GPU_FACTS).evidence.get("nvml", [])
            )
        audit.record(actor, ELIGIBILITY_CHANGED, node_id, **details)
    db.session.commit()
    checklist.production_eligible = value
    return checklist
