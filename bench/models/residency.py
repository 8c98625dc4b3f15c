#!/usr/bin/env python3
"""Which GEMM+ReduceScatter / GEMM+AllReduce schedules finish when only R of a rank's G CTAs can
be resident at once (other kernels, or other MPS clients, hold the rest of the SMs; a CTA that
leaves frees its SM for the next). A model of the rules, not of the kernel's timing: each rank's
CTA c walks its tiles in the rotated order (the next rank's rows first, its own last; slots c,
c + G, ..); a peer-row tile adds a partial to its owner at once; an own-row tile waits until every
peer's partials of its row-block are in (the storers' wait); with the all-reduce, a complete
own row-block goes to every peer's gather slot and each rank's collect copies the peers' reduced
row-blocks (items of S splits) once complete. Every rank has the same R (the hardest case).

Rules compared (bench/NOTES.md, session 36):
  rs static   today's GEMM+RS walk
  rs claimed  own-row tiles taken in order from a counter, and only by a CTA that finds every
              CTA of its rank started (one that finds some not started leaves after its
              peer-row tiles, freeing its SM)
  rs split    the peer-row tiles on the first G - G/n CTAs to start, the own-row tiles on the
              last G/n (NCCL_MK_RS_SPLIT=1: each CTA's place is its arrival ticket, so the
              own-row CTAs start only after every other has, as modelled); beyond 2 ranks the
              peers' shards interleaved row-block by row-block (sched.cuh sched_interleaved)
  ar old      the all-reduce's collect before session 36: items c, c + G, .. after the tiles
  ar new      session 36's: items from a counter, only once every CTA started (else leave)
Prints, per shape, how many residencies 1..G end in a deadlock; then, with every CTA resident,
the makespan of the RS walks in tile times (a tile takes one; an own-row tile starts once its
CTA is free and its row-block's last partial is in): the split's cost, and why its peers' shards
are interleaved beyond 2 ranks (in the rotated order the own rows' G/n CTAs wait for the last
peer, which reaches their rows only at the end: 1.7-1.9x at 4 and 8 ranks), and that the
claimed rule keeps the static walk's makespan.
usage: bench/models/residency.py
"""


def walk(rank, n, blocks, tiles_n, own=True):
    tiles = [((rank + 1 + i) % n, mb, nb) for i in range(n) for mb in range(blocks) for nb in range(tiles_n)]
    return tiles if own else [t for t in tiles if t[0] != rank]


def peer_walk_interleaved(rank, n, blocks, tiles_n):
    """The peers' rows, row-block by row-block across the peers (raster group 1)."""
    return [((rank + 1 + i) % n, mb, nb) for mb in range(blocks) for i in range(n - 1) for nb in range(tiles_n)]


