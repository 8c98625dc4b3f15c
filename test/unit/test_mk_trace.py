#!/usr/bin/env python3
"""scripts/mk-trace without a GPU: the synthetic AllGather+GEMM trace, the checkers (with a
negative control), the Perfetto JSON, the PNG from the stored trace and from a real-size one
(132 SMs per rank, consumer tiles only, as real traces hold), the C writer's file read back,
and hang reports.

usage: test_mk_trace.py CASE MK_TRACE UNIT_TRACE [DATA_DIR]"""
import collections
import json
import os
import subprocess
import sys
import tempfile

CASE, TOOL, UNIT_TRACE = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
DATA = sys.argv[4] if len(sys.argv) > 4 else None
sys.path.insert(0, os.path.dirname(TOOL))
from mktrace import analysis, fmt, hang, perfetto, synth  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}", file=sys.stderr)


def tool(*args, ok=(0,)):
    r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)
    if r.returncode not in ok:
        print(r.stdout, r.stderr, file=sys.stderr)
        check(False, f"mk-trace {' '.join(args)} exited {r.returncode}")
    return r


def synth_traces(tmp, **kw):
    paths, stuck = synth.write_files(tmp, **kw)
    return paths, [fmt.read(p) for p in paths], stuck


def synth_parses_tiles_once_arrivals_first(tmp):
    paths, traces, _ = synth_traces(tmp)
    check([t.rank for t in traces] == [0, 1], "one trace per rank")
    for t in traces:
        tiles = [e.id for e in t.events if e.role == "producer" and e.kind == "tile"]
        check(sorted(tiles) == list(range(64)), f"rank {t.rank}: every tile exactly once")
    check(analysis.check_tiles_once(traces) == [], "tile checker finds nothing wrong")
    check(len(analysis.arrivals(traces)) == 32, "16 remote chunks arrive on each rank")
    check(analysis.check_arrivals_first(traces) == [], "arrivals precede their tiles")
    waits = [e for t in traces for e in t.events if e.kind == "wait" and e.dur > 1000]
    check(len(waits) > 0, "some tiles really waited for their chunk (a useful picture)")
    check("ok: 2 rank(s)" in tool("check", *paths).stdout, "mk-trace check passes")


def arrival_checker_catches_early_tile(tmp):
    _, traces, _ = synth_traces(tmp)
    arr = analysis.arrivals(traces)
    # Negative control: move one consuming tile before its chunk arrived, as a kernel that
    # skipped the flag wait would.
    t1 = traces[1]
    victim = next(e for e in t1.events if e.role == "producer" and e.kind == "tile"
                  and (1, e.flag) in arr)
    victim.start = arr[(1, victim.flag)] - 5000
    problems = analysis.check_arrivals_first(traces)
    check(len(problems) == 1 and f"tile {victim.id}" in problems[0] and "rank 1" in problems[0],
          f"the early tile is reported: {problems}")
    # And a duplicated tile is reported by the other checker.
    dup = next(e for e in traces[0].events if e.role == "storer")
    traces[0].events.append(fmt.Event(**{**dup.__dict__, "start": dup.start + 10}))
    check(any("more than once" in p for p in analysis.check_tiles_once(traces)),
          "a tile stored twice is reported")
    paths = [os.path.join(tmp, "bad0.trace"), os.path.join(tmp, "bad1.trace")]
    lanes = [[[[] for _ in range(fmt.LANES)] for _ in range(t.ctas)] for t in traces]
    for t in traces:
        for e in t.events:
            lanes[t.rank][e.cta][e.lane].append(e)
    for t in traces:
        for ring in lanes[t.rank]:
            for evs in ring:
                evs.sort(key=lambda e: e.start)
        fmt.write(paths[t.rank], t.rank, 2, 1, t.ctas, lanes[t.rank])
    r = tool("check", *paths, ok=(1,))
    check("started" in r.stdout and "FAIL" in r.stdout, "mk-trace check exits 1 and says why")


