"""A synthetic AllGather+GEMM trace on 2 (or more) ranks, shaped like the real kernel will
record it (fused/common/trace.h): compute CTAs with producer / two consumer warp groups /
storer lanes visit their own shard's row-blocks first, then the peers' in arrival order; comm
CTAs push this rank's shard to the peers chunk by chunk (one chunk = one row-block, raising the
destination's ready flag for that row-block). Producers wait on a remote row-block's flag
before its first tile. Used by the tests and for README's picture until a real trace exists.

hang=(rank, flag): the chunk for `flag` never reaches `rank` (its sender stops there), and the
first CTA of `rank` that needs it times out; the rest see the abort and stop too."""
import random

from . import fmt

BM, BN = 128, 256
US = 1000


def _ev(start, end, role, kind, id_, flag, expected=1, seen=1, peer=-1):
    return fmt.Event(0, 0, 0, 0, int(start), int(max(end - start, 0)), role, kind, peer, id_,
                     flag, expected, seen)


def _arrivals(nranks, blocks, comm_ctas, chunk_ns, t0s, rng, hang):
    """Push schedule: rank s sends its row-blocks to each peer, comm CTA k taking every
    comm_ctas-th (peer, block). Returns ({(dest, flag): arrival ns}, {rank: comm lanes})."""
    arrive, comm = {}, {}
    for src in range(nranks):
        lanes = [[] for _ in range(comm_ctas)]
        work = [((src + step) % nranks, b) for b in range(blocks) for step in range(1, nranks)]
        stopped = False
        for i, (dest, b) in enumerate(work):
            flag = src * blocks + b
            if hang and hang == (dest, flag):
                stopped = True  # the planted bug: this chunk and everything after it never goes
            if stopped:
                break
            lane = lanes[i % comm_ctas]
            start = lane[-1].end + 300 if lane else t0s[src] + 2 * US
            end = start + chunk_ns * rng.uniform(0.9, 1.1)
            lane.append(_ev(start, end, "comm-send", "chunk", i, flag, peer=dest))
            arrive[(dest, flag)] = end
        comm[src] = lanes
    return arrive, comm


def _tile_order(rank, nranks, blocks, tiles_n):
    order = []
    for step in range(nranks):
        shard = (rank - step) % nranks  # fused/comm/schedule.h mk_sched_ag_source
        for b in range(blocks):
            mb = shard * blocks + b
            order += [(mb, mb * tiles_n + nb, shard != rank) for nb in range(tiles_n)]
    return order


def _compute_cta(cta, ctas, order, arrive, rank, t0, tile_ns, rng, give_up):
    """One compute CTA's four lanes, and (wait start, tile, flag) if it stopped at a flag
    that never came. give_up: when the rank's first timeout aborts every wait (None: this CTA
    is assumed to be the first, its wait just starts)."""
    prod, cons0, cons1, stor = [], [], [], []
    p_free, c_end, ready_mb = t0 + 1 * US, t0 + 1 * US, -1
    for mb, tile, remote in order[cta::ctas]:
        if mb != ready_mb:
            got = arrive.get((rank, mb), t0) if remote else t0
            if got is None:
                end = max(p_free, give_up) if give_up else p_free
                prod.append(_ev(p_free, end, "producer", "wait", tile, mb, 1, 0))
                return [prod, cons0, cons1, stor, []], (p_free, tile, mb)
            w_end = max(p_free, got + 400) + 100
            prod.append(_ev(p_free, w_end, "producer", "wait", tile, mb))
            p_free, ready_mb = w_end, mb
        d = tile_ns * rng.uniform(0.95, 1.08)
        c_start = max(p_free + 1 * US, c_end + 300)
        c_end = c_start + d
        prod.append(_ev(p_free, c_end - 3 * US, "producer", "tile", tile, mb))
        cons0.append(_ev(c_start, c_end, "consumer", "tile", tile, mb))
        cons1.append(_ev(c_start + 150, c_end + rng.uniform(0, 400), "consumer", "tile", tile, mb))
        stor.append(_ev(cons1[-1].end, cons1[-1].end + 4 * US, "storer", "tile", tile, mb))
        p_free = c_end - 3 * US
    return [prod, cons0, cons1, stor, []], None


def _rank_ctas(rank, compute_ctas, order, arrive, t0, tile_ns, seed, timeout_ns):
    """Every compute CTA of a rank; with missing flags, the CTA that began waiting first
    times out after timeout_ns and the others' waits end there too (they see the abort)."""
    def run(give_up):
        return [_compute_cta(c, compute_ctas, order, arrive, rank, t0, tile_ns,
                             random.Random(seed * 1000 + rank * 100 + c), give_up)
                for c in range(compute_ctas)]
    first = run(None)
    waits = [s for _, s in first if s]
    if not waits:
        return [lanes for lanes, _ in first], None
    start, tile, flag = min(waits)
    return [lanes for lanes, _ in run(start + timeout_ns)], (tile, flag)


def generate(nranks=2, m=4096, n=512, compute_ctas=6, comm_ctas=2, tile_ns=20 * US,
             chunk_ns=38 * US, seed=14, hang=None, timeout_ns=400 * US):
    """Returns ({rank: lanes_events per CTA}, {rank: (tile, flag) of its timed-out wait})."""
    rng = random.Random(seed)
    blocks = m // nranks // BM
    tiles_n = (n + BN - 1) // BN
    t0s = [1_700_000_000_000_000_000 + r * 3 * US for r in range(nranks)]
    arrive, comm = _arrivals(nranks, blocks, comm_ctas, chunk_ns, t0s, rng, hang)
    out, stuck = {}, {}
    for rank in range(nranks):
        order = _tile_order(rank, nranks, blocks, tiles_n)
        if hang and hang[0] == rank:
            for src in range(nranks):  # flags that never came
                if src != rank:
                    for b in range(blocks):
                        arrive.setdefault((rank, src * blocks + b), None)
        ctas, hung = _rank_ctas(rank, compute_ctas, order, arrive, t0s[rank], tile_ns, seed,
                                timeout_ns)
        if hung:
            stuck[rank] = hung
        out[rank] = ctas + [[[], [], [], [], comm[rank][k]] for k in range(comm_ctas)]
    return out, stuck


def write_files(directory, nranks=2, hang=None, **kw):
    """Writes rank<r>.trace files; returns (paths, stuck)."""
    import os
    ranks, stuck = generate(nranks=nranks, hang=hang, **kw)
    paths = []
    m, n = kw.get("m", 4096), kw.get("n", 512)
    for rank, ctas in ranks.items():
        path = os.path.join(directory, f"rank{rank}.trace")
        sms = {c: 2 * c + rank % 2 for c in range(len(ctas))}  # SM ids differ from CTA ids
        fmt.write(path, rank, nranks, 1, len(ctas), ctas, m=m, n=n, sms=sms)
        paths.append(path)
    return paths, stuck
