"""Chrome/Perfetto trace JSON, the format PyTorch's profiler writes (traceEvents with complete
"X" events in microseconds): one process per rank, one thread (track) per SM and role, plus a
flow arrow from each remote chunk's arrival to the first tile that consumed it."""
from .analysis import arrival_events, first_uses
from .fmt import LANE_NAMES

PID_BASE = 9000  # clear of the small pids; PyTorch's own tracks use the OS pids


def track_id(e):
    return e.sm * 8 + e.lane


def build(traces, absolute=False):
    """The JSON object. Times are relative to the first event of all ranks unless absolute
    (then %globaltimer microseconds, to line up with another trace on the same clock)."""
    t0 = 0 if absolute else min((e.start for t in traces for e in t.events), default=0)
    out = []
    for t in traces:
        pid = PID_BASE + t.rank
        out.append({"ph": "M", "name": "process_name", "pid": pid,
                    "args": {"name": f"rank {t.rank} {t.op_name} (call {t.call})"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                    "args": {"sort_index": t.rank}})
        named = set()
        for e in t.events:
            tid = track_id(e)
            if tid not in named:
                named.add(tid)
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                            "args": {"name": f"SM {e.sm:3d} {LANE_NAMES[e.lane]} (cta {e.cta})"}})
                out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                            "args": {"sort_index": tid}})
            args = {"tile" if e.kind != "chunk" else "chunk": e.id, "flag": e.flag}
            if e.kind == "wait":
                args.update(expected=e.expected, seen=e.seen, timed_out=e.timed_out)
            if e.peer >= 0:
                args["peer"] = e.peer
            name = f"{e.kind} {e.id}" if e.kind != "wait" else f"wait flag {e.flag}"
            out.append({"ph": "X", "name": name, "cat": e.role, "pid": pid, "tid": tid,
                        "ts": (e.start - t0) / 1e3, "dur": e.dur / 1e3, "args": args})
    out += _flows(traces, t0)
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"producer": "nccl-mk scripts/mk-trace", "format_version": 1}}


def _flows(traces, t0):
    """Arrival (end of the chunk event that raised the flag) -> start of the first tile that
    used its row-block (analysis.first_uses: consumer tiles, else producer tiles)."""
    senders = arrival_events(traces)
    flows = []
    for n, (key, use) in enumerate(sorted(first_uses(traces).items())):
        src = senders[key]
        common = {"name": "arrival", "cat": "flag", "id": n + 1}
        flows.append(dict(common, ph="s", pid=PID_BASE + src.rank, tid=track_id(src),
                          ts=(src.end - t0) / 1e3 - 0.001))
        flows.append(dict(common, ph="f", bp="e", pid=PID_BASE + use.rank, tid=track_id(use),
                          ts=(use.start - t0) / 1e3))
    return flows
