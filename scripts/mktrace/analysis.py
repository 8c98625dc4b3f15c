"""Checks and numbers over the traces of all ranks of one call."""
import collections

from .fmt import COMM_ROLES, COMPUTE_ROLES


RING_ATTN_BWD = 7  # fmt.OPS: its tiles are key tiles, their spans hold the consumers' waits


def arrival_events(traces):
    """{(rank, flag): the chunk event whose end announced the data behind `flag` on `rank`}:
    a comm-send chunk of another rank aimed at it (peer = rank), or a comm-recv chunk the rank
    pulled itself. Several chunks behind one flag (one per comm CTA): the one that raised the
    flag (expected != 0) if recorded, else any; of those, the one that ended last."""
    best = {}
    for t in traces:
        for e in t.events:
            if e.kind != "chunk" or e.dur == 0xFFFFFFFF:
                continue
            if e.role == "comm-send" and e.peer >= 0:
                key = (e.peer, e.flag)
            elif e.role == "comm-recv":
                key = (t.rank, e.flag)
            else:
                continue
            score = (e.expected != 0, e.end)
            if key not in best or score > best[key][0]:
                best[key] = (score, e)
    return {k: e for k, (_, e) in best.items()}


def arrivals(traces):
    """{(rank, flag): ns} when the data behind `flag` on `rank` arrived (arrival_events' end)."""
    return {k: e.end for k, e in arrival_events(traces).items()}


def first_uses(traces, arr=None):
    """{(rank, flag): the first tile on `rank` that used the arrived data behind `flag`}.
    Consumer tile events (flag = the A row-block the tile used: what real traces hold); a flag
    no consumer tile names falls back to producer tile events (older and synthetic traces)."""
    arr = arrivals(traces) if arr is None else arr
    found = {"consumer": {}, "producer": {}}
    for t in traces:
        for e in t.events:
            key = (t.rank, e.flag)
            if e.kind != "tile" or e.role not in found or key not in arr:
                continue
            best = found[e.role]
            if key not in best or e.start < best[key].start:
                best[key] = e
    return {**found["producer"], **found["consumer"]}


def check_tiles_once(traces):
    """Problems (strings): a tile recorded twice by the same lane kind, or tile sets that
    differ between the producer, the consumer warp groups and the storer, or ids with gaps."""
    problems = []
    for t in traces:
        per_lane = collections.defaultdict(collections.Counter)
        for e in t.events:
            if e.kind == "tile":
                per_lane[(e.role, e.lane if e.role == "consumer" else 0)][e.id] += 1
        sets = {}
        for (role, lane), ids in sorted(per_lane.items()):
            dup = sorted(i for i, c in ids.items() if c > 1)
            if dup:
                problems.append(f"rank {t.rank}: {role} records tile(s) {dup[:8]} more than once")
            sets[(role, lane)] = set(ids)
        if not sets:
            problems.append(f"rank {t.rank}: no tiles recorded")
            continue
        ref_key = ("producer", 0) if ("producer", 0) in sets else next(iter(sets))
        ref = sets[ref_key]
        for key, s in sets.items():
            if s != ref:
                problems.append(f"rank {t.rank}: {key[0]} (lane {key[1]}) has tiles "
                                f"{sorted(s ^ ref)[:8]} that {ref_key[0]} does not agree on")
        if ref and ref != set(range(max(ref) + 1)):
            missing = sorted(set(range(max(ref) + 1)) - ref)
            problems.append(f"rank {t.rank}: tiles {missing[:8]} never appear")
    return problems


def check_arrivals_first(traces, slack_ns=0):
    """Problems: a producer or consumer tile that starts before the chunk behind its flag
    arrived (real traces have consumer tiles only: their flag is the row-block they read).
    This is the check that a missing flag wait would fail."""
    arr = arrivals(traces)
    problems = []
    for t in traces:
        for e in t.events:
            if e.role not in ("producer", "consumer") or e.kind != "tile":
                continue
            got = arr.get((t.rank, e.flag))
            if got is not None and e.start + slack_ns < got:
                problems.append(f"rank {t.rank}: tile {e.id} (cta {e.cta}) started "
                                f"{(got - e.start) / 1e3:.1f} us before flag {e.flag}'s chunk "
                                "arrived")
    return problems


