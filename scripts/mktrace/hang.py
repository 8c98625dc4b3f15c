"""Hang reports: rendered from the text the library writes (mk_trace_hang_report in
fused/common/trace.c, "nccl-mk hang report v1"), or built from traces the same way."""
import re

from .fmt import LANE_NAMES

HEAD = "nccl-mk hang report v1"


def parse_report(text):
    """The fields of a v1 report: rank, op, call, tile, flag, expected, seen, peer,
    peer_progress, cta, sm, lane, events (list of dicts)."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != HEAD:
        raise ValueError(f"not a hang report (first line must be '{HEAD}')")
    r = {"peer": None, "peer_progress": None, "cta": None, "events": []}
    for line in lines[1:]:
        if m := re.match(r"rank (\d+) op (\d+) call (\d+)", line):
            r.update(rank=int(m[1]), op=int(m[2]), call=int(m[3]))
        elif m := re.match(r"stuck: tile (\d+) waiting for flag (\d+): expected (\d+), seen (\d+)",
                           line):
            r.update(tile=int(m[1]), flag=int(m[2]), expected=int(m[3]), seen=int(m[4]))
        elif m := re.match(r"account: (.*)$", line):
            r["account"] = m[1]
        elif m := re.match(r"peer: rank (-?\d+) progress (\d+)", line):
            r.update(peer=int(m[1]), peer_progress=int(m[2]))
        elif m := re.match(r"cta: (\d+) sm (\d+) lane (\d+)", line):
            r.update(cta=int(m[1]), sm=int(m[2]), lane=int(m[3]))
        elif m := re.match(r"\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)"
                           r"\s+(\S+)$", line):
            r["events"].append(dict(t=int(m[1]), dur=int(m[2]), role=m[3], kind=m[4],
                                    id=int(m[5]), flag=int(m[6]), expected=int(m[7]),
                                    seen=int(m[8]), peer=m[9]))
    if "rank" not in r or "tile" not in r:
        raise ValueError("hang report without its rank or stuck line")
    return r


def from_traces(traces, last_n=12):
    """A report per rank that has a timed-out wait: the wait that began first (the one whose
    timeout fired; the others saw the abort), the peer that owns its flag (the rank whose
    chunks announce it) with how many chunks that peer sent to this rank, and the stuck CTA's
    last events."""
    owner, sent = {}, {}
    for t in traces:
        for e in t.events:
            if e.role == "comm-send" and e.kind == "chunk":
                owner[(e.peer, e.flag)] = t.rank
                sent[(t.rank, e.peer)] = sent.get((t.rank, e.peer), 0) + 1
    reports = []
    for t in traces:
        stuck = [e for e in t.events if e.timed_out]
        if not stuck:
            continue
        w = min(stuck, key=lambda e: e.start)
        peer = owner.get((t.rank, w.flag))
        if peer is None:  # nothing for this flag arrived: guess the peer from its neighbours
            near = [(abs(f - w.flag), p) for (r, f), p in owner.items() if r == t.rank]
            peer = min(near)[1] if near else None
        evs = sorted((e for e in t.events if e.cta == w.cta), key=lambda e: e.start)[-last_n:]
        r = {"rank": t.rank, "op": t.op, "call": t.call, "tile": w.id, "flag": w.flag,
             "expected": w.expected, "seen": w.seen, "peer": peer,
             "peer_progress": sent.get((peer, t.rank)) if peer is not None else None,
             "cta": w.cta, "sm": w.sm, "lane": w.lane, "waited_ns": w.dur,
             "also_stopped": len({e.cta for e in stuck}) - 1, "events": [
                 dict(t=e.start - evs[0].start, dur=e.dur, role=e.role, kind=e.kind, id=e.id,
                      flag=e.flag, expected=e.expected, seen=e.seen,
                      peer=str(e.peer) if e.peer >= 0 else "-") for e in evs]}
        reports.append(r)
    return reports


def render(r):
    out = [f"HANG on rank {r['rank']} (op {r['op']}, call {r['call']}): tile {r['tile']} waited "
           f"for flag {r['flag']} to reach {r['expected']} and saw {r['seen']}"]
    if r.get("waited_ns"):
        out[0] += f" for {r['waited_ns'] / 1e6:.3f} ms"
    if r.get("account"):
        out.append(f"  {r['account']}")
    if r.get("cta") is not None:
        out.append(f"  stuck CTA {r['cta']} on SM {r['sm']} ({LANE_NAMES[r['lane']]} lane)"
                   + (f"; {r['also_stopped']} other CTA(s) stopped on the abort"
                      if r.get("also_stopped") else ""))
    else:
        out.append("  stuck CTA unknown (run with NCCL_MK_TRACE=1 to see its events)")
    if r.get("peer") is not None and r["peer"] >= 0:
        prog = r.get("peer_progress")
        out.append(f"  flag {r['flag']} is raised by rank {r['peer']}, which had sent "
                   f"{prog if prog is not None else '?'} chunk(s) to rank {r['rank']}: look "
                   f"at rank {r['peer']} next (did it stop, or raise the wrong flag?)")
    else:
        out.append("  the peer that should raise this flag is unknown")
    if r["events"]:
        out.append(f"  last {len(r['events'])} events of the stuck CTA (us after the first):")
        for e in r["events"]:
            mark = "  <-- stuck" if e["kind"] == "wait" and e["flag"] == r["flag"] and \
                e["seen"] != e["expected"] else ""
            out.append(f"    {e['t'] / 1e3:10.2f} {e['dur'] / 1e3:10.2f} {e['role']:<9} "
                       f"{e['kind']:<5} {e['id']:>6} flag {e['flag']:<5}{mark}")
    return "\n".join(out)
