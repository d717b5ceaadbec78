"""V1 GPU facts: what `nvidia-smi` printed on the node, compared with what NVML reported.

The agent runs NVIDIA_SMI_QUERY and relays its raw output (or why it could not) in its inventory;
this module reads that output and compares it with the GPU rows the same inventory wrote. Only an
exact agreement is an observation: nvidia-smi missing, unreadable or disagreeing is never a pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app import rules

# The query the agent runs (agent/modelforge_node_agent.py NVIDIA_SMI_ARGS says the same).
NVIDIA_SMI_QUERY = "nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader"
MIB = 2**20
# nvidia-smi prints whole MiB, NVML gives bytes: they agree when they are within one MiB.
MEMORY_TOLERANCE_MIB = 1
_MEMORY = re.compile(r"(\S+)\s*MiB")
# nvidia-smi's word for a value the GPU does not report ("[N/A]", "[Not Supported]"): unknown, not unreadable.
_NOT_REPORTED = re.compile(r"\[[A-Za-z /]{1,40}\]")
SHOWN = 40  # how much of an unreadable field a message quotes


class UnreadableOutput(ValueError):
    """nvidia-smi printed something that is not the queried CSV."""


@dataclass(frozen=True)
class SmiGpu:
    """One line of the query's output."""

    name: str
    uuid: str
    driver_version: str
    memory_total_mib: int | None

    def to_dict(self) -> dict[str, object]:
        """The line as evidence."""
        return {
            "name": self.name,
            "uuid": self.uuid,
            "driver_version": self.driver_version,
            "memory_total_mib": self.memory_total_mib,
        }


def parse(output: str) -> list[SmiGpu]:
    """The GPUs in NVIDIA_SMI_QUERY's output; UnreadableOutput names the first bad line."""
    gpus = []
    for number, line in enumerate(output.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 4:
            raise UnreadableOutput(f"line {number} has {len(fields)} fields, not name, uuid, driver, memory")
        name, uuid, driver, memory = fields
        if not uuid.startswith(("GPU-", "MIG-")):
            raise UnreadableOutput(f"line {number} has no GPU UUID")
        gpus.append(SmiGpu(name, uuid, driver, _memory_mib(memory, number)))
    return gpus


def _memory_mib(field: str, number: int) -> int | None:
    """memory.total in MiB, None when nvidia-smi says it does not know; UnreadableOutput for anything else.

    P5: the digits are read through rules.whole_number, bounded by the largest byte count a node may
    report (rules.MAX_BYTES), so 4,301 of them are an unreadable line, not a ValueError from int().
    """
    if _NOT_REPORTED.fullmatch(field):
        return None
    found = _MEMORY.fullmatch(field)
    mib = rules.whole_number(found[1], maximum=rules.MAX_BYTES // MIB) if found else None
    if mib is None:
        more = f"… ({len(field)} characters)" if len(field) > SHOWN else ""
        raise UnreadableOutput(f"line {number}'s total memory {field[:SHOWN]!r}{more} is not a whole number of MiB")
    return mib


def compare(smi: list[SmiGpu], nvml: list[dict[str, object]]) -> list[str]:
    """Every disagreement between nvidia-smi's GPUs and NVML's (uuid, name, driver, memory); [] when equal."""
    problems = []
    by_uuid = {gpu.uuid: gpu for gpu in smi}
    nvml_by_uuid = {str(gpu["uuid"]): gpu for gpu in nvml}
    for uuid in sorted(set(nvml_by_uuid) - set(by_uuid)):
        problems.append(f"NVML reports {uuid}, nvidia-smi does not")
    for uuid in sorted(set(by_uuid) - set(nvml_by_uuid)):
        problems.append(f"nvidia-smi reports {uuid}, NVML does not")
    for uuid in sorted(set(by_uuid) & set(nvml_by_uuid)):
        seen, reported = by_uuid[uuid], nvml_by_uuid[uuid]
        if seen.name != reported.get("name"):
            problems.append(f"{uuid}: nvidia-smi names it {seen.name!r}, NVML {reported.get('name')!r}")
        if seen.driver_version != reported.get("driver_version"):
            problems.append(
                f"{uuid}: driver {seen.driver_version!r} in nvidia-smi, {reported.get('driver_version')!r} in NVML"
            )
        total = reported.get("memory_total_bytes")
        nvml_mib = total // MIB if isinstance(total, int) else None
        if seen.memory_total_mib is None or nvml_mib is None:
            problems.append(f"{uuid}: total memory unknown to nvidia-smi or NVML")
        elif abs(seen.memory_total_mib - nvml_mib) > MEMORY_TOLERANCE_MIB:
            problems.append(f"{uuid}: {seen.memory_total_mib} MiB in nvidia-smi, {nvml_mib} MiB in NVML")
    return problems