def _union(intervals):
    merged = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def _overlap(a, b):
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize(traces):
    """Per rank: span, busy/wait time per role, and overlap = the share of communication time
    during which some SM was computing (1.0: communication completely hidden)."""
    ranks = []
    for t in traces:
        if not t.events:
            continue
        t0, t1 = min(e.start for e in t.events), max(e.end for e in t.events)
        roles = collections.defaultdict(lambda: collections.Counter())
        for e in t.events:
            c = roles[e.role]
            waited = e.kind == "wait" or (e.kind == "phase" and t.phase_name(e.id).startswith("wait:"))
            c["wait_ns" if waited else "busy_ns"] += e.dur
            c["waits" if waited else "items"] += 1
            c["timeouts"] += e.timed_out
        if t.op == RING_ATTN_BWD and "consumer" in roles:
            roles["consumer"]["busy_ns"] -= _key_tile_waits(t)
        comp = _union([(e.start, e.end) for e in t.events
                       if e.role in ("consumer",) and e.kind == "tile"])
        comm = _union([(e.start, e.end) for e in t.events
                       if e.role in COMM_ROLES and e.kind == "chunk"])
        comm_ns = sum(e - s for s, e in comm)
        ranks.append({"rank": t.rank, "op": t.op_name, "span_ns": t1 - t0, "roles": roles,
                      "compute_ns": sum(e - s for s, e in comp), "comm_ns": comm_ns,
                      "overlap": _overlap(comp, comm) / comm_ns if comm_ns else None,
                      "dropped": t.dropped, "phases": phase_spans(t)})
    return ranks


def _key_tile_waits(trace):
    """The ring attention backward's key tile spans (one per CTA, on its SM's consumer0 lane)
    hold its warp groups' waits for the peers' partials, which the two groups often wait at
    the same time: the time of each span covered by any of its SM's consumer waits, summed."""
    waits = collections.defaultdict(list)
    for e in trace.events:
        if e.role == "consumer" and e.kind == "wait":
            waits[e.cta].append((e.start, e.end))
    merged = {cta: _union(iv) for cta, iv in waits.items()}
    covered = 0
    for e in trace.events:
        if e.role == "consumer" and e.kind == "tile":
            covered += _overlap([(e.start, e.end)], merged.get(e.cta, []))
    return covered


def phase_spans(trace):
    """A multi-phase kernel's phases (kind "phase": MoE dispatch, the ring attention backward's
    parts and part waits) and the GEMM's tiles after it, on one rank: [(name, CTAs, first
    start, last end, summed duration)] in ns from the rank's first event, ordered by first
    start; empty when the trace has no phase events."""
    evs = [e for e in trace.events if e.kind == "phase"]
    if not evs:
        return []
    t0 = min(e.start for e in trace.events)
    groups = collections.defaultdict(list)
    for e in evs:
        groups[trace.phase_name(e.id)].append(e)
    tiles = [e for e in trace.events if e.kind == "tile" and e.role == "consumer"]
    if tiles:
        groups["key tiles" if trace.op == RING_ATTN_BWD else "gemm tiles"] = tiles
    rows = [(name, len({e.cta for e in g}), min(e.start for e in g) - t0, max(e.end for e in g) - t0,
             sum(e.dur for e in g)) for name, g in groups.items()]
    return sorted(rows, key=lambda r: (r[2], r[3]))


def _sorted_lanes(events):
    """{(rank, cta, lane): that lane's events in start order}."""
    lanes = collections.defaultdict(list)
    for e in events:
        lanes[(e.rank, e.cta, e.lane)].append(e)
    for evs in lanes.values():
        evs.sort(key=lambda e: e.start)
    return lanes


def critical_path(traces):
    """The chain of events that ends last, walked backwards: on a producer lane each event
    waits for the previous one, except that a wait which ended on a chunk's arrival hands the
    blame to that chunk (possibly on another rank), whose lane is then followed. Returns the
    events oldest first. A heuristic: it follows recorded dependencies only."""
    arr_event = {}
    for t in traces:
        for e in t.events:
            if e.kind == "chunk":
                key = (e.peer, e.flag) if e.role == "comm-send" else (e.rank, e.flag)
                if key not in arr_event or e.end > arr_event[key].end:
                    arr_event[key] = e
    lanes = _sorted_lanes(e for t in traces for e in t.events)
    every = [e for evs in lanes.values() for e in evs]
    if not every:
        return []
    cur = max(every, key=lambda e: e.end)
    if cur.role in ("consumer", "storer"):  # the tile's producer side leads to its waits
        prod = [e for e in lanes[(cur.rank, cur.cta, 0)] if e.kind == "tile" and e.id == cur.id]
        path = [cur]
        cur = prod[0] if prod else cur
    else:
        path = []
    while cur is not None and len(path) < 10000:
        path.append(cur)
        if cur.kind == "wait" and not cur.timed_out:
            src = arr_event.get((cur.rank, cur.flag))
            if src is not None and src.end >= cur.start:
                cur = src
                continue
        lane = lanes[(cur.rank, cur.cta, cur.lane)]
        i = lane.index(cur)
        cur = lane[i - 1] if i > 0 else None
    return list(reversed(path))


