"""How a round's clients are cut into host calls: streamed parts, and balanced hosts."""

from __future__ import annotations

from mecsim.agents.algorithms import ClientTask

#: Clients per part of a streamed aggregation: the hosts train a part's clients, the
#: server folds their uploads while the hosts train the next part (at most
#: :data:`STREAM_PARTS_IN_FLIGHT` parts' uploads exist at once).
STREAM_PART_CLIENTS = 256


STREAM_PARTS_IN_FLIGHT = 2


def stream_parts(tasks: list[ClientTask], size: int | None = None) -> list[list[ClientTask]]:
    """The tasks in client-id order, cut into parts of ``size`` (default
    :data:`STREAM_PART_CLIENTS`)."""
    size = size or STREAM_PART_CLIENTS
    ordered = sorted(tasks, key=lambda t: t.client_id)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def balance_hosts(
    groups: dict[int, list[ClientTask]], work: dict[int, float], n_hosts: int
) -> dict[int, list[ClientTask]]:
    """Even out a host call's work: move a client from the busiest host to the least busy
    while that shortens the longer of the two (the client whose work is nearest half the
    gap, the lowest id among equals), so that a round with random participation does not
    wait for the host that happened to get most of the selected clients. ``work`` is a
    client's expected training steps (plus one for its fixed cost). Deterministic; each
    host's tasks in client-id order; hosts left without a task are not listed."""
    out = {h: sorted(groups.get(h, []), key=lambda t: t.client_id) for h in range(n_hosts)}
    load = {h: sum(work[t.client_id] for t in ts) for h, ts in out.items()}
    for _ in range(sum(len(ts) for ts in out.values())):
        hi = max(out, key=lambda h: (load[h], -h))
        lo = min(out, key=lambda h: (load[h], h))
        gap = load[hi] - load[lo]
        best = None
        for t in out[hi]:
            w = work[t.client_id]
            if 0 < w < gap and (
                best is None or abs(gap / 2 - w) < abs(gap / 2 - work[best.client_id])
            ):
                best = t
        if best is None:
            break
        w = work[best.client_id]
        out[hi].remove(best)
        out[lo].append(best)
        out[lo].sort(key=lambda t: t.client_id)
        load[hi] -= w
        load[lo] += w
    return {h: ts for h, ts in out.items() if ts}
