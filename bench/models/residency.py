#!/usr/bin/env python3
"""Which GEMM+ReduceScatter / GEMM+AllReduce schedules finish, and how soon, when only R of a
rank's G CTAs can be resident at once (other kernels, or other MPS clients, hold the rest of the
SMs; a CTA that leaves frees its SM for the next to start). A model of the rules, not of the
kernel's timing: a tile takes one time unit; the tiles are in the rotated order (the next rank's
rows first, this rank's own last; raster groups inside a shard); a peer-row tile adds a partial
to its owner when it ends; an own-row tile starts only once every peer's partials of its
row-block are in (the storers' wait), and its CTA holds its SM while it waits. With the
all-reduce, an own row-block whose tiles are all done goes to every peer's gather slot, and each
rank's collect copies the peers' reduced row-blocks (items, instantly once complete). Every rank
has the same R (the hardest case).

Rules (bench/NOTES.md, sessions 36-38):
  rs static   CTA c walks slots c, c + G, .. (the walk before session 38; still the GEMM's walk
              without a call bracket)
  rs claimed  every CTA takes its next tile from one counter per rank, in order (gemm.h
              collect_claims, session 38): no tile belongs to a CTA before it runs
  ar new      the all-reduce's collect: items from a counter, only once every CTA started (a
              CTA that finds one not started leaves instead); with either rs rule
Prints, per shape, how many residencies 1..G end in a deadlock, and the makespan (tile times)
with every CTA resident and with a few CTAs short (one H200 under MPS gave one rank 60 SMs for
its 66 CTAs: the static walk's late CTAs then carry their whole share after the others end).
usage: bench/models/residency.py
"""


def walk(rank, n, blocks, tiles_n):
    return [((rank + 1 + i) % n, mb, nb) for i in range(n) for mb in range(blocks) for nb in range(tiles_n)]


def timed(n, G, R, blocks, tiles_n, rule, collect=False):
    """Tile times until every CTA of every rank has left; None on a deadlock."""
    seq = [walk(r, n, blocks, tiles_n) for r in range(n)]
    static = [[seq[r][c::G] for c in range(G)] for r in range(n)]
    pos = [[0] * G for _ in range(n)]
    cursor, items_next, started = [0] * n, [0] * n, [min(R, G)] * n
    running = [list(range(min(R, G))) for _ in range(n)]
    held = [[None] * G for _ in range(n)]          # the tile (or ("item", k)) a CTA waits on
    partial = [[0] * blocks for _ in range(n)]     # [owner][mb]: peer tiles in
    own_done = [[0] * blocks for _ in range(n)]    # [rank][mb]: own tiles done
    need, items = (n - 1) * tiles_n, (n - 1) * blocks
    t, pending = 0, []

    def next_work(r, c):
        if rule == "static":
            i = pos[r][c]
            pos[r][c] += 1
            if i < len(static[r][c]):
                return static[r][c][i]
        elif cursor[r] < len(seq[r]):
            cursor[r] += 1
            return seq[r][cursor[r] - 1]
        if collect and started[r] == G and items_next[r] < items:
            items_next[r] += 1
            return ("item", items_next[r] - 1)
        return None

    while True:
        for owner, mb, own in pending:
            (own_done if own else partial)[owner][mb] += 1
        pending, moved = [], False
        for r in range(n):
            i = 0
            while i < len(running[r]):
                c = running[r][i]
                if held[r][c] is None:
                    held[r][c] = next_work(r, c)
                    if held[r][c] is None:  # leaves; the next CTA starts in its place
                        running[r].pop(i)
                        if started[r] < G:
                            running[r].append(started[r])
                            started[r] += 1
                        moved = True
                        continue
                w = held[r][c]
                if w[0] == "item":
                    src, mb = (r + 1 + w[1] // blocks) % n, w[1] % blocks
                    if own_done[src][mb] == tiles_n:
                        held[r][c], moved = None, True
                        continue  # instant: take the next at once
                elif w[0] != r:
                    pending.append((w[0], w[1], False))
                    held[r][c], moved = None, True
                elif partial[r][w[1]] == need:
                    pending.append((r, w[1], True))
                    held[r][c], moved = None, True
                i += 1
        if all(not running[r] for r in range(n)):
            return t
        if not moved and not pending:
            return None
        t += 1


def main():
    shapes = [  # ranks, CTAs per rank, row-blocks per shard, column tiles; what it stands for
        (2, 66, 32, 2, "busy_sms's 8192 x 264 on 2 ranks under MPS (66 SMs each; 256-column tiles)"),
        (2, 66, 32, 16, "busy_sms_most's 8192 x 4096 on 2 ranks under MPS"),
        (4, 33, 16, 2, "4 ranks on one GPU, the 4-rank overlapped shape"),
        (8, 16, 32, 2, "8 ranks on one GPU (16 SMs each), 4096 rows per rank, N = 264"),
        (2, 132, 64, 32, "2 H200s, M = 16384 N = 8192 (132 CTAs)"),
    ]
    rules = [("rs static", "static", False), ("rs claimed", "claimed", False),
             ("ar new + rs static", "static", True), ("ar new + rs claimed", "claimed", True)]
    for n, G, blocks, tiles_n, what in shapes:
        print(f"{what}: n={n} G={G} row-blocks/shard={blocks} column tiles={tiles_n}")
        for name, rule, collect in rules:
            bad = [R for R in range(1, G + 1) if timed(n, G, R, blocks, tiles_n, rule, collect) is None]
            span = f" (R = {bad[0]}..{bad[-1]})" if bad else ""
            print(f"  {name:22s} deadlocks at {len(bad):3d} of {G} residencies{span}")
    print("makespan in tile times (ideal: tiles / resident CTAs), all resident | 6 short | 8 short:")
    for n, G, blocks, tiles_n, what in [(2, 66, 64, 32, "one H200 under MPS, 2 x 66, 16384 x 8192"),
                                        (2, 132, 64, 32, "2 H200s, 16384 x 8192"), (2, 132, 16, 16, "2 H200s, 4096 x 4096"),
                                        (4, 132, 32, 32, "4 H200s, 16384 x 8192"), (8, 132, 16, 32, "8 H200s, 16384 x 8192")]:
        row = []
        for R in (G, G - 6, G - 8):
            tiles = n * blocks * tiles_n
            spans = {rule: timed(n, G, R, blocks, tiles_n, rule) for rule in ("static", "claimed")}
            row.append(f"R {R}: ideal {tiles / R:.1f} " + " ".join(f"{k} {v}" for k, v in spans.items()))
        print(f"  {what}: " + " | ".join(row))


if __name__ == "__main__":
    main()