def format_summary(traces):
    lines = []
    for r in summarize(traces):
        span = r["span_ns"] / 1e3
        lines.append(f"rank {r['rank']} ({r['op']}): {span:.1f} us from first to last event"
                     + (f", {r['dropped']} events lost (ring full)" if r["dropped"] else ""))
        lines.append(f"  {'role':<10} {'items':>6} {'busy us':>10} {'waits':>6} {'wait us':>10}"
                     f" {'timeouts':>8}")
        for role in COMPUTE_ROLES + COMM_ROLES:
            c = r["roles"].get(role)
            if c:
                lines.append(f"  {role:<10} {c['items']:>6} {c['busy_ns'] / 1e3:>10.1f} "
                             f"{c['waits']:>6} {c['wait_ns'] / 1e3:>10.1f} {c['timeouts']:>8}")
        ov = "n/a (no communication recorded)" if r["overlap"] is None else \
            f"{100 * r['overlap']:.0f}% of {r['comm_ns'] / 1e3:.1f} us"
        lines.append(f"  compute (consumer busy on any SM) {r['compute_ns'] / 1e3:.1f} us; "
                     f"communication hidden under compute: {ov}")
        spans = r["phases"]
        if spans:
            lines.append(f"  {'phase':<12} {'CTAs':>5} {'from us':>9} {'to us':>9} {'sum us':>10}")
            for name, ctas, start, end, total in spans:
                lines.append(f"  {name:<12} {ctas:>5} {start / 1e3:>9.1f} {end / 1e3:>9.1f} {total / 1e3:>10.1f}")
    path = critical_path(traces)
    if path:
        lines.append("critical path (oldest first; consecutive events of one lane folded):")
        for first, last, evs in _fold(path):
            waited = sum(e.dur for e in evs if e.kind == "wait")
            items = [e for e in evs if e.kind != "wait"] or evs
            ids = f"{items[0].id}" if len(items) == 1 else f"{items[0].id}..{items[-1].id}"
            what = f"{first.role} {items[0].kind}{'s' if len(items) > 1 else ''} {ids}"
            if waited:
                what += f" (waited {waited / 1e3:.1f} us)"
            lines.append(f"  rank {first.rank} cta {first.cta:<3} {what:<44} "
                         f"{(last.end - first.start) / 1e3:>9.1f} us")
        t0 = min(e.start for t in traces for e in t.events)
        lines.append(f"  ends at {(path[-1].end - t0) / 1e3:.1f} us")
    return "\n".join(lines)


def _fold(path):
    """Consecutive events of one lane as (first, last, events)."""
    segs = []
    for e in path:
        if segs and (segs[-1][0].rank, segs[-1][0].cta, segs[-1][0].lane) == (e.rank, e.cta, e.lane):
            segs[-1] = (segs[-1][0], e, segs[-1][2] + [e])
        else:
            segs.append((e, e, [e]))
    return segs


def arrival_table(traces):
    """Per rank, the arrived row-blocks in arrival order: [(rank, [(flag, peer, arrived_ns,
    first_use_ns or None)])], times from that rank's first event. Where a peer's data landed
    when, and how long the GEMM then took to use it: what tells a transport-bound call from
    one that waits on something else (a signal stuck behind later data arrives late but then
    is used at once)."""
    arr_ev = arrival_events(traces)
    uses = first_uses(traces, {k: e.end for k, e in arr_ev.items()})
    sender = {id(e): t.rank for t in traces for e in t.events if e.role == "comm-send"}
    out = []
    for t in traces:
        t0 = min(e.start for e in t.events) if t.events else 0
        rows = []
        for (rank, flag), e in arr_ev.items():
            if rank != t.rank:
                continue
            peer = e.peer if e.role == "comm-recv" else sender[id(e)]
            use = uses.get((rank, flag))
            rows.append((flag, peer, e.end - t0, None if use is None else use.start - t0))
        out.append((t.rank, sorted(rows, key=lambda r: r[2])))
    return out


