"""The trace file, version 1 (fused/common/trace.h is the reference):

  header  64 bytes   struct mk_trace_header
  rings   nrings x 16 bytes   struct mk_trace_ring (count, sm, cta, lane, opened)
  events  sum over rings of min(count, capacity) x 32 bytes, ring after ring, oldest first

All little-endian. read() returns a Trace whose events carry their rank, CTA, SM and lane, with
times in ns on the common clock (header.clock_offset_ns applied)."""
import dataclasses
import struct

MAGIC = 0x52544B4D
VERSION = 1
LANES = 5
NO_PEER = 0xFFFF
HEADER = struct.Struct("<IHHIIIIIIQqQII")
RING = struct.Struct("<IHHBBHI")
EVENT = struct.Struct("<QIBBHIIII")
assert (HEADER.size, RING.size, EVENT.size) == (64, 16, 32)

ROLES = ["producer", "consumer", "storer", "comm-send", "comm-recv", "proxy"]
KINDS = ["tile", "chunk", "wait", "phase"]
LANE_NAMES = ["producer", "consumer0", "consumer1", "storer", "comm"]
OPS = {1: "AllGather+GEMM", 2: "GEMM+ReduceScatter", 3: "GEMM+AllReduce", 4: "MoE dispatch+GEMM",
       7: "ring attention backward"}
# "phase" events' ids per op: fused/moe/moe.h enum mk_moe_trace_phase, and
# fused/common/attn_bwd_trace.cuh enum mk_attn_bwd_trace_phase (its rings are per SM: `cta` is
# the SM there, each SM running the one launch's CTAs one after another)
PHASES = {4: {0: "route", 1: "counts", 2: "push", 3: "expand"},
          7: {0: "wait:start", 1: "wait:main", 3: "wait:push", 8: "push", 9: "start", 10: "end"}}
COMPUTE_ROLES = ("producer", "consumer", "storer")
COMM_ROLES = ("comm-send", "comm-recv", "proxy")


class FormatError(Exception):
    pass


@dataclasses.dataclass
class Event:
    rank: int
    cta: int
    sm: int
    lane: int
    start: int  # ns
    dur: int
    role: str
    kind: str
    peer: int  # -1: none
    id: int
    flag: int
    expected: int
    seen: int

    @property
    def end(self):
        return self.start + self.dur

    @property
    def timed_out(self):
        """A wait that ended before its flag reached the value (32-bit epoch compare)."""
        return self.kind == "wait" and ((self.seen - self.expected) & 0xFFFFFFFF) >= 0x80000000


@dataclasses.dataclass
class Trace:
    path: str
    rank: int
    nranks: int
    op: int
    ctas: int
    capacity: int
    call: int
    clock_offset_ns: int
    dropped: int
    m: int
    n: int
    rings: list  # [(count, sm, cta, lane, opened)]
    events: list

    @property
    def op_name(self):
        return OPS.get(self.op, f"op {self.op}")

    def phase_name(self, pid):
        return PHASES.get(self.op, {}).get(pid, f"phase {pid}")


def parse(data, path="<bytes>"):
    if len(data) < HEADER.size:
        raise FormatError(f"{path}: {len(data)} bytes, shorter than the 64-byte header")
    (magic, version, event_bytes, rank, nranks, op, nrings, capacity, ctas, call, offset,
     dropped, m, n) = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise FormatError(f"{path}: not an nccl-mk trace (magic 0x{magic:08x})")
    if version != VERSION or event_bytes != EVENT.size:
        raise FormatError(f"{path}: trace version {version} (event {event_bytes} bytes); "
                          f"this tool reads version {VERSION}")
    if nrings != ctas * LANES or capacity == 0 or capacity & (capacity - 1):
        raise FormatError(f"{path}: inconsistent header (nrings {nrings}, ctas {ctas}, "
                          f"capacity {capacity})")
    pos = HEADER.size
    rings = []
    for _ in range(nrings):
        if pos + RING.size > len(data):
            raise FormatError(f"{path}: truncated ring table")
        count, sm, cta, lane, opened, _r0, _r1 = RING.unpack_from(data, pos)
        rings.append((count, sm, cta, lane, opened))
        pos += RING.size
    events = []
    for count, sm, cta, lane, opened in rings:
        for _ in range(min(count, capacity)):
            if pos + EVENT.size > len(data):
                raise FormatError(f"{path}: truncated events (ring of cta {cta} lane {lane})")
            start, dur, role, kind, peer, eid, flag, exp, seen = EVENT.unpack_from(data, pos)
            pos += EVENT.size
            events.append(Event(rank, cta, sm if opened else cta, lane, start + offset, dur,
                                ROLES[role] if role < len(ROLES) else f"role{role}",
                                KINDS[kind] if kind < len(KINDS) else f"kind{kind}",
                                -1 if peer == NO_PEER else peer, eid, flag, exp, seen))
    if pos != len(data):
        raise FormatError(f"{path}: {len(data) - pos} bytes after the last event")
    return Trace(path, rank, nranks, op, ctas, capacity, call, offset, dropped, m, n, rings,
                 events)


def read(path):
    with open(path, "rb") as f:
        return parse(f.read(), path)


def write(path, rank, nranks, op, ctas, lanes_events, capacity=1024, call=0, m=0, n=0, sms=None):
    """Writes a version-1 file. lanes_events[cta][lane] is that ring's events in time order,
    as Event objects (rank/cta/lane fields ignored); sms[cta] is its SM (default: cta)."""
    rings, body = [], []
    for cta in range(ctas):
        for lane in range(LANES):
            evs = lanes_events[cta][lane]
            kept = evs[-capacity:]
            rings.append(RING.pack(len(evs), (sms or {}).get(cta, cta), cta, lane, 1 if evs else 0,
                                   0, 0))
            for e in kept:
                body.append(EVENT.pack(e.start, min(e.dur, 0xFFFFFFFF), ROLES.index(e.role),
                                       KINDS.index(e.kind), NO_PEER if e.peer < 0 else e.peer,
                                       e.id, e.flag, e.expected & 0xFFFFFFFF,
                                       e.seen & 0xFFFFFFFF))
    dropped = sum(max(0, len(lanes_events[c][l]) - capacity)
                  for c in range(ctas) for l in range(LANES))
    header = HEADER.pack(MAGIC, VERSION, EVENT.size, rank, nranks, op, ctas * LANES, capacity,
                         ctas, call, 0, dropped, m, n)
    with open(path, "wb") as f:
        f.write(header + b"".join(rings) + b"".join(body))