def split_sequences(r, n, G, blocks, tiles_n, interleave=True):
    k = max(1, G // n)  # CTAs G - k .. G - 1 take the own rows
    peer_rows = peer_walk_interleaved(r, n, blocks, tiles_n) if interleave else walk(r, n, blocks, tiles_n, False)
    own_rows = [t for t in walk(r, n, blocks, tiles_n) if t[0] == r]
    return [peer_rows[c::G - k] for c in range(G - k)] + [own_rows[c::k] for c in range(k)]


def rs_sequences(n, G, blocks, tiles_n, rule):
    if rule == "static":
        return [[walk(r, n, blocks, tiles_n)[c::G] for c in range(G)] for r in range(n)]
    return [split_sequences(r, n, G, blocks, tiles_n, rule == "split") for r in range(n)]


def makespan(n, G, blocks, tiles_n, rule):
    """Every CTA resident; rule: static, split (interleaved beyond 2 ranks), split rotated, or
    claimed (the static walk's peer-row tiles, then own-row tiles in order from a counter, each
    taken by the CTA free first)."""
    claimed = rule == "claimed"
    seqs = [[walk(r, n, blocks, tiles_n, False)[c::G] for c in range(G)] for r in range(n)] if claimed \
        else rs_sequences(n, G, blocks, tiles_n, rule)
    ready = [[0] * blocks for _ in range(n)]  # [owner][mb]: when its last partial is in
    for r in range(n):
        for seq in seqs[r]:
            for t, (shard, mb, _) in enumerate(seq):
                if shard == r:
                    break  # a CTA's peer-row tiles come before its own-row tiles
                ready[shard][mb] = max(ready[shard][mb], t + 1)
    end = 0
    for r in range(n):
        free = []
        for seq in seqs[r]:
            t = 0
            for shard, mb, _ in seq:
                t = (t if shard != r else max(t, ready[r][mb])) + 1
            free.append(t)
        if claimed:  # own-row tiles in order, each to the CTA free first
            for mb in range(blocks):
                for _ in range(tiles_n):
                    c = min(range(G), key=free.__getitem__)
                    free[c] = max(free[c], ready[r][mb]) + 1
        end = max(end, max(free))
    return end


def simulate(n, G, R, blocks, tiles_n, rs_rule, collect=None, splits=8):
    claimed_own = rs_rule == "claimed"
    seq = [[walk(r, n, blocks, tiles_n, not claimed_own)[c::G] for c in range(G)] for r in range(n)]
    if rs_rule == "split":
        seq = rs_sequences(n, G, blocks, tiles_n, "split")
    own = [[(mb, nb) for mb in range(blocks) for nb in range(tiles_n)] for _ in range(n)]
    partial = [[[0] * blocks for _ in range(n)] for _ in range(n)]   # [owner][src][mb]
    gathered = [[[0] * blocks for _ in range(n)] for _ in range(n)]  # [dest][src][mb]
    own_done = [[0] * blocks for _ in range(n)]
    items = (n - 1) * blocks * splits
    st = [[{"pos": 0, "own": None, "item": None, "phase": "tiles"} for _ in range(G)] for _ in range(n)]
    next_own, next_item = [0] * n, [0] * n
    started = [min(R, G)] * n
    active = [list(range(min(R, G))) for _ in range(n)]

    def ready(r, mb):
        return all(partial[r][s][mb] == tiles_n for s in range(n) if s != r)

    def own_tile_done(r, mb):
        own_done[r][mb] += 1
        if own_done[r][mb] == tiles_n:
            for d in range(n):
                if d != r:
                    gathered[d][r][mb] = tiles_n

    def step(r, c):  # advances CTA c of rank r as far as it can; True when it moved
        s, moved = st[r][c], False
        while s["phase"] == "tiles" and s["pos"] < len(seq[r][c]):
            shard, mb, _ = seq[r][c][s["pos"]]
            if shard != r:
                partial[shard][r][mb] += 1
            elif ready(r, mb):
                own_tile_done(r, mb)
            else:
                return moved
            s["pos"] += 1
            moved = True
        if s["phase"] == "tiles":
            s["phase"] = "own" if claimed_own else "collect"
            moved = True
            if claimed_own and started[r] < G:
                s["phase"] = "leave"
        while s["phase"] == "own":
            if s["own"] is None:
                s["own"], next_own[r] = next_own[r], next_own[r] + 1
            if s["own"] >= len(own[r]):
                s["phase"] = "collect"
                break
            mb = own[r][s["own"]][0]
            if not ready(r, mb):
                return moved
            own_tile_done(r, mb)
            s["own"], moved = None, True
        if s["phase"] == "collect":
            if not collect:
                s["phase"] = "leave"
            elif collect == "new" and started[r] < G and s["item"] is None:
                s["phase"] = "leave"
            else:
                while True:
                    if s["item"] is None:
                        if collect == "old":
                            s["item"] = c
                        else:
                            s["item"], next_item[r] = next_item[r], next_item[r] + 1
                    if s["item"] >= items:
                        s["phase"] = "leave"
                        break
                    ib = s["item"] // splits
                    src, mb = (r + 1 + ib // blocks) % n, ib % blocks
                    if gathered[r][src][mb] < tiles_n:
                        return moved
                    s["item"] = s["item"] + G if collect == "old" else None
                    moved = True
        return True  # left

    while True:
        progress = False
        for r in range(n):
            for c in list(active[r]):
                progress |= step(r, c)
                if st[r][c]["phase"] == "leave":
                    active[r].remove(c)
                    if started[r] < G:
                        active[r].append(started[r])
                        started[r] += 1
        if all(not active[r] and started[r] == G for r in range(n)):
            return True
        if not progress:
            return False


def main():
    shapes = [  # ranks, CTAs per rank, row-blocks per shard, column tiles; what it stands for
        (2, 66, 32, 2, "busy_sms's 8192 x 264 on 2 ranks under MPS (66 SMs each; 256-column tiles)"),
        (2, 66, 32, 16, "busy_sms's 8192 x 4096 on 2 ranks under MPS"),
        (4, 33, 16, 2, "4 ranks on one GPU, the 4-rank overlapped shape"),
        (8, 16, 32, 2, "8 ranks on one GPU (16 SMs each), 4096 rows per rank, N = 264"),
        (2, 132, 64, 32, "2 H200s, M = 16384 N = 8192 (132 CTAs)"),
    ]
    rules = [("rs static", "static", None), ("rs claimed", "claimed", None), ("rs split", "split", None),
             ("ar old", "static", "old"), ("ar new", "static", "new"), ("ar new + rs claimed", "claimed", "new")]
    for n, G, blocks, tiles_n, what in shapes:
        print(f"{what}: n={n} G={G} row-blocks/shard={blocks} column tiles={tiles_n}")
        for name, rs_rule, collect in rules:
            bad = [R for R in range(1, G + 1) if not simulate(n, G, R, blocks, tiles_n, rs_rule, collect)]
            span = f" (R = {bad[0]}..{bad[-1]})" if bad else ""
            print(f"  {name:22s} deadlocks at {len(bad):3d} of {G} residencies{span}")
    print("makespan with every CTA resident, in tile times (ideal: tiles / CTAs):")
    for n, G, blocks, tiles_n, what in [(2, 132, 64, 32, "2 H200s, 16384 x 8192"), (2, 132, 16, 16, "2 H200s, 4096 x 4096"),
                                        (4, 132, 32, 32, "4 H200s, 16384 x 8192"), (8, 132, 16, 32, "8 H200s, 16384 x 8192"),
                                        (8, 132, 8, 16, "8 H200s, 8192 x 4096")]:
        times = {rule: makespan(n, G, blocks, tiles_n, rule) for rule in ("static", "split", "split rotated", "claimed")}
        print(f"  {what}: ideal {n * blocks * tiles_n / G:.1f}, " + ", ".join(f"{k} {v}" for k, v in times.items()))


if __name__ == "__main__":
    main()