def format_arrivals(traces):
    lines = []
    for rank, rows in arrival_table(traces):
        lines.append(f"rank {rank}: {len(rows)} row-block arrivals")
        lines.append(f"  {'flag':>5} {'from':>4} {'arrived us':>11} {'first use us':>13}"
                     f" {'gap us':>8}")
        for flag, peer, arrived, use in rows:
            u = "-" if use is None else f"{use / 1e3:.1f}"
            gap = "-" if use is None else f"{(use - arrived) / 1e3:.1f}"
            lines.append(f"  {flag:>5} {peer:>4} {arrived / 1e3:>11.1f} {u:>13} {gap:>8}")
    return "\n".join(lines)


def tile_gaps(traces):
    """Per rank: the idle time of each consumer warp group between the end of one tile and the
    start (its first data in) of the next on the same CTA, in ns, sorted: what a CTA loses
    between tiles (the next slot's choice, the scheduler's walk to its group, a late load)."""
    out = []
    for t in traces:
        lanes = _sorted_lanes(e for e in t.events if e.role == "consumer" and e.kind == "tile")
        gaps = [b.start - a.end for evs in lanes.values() for a, b in zip(evs, evs[1:])]
        out.append({"rank": t.rank, "call": t.call, "op": t.op_name, "gaps": sorted(gaps)})
    return out


def format_gaps(traces):
    lines = ["consumer idle between two tiles of a CTA (us):",
             f"  {'rank':>4} {'call':>5} {'op':<22} {'gaps':>6} {'median':>8} {'mean':>8} {'p90':>8} {'max':>8}"]
    for r in tile_gaps(traces):
        g = r["gaps"]
        if not g:
            lines.append(f"  {r['rank']:>4} {r['call']:>5} {r['op']:<22} {0:>6}  (one tile per CTA or none)")
            continue
        us = [x / 1e3 for x in g]
        lines.append(f"  {r['rank']:>4} {r['call']:>5} {r['op']:<22} {len(us):>6} {us[len(us) // 2]:>8.2f} "
                     f"{sum(us) / len(us):>8.2f} {us[int(0.9 * (len(us) - 1))]:>8.2f} {us[-1]:>8.2f}")
    return "\n".join(lines)


def send_table(traces):
    """Per rank, the cross-node GEMM+ReduceScatter / AllReduce sender CTA's row-blocks in the
    order it published them: [(rank, [(dest, mb, gather, ready_ns, published_ns)])], times
    from that rank's first event. Ready: the sender's wait for the row-block's tiles ended;
    published: its descriptor went into the proxy's queue (the queue having room). Each wait
    (comm-send wait) is paired with the publication after it on its lane (comm-send chunk,
    same id and flag); a wait without one (a call that gave up) is left out. What tells a
    sender held by the GEMM (ready late) from one held by the queue (published long after
    ready); when the rows then land is the peer's to say (its storers' tile events)."""
    out = []
    for t in traces:
        t0 = min(e.start for e in t.events) if t.events else 0
        sends = []
        for evs in _sorted_lanes(e for e in t.events if e.role == "comm-send").values():
            sends += [(w.peer, w.id, w.flag, w.end - t0, c.end - t0) for w, c in zip(evs, evs[1:])
                      if w.kind == "wait" and c.kind == "chunk" and c.id == w.id and c.flag == w.flag]
        out.append((t.rank, sorted(sends, key=lambda s: s[4])))
    return out


def format_sends(traces):
    lines = []
    for rank, sends in send_table(traces):
        lines.append(f"rank {rank}: {len(sends)} row-blocks published")
        lines.append(f"  {'to':>3} {'mb':>4} {'what':<8} {'ready us':>9} {'published us':>13} {'queued us':>10}")
        for dest, mb, gather, ready, pub in sends:
            lines.append(f"  {dest:>3} {mb:>4} {'reduced' if gather else 'partial':<8} {ready / 1e3:>9.1f}"
                         f" {pub / 1e3:>13.1f} {(pub - ready) / 1e3:>10.1f}")
    return "\n".join(lines)