def write_traces(tmp, traces, prefix):
    """traces (as read, events possibly moved or removed) back to files; their paths."""
    paths = []
    for t in traces:
        lanes = [[[] for _ in range(fmt.LANES)] for _ in range(t.ctas)]
        for e in t.events:
            lanes[e.cta][e.lane].append(e)
        for ring in lanes:
            for evs in ring:
                evs.sort(key=lambda e: e.start)
        paths.append(os.path.join(tmp, f"{prefix}{t.rank}.trace"))
        fmt.write(paths[-1], t.rank, 2, 1, t.ctas, lanes)
    return paths


def storer_event_on_a_consumer_lane_counts_as_stored(tmp):
    """The GEMM's consumers store a CTA's last tile themselves and record its store event in
    the first consumer's ring (gemm_trace_storer_event): the checker must count it as stored,
    and still miss it when it is gone (negative control)."""
    _, traces, _ = synth_traces(tmp)
    moved = next(e for e in traces[0].events if e.role == "storer")
    moved.lane = fmt.LANE_NAMES.index("consumer0")
    check(analysis.check_tiles_once(traces) == [], "a storer event on a consumer lane counts")
    check("ok: 2 rank(s)" in tool("check", *write_traces(tmp, traces, "moved")).stdout,
          "mk-trace check passes with it")
    traces[0].events.remove(moved)
    check(any("storer" in p for p in analysis.check_tiles_once(traces)),
          "without the event the stored tile is missing")


