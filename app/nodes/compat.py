"""Protocol compatibility (A1, W1): one of four answers, each with an action, for the agent and the worker.

The node agent talks to the control plane; the runtime worker talks to the agent, which reports the
worker's own protocol version in its inventory. Each party has its own supported versions, and
the one table below says what the operator does about each answer for each party.
"""

from __future__ import annotations

AGENT = "agent"
RUNTIME_WORKER = "runtime_worker"

SUPPORTED_PROTOCOLS = (1,)
SUPPORTED_WORKER_PROTOCOLS = (1,)
_SUPPORTED = {AGENT: SUPPORTED_PROTOCOLS, RUNTIME_WORKER: SUPPORTED_WORKER_PROTOCOLS}
MAX_PROTOCOL_VERSION = 65_535

COMPATIBLE = "COMPATIBLE"
TOO_OLD = "TOO_OLD"
TOO_NEW = "TOO_NEW"
UNKNOWN = "UNKNOWN"
ANSWERS = (COMPATIBLE, TOO_OLD, TOO_NEW, UNKNOWN)

_AGENT_PROTOCOL = max(SUPPORTED_PROTOCOLS)
_WORKER_PROTOCOL = max(SUPPORTED_WORKER_PROTOCOLS)
_ACTIONS = {
    (AGENT, COMPATIBLE): "None: the agent and the control plane speak the same protocol.",
    (AGENT, TOO_OLD): "Upgrade the node agent image to a release that speaks protocol "
    f"{_AGENT_PROTOCOL}, then recreate the container; its state volume keeps the identity.",
    (AGENT, TOO_NEW): f"Upgrade the control plane, or run a node agent release that speaks protocol {_AGENT_PROTOCOL}.",
    (AGENT, UNKNOWN): "The agent did not send a whole-number protocol_version; run an official node agent release.",
    (RUNTIME_WORKER, COMPATIBLE): "None: the runtime worker speaks the worker protocol this control plane hands "
    "runtime jobs to.",
    (RUNTIME_WORKER, TOO_OLD): "Upgrade the runtime worker image to a release that speaks worker protocol "
    f"{_WORKER_PROTOCOL} and recreate its container; until then the node gets no runtime jobs.",
    (RUNTIME_WORKER, TOO_NEW): "Upgrade the control plane, or run a runtime worker release that speaks worker "
    f"protocol {_WORKER_PROTOCOL}; until then the node gets no runtime jobs.",
    (RUNTIME_WORKER, UNKNOWN): "The runtime worker did not report a whole-number protocol_version; run an "
    "official runtime worker release. Until then the node gets no runtime jobs.",
}


def answer_for(protocol_version: object, party: str = AGENT) -> str:
    """Which of the four answers applies to what the agent (or its worker) sent."""
    # bool is an int in Python; `true` is not a protocol version.
    if not isinstance(protocol_version, int) or isinstance(protocol_version, bool):
        return UNKNOWN
    if not 0 <= protocol_version <= MAX_PROTOCOL_VERSION:
        return UNKNOWN  # not a version any agent could speak
    supported = _SUPPORTED[party]
    if protocol_version in supported:
        return COMPATIBLE
    return TOO_OLD if protocol_version < min(supported) else TOO_NEW


def compatibility(protocol_version: object, answer: str | None = None, party: str = AGENT) -> dict[str, object]:
    """The `compatibility` object of the wire format (`answer` when already decided)."""
    answer = answer if answer in ANSWERS else answer_for(protocol_version, party)
    return {
        "answer": answer,
        "protocol_version": protocol_version,
        "supported": list(_SUPPORTED[party]),
        "action": _ACTIONS[party, answer],
    }


def worker_compatibility(protocol_version: object, answer: str | None = None) -> dict[str, object]:
    """W1: the same object for the runtime worker's own protocol version."""
    return compatibility(protocol_version, answer, RUNTIME_WORKER)
