"""Agent protocol compatibility (A1): one of four answers, each with an action."""

from __future__ import annotations

SUPPORTED_PROTOCOLS = (1,)
MAX_PROTOCOL_VERSION = 65_535

COMPATIBLE = "COMPATIBLE"
TOO_OLD = "TOO_OLD"
TOO_NEW = "TOO_NEW"
UNKNOWN = "UNKNOWN"

_ACTIONS = {
    COMPATIBLE: "None: the agent and the control plane speak the same protocol.",
    TOO_OLD: "Upgrade the node agent image to a release that speaks protocol "
    f"{max(SUPPORTED_PROTOCOLS)}, then recreate the container; its state volume keeps the identity.",
    TOO_NEW: f"Upgrade the control plane, or run a node agent release that speaks protocol {max(SUPPORTED_PROTOCOLS)}.",
    UNKNOWN: "The agent did not send a whole-number protocol_version; run an official node agent release.",
}


def answer_for(protocol_version: object) -> str:
    """Which of the four answers applies to what the agent sent."""
    # bool is an int in Python; `true` is not a protocol version.
    if not isinstance(protocol_version, int) or isinstance(protocol_version, bool):
        return UNKNOWN
    if not 0 <= protocol_version <= MAX_PROTOCOL_VERSION:
        return UNKNOWN  # not a version any agent could speak
    if protocol_version in SUPPORTED_PROTOCOLS:
        return COMPATIBLE
    return TOO_OLD if protocol_version < min(SUPPORTED_PROTOCOLS) else TOO_NEW


def compatibility(protocol_version: object, answer: str | None = None) -> dict[str, object]:
    """The `compatibility` object of the wire format (`answer` when already decided)."""
    answer = answer or answer_for(protocol_version)
    return {
        "answer": answer,
        "protocol_version": protocol_version,
        "supported": list(SUPPORTED_PROTOCOLS),
        "action": _ACTIONS[answer],
    }