def gaps_measure_each_ctas_idle_between_tiles(tmp):
    """Consumer tiles laid out 10 us long with 3 us between them on every CTA and warp group,
    one gap of 50 us: `gaps` reports the median 3 and the max 50, per rank."""
    _, traces, _ = synth_traces(tmp)
    for t in traces:
        lanes = collections.defaultdict(list)
        for e in t.events:
            if e.role == "consumer" and e.kind == "tile":
                lanes[(e.cta, e.lane)].append(e)
        for i, evs in enumerate(lanes.values()):
            evs.sort(key=lambda e: e.start)
            start = evs[0].start
            for j, e in enumerate(evs):
                e.start, e.dur = start, 10000
                start += 10000 + (50000 if (t.rank, i, j) == (1, 0, 0) else 3000)
    g = analysis.tile_gaps(traces)
    check([r["gaps"][len(r["gaps"]) // 2] for r in g] == [3000, 3000], f"median gap 3 us: {g}")
    check(g[0]["gaps"][-1] == 3000 and g[1]["gaps"][-1] == 50000, "the planted 50 us gap, on rank 1")
    out = tool("gaps", *write_traces(tmp, traces, "gaps")).stdout
    check("3.00" in out and "50.00" in out, f"mk-trace gaps prints them:\n{out}")


def perfetto_json_has_a_process_per_rank_and_track_per_sm_role(tmp):
    paths, traces, _ = synth_traces(tmp)
    out = os.path.join(tmp, "out.json")
    tool("perfetto", *paths, "-o", out)
    with open(out) as f:
        doc = json.load(f)
    ev = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    check(len(procs) == 2 and all("AllGather+GEMM" in n for n in procs.values()),
          f"a named process per rank: {procs}")
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    # 6 compute CTAs x 4 lanes + 2 comm CTAs, per rank
    check(len(threads) == 2 * (6 * 4 + 2), f"one track per SM and role: {len(threads)}")
    check(any("producer" in n for n in threads.values()) and
          any("comm" in n for n in threads.values()), "tracks are named by SM and role")
    spans = [e for e in ev if e["ph"] == "X"]
    check(len(spans) == sum(len(t.events) for t in traces), "every event is a complete event")
    check(all((e["pid"], e["tid"]) in threads for e in spans), "every event is on a named track")
    check(min(e["ts"] for e in spans) == 0, "times start at 0 unless --absolute")
    flows = [e for e in ev if e["ph"] in ("s", "f")]
    check(len(flows) == 2 * 32, "an arrival arrow per remote chunk")


def need_matplotlib():
    """mk-trace png re-runs itself under /usr/bin/python3 when this python3 lacks matplotlib."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    if not os.path.exists("/usr/bin/python3") or sys.executable == "/usr/bin/python3" or \
            subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"]).returncode != 0:
        print("SKIP: matplotlib missing (scripts/setup.sh installs python3-matplotlib)")
        sys.exit(77)


def png_size(path):
    with open(path, "rb") as f:
        data = f.read()
    check(data[:8] == b"\x89PNG\r\n\x1a\n", "a PNG signature")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def png_renders_stored_trace(tmp):
    need_matplotlib()
    stored = sorted(os.path.join(DATA, f) for f in os.listdir(DATA)
                    if f.startswith("mk-trace-small.rank"))
    check(len(stored) == 2, f"the stored small trace is there: {stored}")
    out = os.path.join(tmp, "timeline.png")
    tool("png", *stored, "-o", out)
    check(os.path.getsize(out) > 20000, f"a non-trivial picture ({os.path.getsize(out)} bytes)")
    w, h = png_size(out)
    check(w >= 800 and h >= 300, f"a readable size ({w} x {h})")


def c_writer_round_trips_through_mk_trace(tmp):
    path = os.path.join(tmp, "c.trace")
    subprocess.run([UNIT_TRACE, "write", path], check=True)
    t = fmt.read(path)
    cap, lanes = 8, fmt.LANES
    check((t.rank, t.nranks, t.op, t.call, t.ctas, t.capacity) == (1, 2, 1, 7, 3, cap),
          "header fields as the C test set them")
    check(t.dropped == 5, f"the wrapped ring's lost events are counted ({t.dropped})")

    def count_of(ring):  # the C test's formula
        return cap + 5 if ring == 0 else 3 if ring % 4 == 1 else 0
    want = []
    for ring in range(3 * lanes):
        n = count_of(ring)
        for j in range(max(0, n - cap), n):  # the newest `cap`, oldest first
            want.append((ring // lanes, ring % lanes, 100 + ring // lanes,
                         1000000 * ring + 100 * j, 50 + j, j, ring))
    got = [(e.cta, e.lane, e.sm, e.start, e.dur, e.id, e.flag) for e in t.events]
    check(got == want, "every event read back as written, ring after ring, oldest first")
    check(all(e.role == "producer" and e.kind == "tile" and e.peer == -1 for e in t.events),
          "role, kind and 'no peer' decode")
    tool("summary", path)


def hang_report_names_rank_tile_flag(tmp):
    # From the C library's report of a planted hang.
    report = os.path.join(tmp, "hang.txt")
    subprocess.run([UNIT_TRACE, "hang", report], check=True)
    with open(report) as f:
        r = hang.parse_report(f.read())
    check((r["rank"], r["tile"], r["flag"], r["cta"], r["peer"]) == (1, 40, 9, 2, 0),
          f"C report fields: {r}")
    check(r.get("account", "").startswith("rank 1: ncclMkAllGatherGemm (op 0x1) timed out at tile 40"),
          f"the report's account line: {r}")
    out = tool("hang", report).stdout
    check("HANG on rank 1" in out and "tile 40" in out and "flag 9" in out and
          "<-- stuck" in out and "rank 0" in out and "ncclMkAllGatherGemm (op 0x1) timed out" in out,
          f"rendered C report:\n{out}")
    # From the traces of a synthetic run where rank 0 never sends the chunk behind flag 5.
    paths, _, stuck = synth_traces(tmp, hang=(1, 5))
    tile, flag = stuck[1]
    out = tool("hang", *paths).stdout
    check(f"HANG on rank 1 " in out and f"tile {tile} " in out and f"flag {flag} " in out,
          f"rendered trace hang names rank 1, tile {tile}, flag {flag}:\n{out}")
    check("raised by rank 0, which had sent 5 chunk(s)" in out, "the peer and its progress")
    check(os.path.exists(paths[0]) and tool("hang", paths[0], ok=(1,)).returncode == 1,
          "a trace without a timeout is no hang")


def summary_reports_overlap_and_critical_path(tmp):
    paths, traces, _ = synth_traces(tmp)
    out = tool("summary", *paths).stdout
    for want in ("rank 0 (AllGather+GEMM)", "producer", "consumer", "comm-send",
                 "communication hidden under compute:", "critical path"):
        check(want in out, f"summary shows {want!r}")
    s = analysis.summarize(traces)
    check(all(0.5 < r["overlap"] <= 1.0 for r in s), f"overlap is a share: {[r['overlap'] for r in s]}")
    path = analysis.critical_path(traces)
    check(path and path[-1].end == max(e.end for t in traces for e in t.events),
          "the critical path ends with the last event")
    check(any(e.role == "comm-send" for e in path),
          "this comm-bound synthetic run's critical path goes through the chunks")


def summary_counts_each_timed_out_wait(tmp):
    """A hung run (rank 1 never raises flag 5): the summary's timeouts per rank and role are
    the waits that ended unsatisfied, each counted once (session 67 had moved the count out of
    the event loop, where it counted one event per rank, or none)."""
    _, traces, _ = synth_traces(tmp, hang=(1, 5))
    for r, t in zip(analysis.summarize(traces), traces):
        want = collections.Counter(e.role for e in t.events if e.timed_out)
        got = {role: c["timeouts"] for role, c in r["roles"].items() if c["timeouts"]}
        check(got == dict(want), f"rank {t.rank}: timeouts per role {got}, want {dict(want)}")
    check(sum(e.timed_out for t in traces for e in t.events) > 0, "the hung run has timed-out waits")


def summary_lists_moe_dispatch_phases(tmp):
    """A MoE dispatch trace (op 4) as the kernel records it (fused/moe/moe_dispatch.cu): every
    CTA's route phase, the last one's counts exchange, then push (2 CTAs) and expand (4), and
    the grouped GEMM's consumer tiles after it. The summary's phase table gives each phase's
    CTAs and span from the rank's first event, in order; a trace without phases has none."""
    us = 1000
    ev = synth._ev
    lanes = [[[] for _ in range(fmt.LANES)] for _ in range(6)]
    comm, cons = fmt.LANE_NAMES.index("comm"), fmt.LANE_NAMES.index("consumer0")
    for cta in range(6):
        lanes[cta][comm].append(ev(cta * 100, 5 * us + cta * 100, "comm-send", "phase", 0, 0))
    lanes[5][comm].append(ev(5.5 * us, 20 * us, "comm-send", "phase", 1, 0))
    for cta in (0, 1):
        lanes[cta][comm].append(ev(6 * us, 9 * us, "comm-send", "phase", 2, 0))
    for cta in (2, 3, 4, 5):
        lanes[cta][comm].append(ev(21 * us, 30 * us + cta * us, "comm-recv", "phase", 3, 0))
        lanes[cta][cons].append(ev(40 * us, 90 * us, "consumer", "tile", cta, 0))
    path = os.path.join(tmp, "moe.trace")
    fmt.write(path, 0, 2, 4, 6, lanes)
    out = tool("summary", path).stdout
    rows = [l.split() for l in out.splitlines() if l.split()[:1] and l.split()[0] in
            ("route", "counts", "push", "expand", "gemm")]
    want = [["route", "6", "0.0", "5.5", "30.0"], ["counts", "1", "5.5", "20.0", "14.5"],
            ["push", "2", "6.0", "9.0", "6.0"], ["expand", "4", "21.0", "35.0", "50.0"],
            ["gemm", "tiles", "4", "40.0", "90.0", "200.0"]]
    check(rows == want, f"phase table in order with CTAs, spans and summed durations:\n{out}")
    check("rank 0 (MoE dispatch+GEMM)" in out, f"the op is named:\n{out}")
    paths, _, _ = synth_traces(tmp)
    check("phase" not in tool("summary", *paths).stdout, "no phase table without phase events")


def summary_names_ring_attention_backward_parts_and_waits(tmp):
    """A ring attention backward trace (op 7) as its one launch records it
    (fused/common/attn_bwd_trace.cuh): rings per SM, each SM's CTAs one after another. SM 0: a
    push CTA (comm lane), then a key tile (one span per CTA, on consumer0) whose producer
    waited 3 us for its K/V chunk flags and whose two warp groups waited 20 us at the same time
    for the peers' partials; SM 1: a start CTA, a key tile that waited 2 us for the start part,
    then an end CTA that waited 40 us for the key tiles.
    The summary names the op and the parts, with each part's summed time, and counts the
    producer's and consumers' waits, the part waits among them."""
    us = 1000
    ev = synth._ev
    L = fmt.LANE_NAMES.index
    lanes = [[[] for _ in range(fmt.LANES)] for _ in range(2)]
    lanes[0][L("comm")].append(ev(0, 4 * us, "comm-send", "phase", 8, 0))
    lanes[0][L("producer")].append(ev(4 * us, 7 * us, "producer", "wait", 5, 17, 3, 3))
    lanes[0][L("consumer0")].append(ev(4 * us, 60 * us, "consumer", "tile", 5, 1, 32, 32))
    for g in (0, 1):
        lanes[0][L(f"consumer{g}")].append(ev(40 * us, 60 * us, "consumer", "wait", 5, 2, 3, 3))
    lanes[1][L("producer")] += [ev(0, 3 * us, "producer", "phase", 9, 0, 0, 0),
                                ev(3 * us, 5 * us, "producer", "phase", 0, 0, 1, 1),
                                ev(61 * us, 101 * us, "producer", "phase", 1, 0, 2, 2),
                                ev(101 * us, 110 * us, "producer", "phase", 10, 2, 0, 0)]
    lanes[1][L("consumer0")].append(ev(5 * us, 61 * us, "consumer", "tile", 6, 0, 32, 1))
    path = os.path.join(tmp, "ra_bwd.trace")
    fmt.write(path, 0, 2, 7, 2, lanes)
    out = tool("summary", path).stdout
    check("rank 0 (ring attention backward)" in out, f"the op is named:\n{out}")
    rows = {l.split()[0]: l.split()[1:] for l in out.splitlines() if l.split()[:1] and l.split()[0] in
            ("push", "start", "wait:start", "wait:main", "end")}
    want = {"push": ["1", "0.0", "4.0", "4.0"], "start": ["1", "0.0", "3.0", "3.0"],
            "wait:start": ["1", "3.0", "5.0", "2.0"], "wait:main": ["1", "61.0", "101.0", "40.0"],
            "end": ["1", "101.0", "110.0", "9.0"]}
    check(rows == want, f"every part and part wait with its SMs, span and summed time:\n{out}")
    roles = {l.split()[0]: l.split()[1:] for l in out.splitlines() if l.split()[:1] and l.split()[0] in
             ("producer", "consumer")}
    check(roles.get("producer", [])[:4] == ["2", "12.0", "3", "45.0"],
          f"the start and end slices; the chunk-flag wait and the part waits (phases named wait:):\n{out}")
    check(roles.get("consumer", [])[:4] == ["2", "92.0", "2", "40.0"],
          f"two key tile spans less the 20 us in which the groups waited for the partials:\n{out}")
    check("key tiles" in out and "gemm tiles" not in out, f"its tiles are key tiles:\n{out}")


def arrivals_list_each_block_in_order_before_its_use(tmp):
    paths, traces, _ = synth_traces(tmp)
    table = dict(analysis.arrival_table(traces))
    arr = analysis.arrivals(traces)
    for rank in (0, 1):
        rows = table[rank]
        flags = {k[1] for k in arr if k[0] == rank}
        check(sorted(r[0] for r in rows) == sorted(flags) and flags,
              f"rank {rank}: every arrived flag once ({len(rows)} rows, {len(flags)} flags)")
        check([r[2] for r in rows] == sorted(r[2] for r in rows), f"rank {rank}: arrival order")
        check(all(r[1] == 1 - rank for r in rows), f"rank {rank}: the data came from the peer")
        check(all(r[3] is not None and r[3] >= r[2] for r in rows),
              f"rank {rank}: each block used after it arrived: {rows}")
    out = tool("arrivals", *paths).stdout
    check("rank 0:" in out and "first use us" in out and out.count("\n") >= len(arr),
          f"the table, a line per arrival:\n{out}")
    # negative control: a use moved before its arrival shows as a negative gap
    t = traces[0]
    flag = next(k[1] for k in arr if k[0] == t.rank)
    use = analysis.first_uses(traces)[(t.rank, flag)]
    use.start = arr[(t.rank, flag)] - 1000
    rows = dict(analysis.arrival_table(traces))[t.rank]
    check(any(r[0] == flag and r[3] < r[2] for r in rows), "a use before its arrival shows")


def real_size_traces(tmp, keep=lambda e: True):
    """A synthetic trace the size of a real 2 x H200 run (128 GEMM + 4 push CTAs per rank,
    4096 x 8192: 16 remote row-blocks per rank), written back with only the events `keep`
    accepts. Real traces hold no producer tiles: the producer lane records only its waits."""
    paths, traces, _ = synth_traces(tmp, compute_ctas=128, comm_ctas=4, n=8192)
    for path, t in zip(paths, traces):
        lanes = [[[] for _ in range(fmt.LANES)] for _ in range(t.ctas)]
        for e in t.events:
            if keep(e):
                lanes[e.cta][e.lane].append(e)
        fmt.write(path, t.rank, t.nranks, t.op, t.ctas, lanes, m=t.m, n=t.n,
                  sms={cta: sm for _, sm, cta, _, _ in t.rings})
    return paths, [fmt.read(p) for p in paths]


def no_producer_tiles(e):
    return not (e.role == "producer" and e.kind == "tile")


def first_use_links_come_from_consumer_tiles(tmp):
    paths, traces = real_size_traces(tmp, keep=no_producer_tiles)
    check(all(len({e.sm for e in t.events}) == 132 for t in traces), "132 SMs per rank")
    arr = analysis.arrivals(traces)
    uses = analysis.first_uses(traces)
    check(len(arr) == 32 and set(uses) == set(arr),
          f"every arrived row-block has a first use: {len(uses)} of {len(arr)}")
    for (rank, flag), use in sorted(uses.items()):
        tiles = [e for e in traces[rank].events if e.role == "consumer" and e.kind == "tile"
                 and e.flag == flag]
        check(use.role == "consumer" and use.rank == rank and use.flag == flag and
              use.start == min(e.start for e in tiles),
              f"rank {rank} flag {flag}: the earliest consumer tile of that row-block")
    doc = perfetto.build(traces)
    check(sum(e["ph"] == "s" for e in doc["traceEvents"]) == 32,
          "Perfetto draws the same 32 arrival arrows")
    # Negative control: without consumer tiles for a row-block there is nothing to link.
    victim = sorted(uses)[-1]
    gone = [e for e in traces[victim[0]].events if e.role == "consumer" and e.flag == victim[1]]
    traces[victim[0]].events = [e for e in traces[victim[0]].events if e not in gone]
    check(victim not in analysis.first_uses(traces), f"{victim}: no consumer tile, no link")
    # Older traces and synth's producer tiles: the fallback when no consumer tile names a flag.
    os.mkdir(os.path.join(tmp, "prod"))
    _, traces = real_size_traces(os.path.join(tmp, "prod"),
                                 keep=lambda e: not (e.role == "consumer" and e.kind == "tile"))
    uses = analysis.first_uses(traces)
    check(len(uses) == 32 and all(u.role == "producer" for u in uses.values()),
          "producer tiles are the fallback")


def arrival_checker_catches_early_consumer_tile(tmp):
    """Real traces have consumer tiles only: one that starts before its row-block arrived is
    reported, and an intact trace passes."""
    _, traces = real_size_traces(tmp, keep=no_producer_tiles)
    check(analysis.check_arrivals_first(traces) == [], "the intact trace passes")
    arr = analysis.arrivals(traces)
    victim = next(e for e in traces[0].events if e.role == "consumer" and e.kind == "tile"
                  and (0, e.flag) in arr)
    victim.start = arr[(0, victim.flag)] - 5000
    problems = analysis.check_arrivals_first(traces)
    check(len(problems) == 1 and f"tile {victim.id}" in problems[0] and "rank 0" in problems[0],
          f"the early consumer tile is reported: {problems}")


def png_of_132_sm_trace_has_bounded_height(tmp):
    need_matplotlib()
    paths, traces = real_size_traces(tmp, keep=no_producer_tiles)
    out = os.path.join(tmp, "real-size.png")
    r = tool("png", *paths, "-o", out)
    w, h = png_size(out)
    # A row per (SM, lane) made this 1320 x 9319 px; a row per SM in a capped figure
    check(600 <= h <= 1600 and w >= 1200, f"one readable picture ({w} x {h} px)")
    check(f"({w} x {h} px)" in r.stdout, f"the tool reports the size:\n{r.stdout}")
    for rank in (0, 1):
        check(f"rank {rank}: 132 SM rows, 16 arrivals, 16 linked" in r.stdout,
              f"rank {rank}: a row per SM, every arrival linked to a consumer tile:\n{r.stdout}")
    from mktrace import png
    check(sum(png.panel_inches(132, 8) for _ in range(8)) + png.HEAD_IN + png.FOOT_IN
          <= png.MAX_IN, "8 ranks of 132 SMs stay within the cap too")
    check(png.panel_inches(4, 2) < png.panel_inches(132, 2), "a panel grows with its SMs")


def sends_pair_each_wait_with_its_publication(tmp):
    """The cross-node RS/AR sender records, per row-block and destination, its wait for the
    tiles (comm-send wait) then its publication (comm-send chunk, same id and flag). `sends`
    lists them in publication order with ready and queued times; a wait whose publication is
    missing (a call that gave up) is not listed as published."""
    _, traces, _ = synth_traces(tmp)
    t = traces[0]
    t0 = min(e.start for e in t.events)
    cta = t.ctas - 1
    comm = fmt.LANE_NAMES.index("comm")

    def ev(start, dur, kind, peer, eid, flag):
        return fmt.Event(t.rank, cta, 0, comm, t0 + start, dur, "comm-send", kind, peer, eid, flag, 32, 32)

    t.events = [e for e in t.events if e.cta != cta]
    t.events += [ev(0, 100_000, "wait", 1, 3, 0),             # partial of row-block 3, ready at 100 us
                 ev(100_000, 2_000, "chunk", -1, 3, 0),       # published at 102
                 ev(102_000, 50_000, "wait", 1, 0, 1),        # reduced rows of 0, ready at 152
                 ev(152_000, 400_000, "chunk", -1, 0, 1),     # queued 400 us
                 ev(552_000, 10_000, "wait", 1, 1, 1)]        # gave up: no publication
    rows = dict(analysis.send_table(traces))
    check(rows[t.rank] == [(1, 3, 0, 100_000, 102_000), (1, 0, 1, 152_000, 552_000)],
          f"two publications in order, the unpublished wait left out: {rows[t.rank]}")
    check(rows[1 - t.rank] == [], "the other rank has none")
    out = tool("sends", *write_traces(tmp, traces, "sends")).stdout
    check("rank 0: 2 row-blocks published" in out and "reduced" in out and "400.0" in out,
          f"mk-trace sends prints them:\n{out}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        globals()[CASE](tmp)
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("ok")
