"""How many full-rank members the population engine (`esgrpo.engines.population`) prepares and runs at once.

Pure arithmetic, no torch: the job planner (`esgrpo.plan.memory`) reads it at DAG-parse time. Above
`GROUP_BYTES` of prepared member weights the members run in groups: decoding streams every member's
weights once per step whatever the grouping (memory-bound at the sizes where groups start), so grouping
bounds the memory at the cost of one more prompt pass and decode loop per group.
"""

from __future__ import annotations

GROUP_BYTES = 4 * 2**30


def member_group_size(members: int, member_bytes: int) -> int:
    """Members per group: all of them within `GROUP_BYTES`; else groups as equal as an even size allows
    (antithetic partners, adjacent members, stay together)."""
    need = members * member_bytes
    if need <= GROUP_BYTES:
        return members
    count = -(-need // GROUP_BYTES)
    size = -(-members // count)
    return min(members, size + size % 2)
