#!/usr/bin/env python3
"""Whether the one-kernel ring backward (NCCL_MK_RA_BWD_ONE_KERNEL=1) loses to the merged plan by
how its CTAs fill the SMs: a model of the grid's order, not of the kernel's timing. Rank 0 of 2,
causal zigzag (chunks 0 and 3 of 4), one CTA per (key tile of 128 keys, query head) and per SM;
a CTA takes `overhead` + its steps (64-row query tiles that see its key tile) time units; the
hardware starts each next CTA, in grid order, on the first SM that frees.
  one kernel  the peer block's tiles (chunks 1 and 2: every chunk-3 query tile, 64 steps) for
              every head, then the own block's (chunk 0: 128 - 2t steps; chunk 3: 64 - 2t), head
              by head (attn_bwd.cu: addends beside other blocks run block by block)
  merged      call A: chunk-0 queries against chunk 0's key tiles (64 - 2t); then call B:
              chunk-3 queries against every key tile (64, and 64 - 2t on chunk 3), head by head
Prints each plan's makespan against its work spread evenly over the SMs. Session 69: both
within 1.5% of even at 16K causal GQA (64 query heads), the one kernel's fewer CTAs ahead once
a CTA has any overhead, so its 2-8% loss on a whole GPU is not the order (bench/NOTES.md).
usage: bench/models/ring_bwd_tail.py [SMS] [QUERY_HEADS] [CHUNK_TILES]
"""
import heapq
import sys


def makespan(ctas, sms, overhead):
    free = [0.0] * sms
    for steps in ctas:
        heapq.heappush(free, heapq.heappop(free) + steps + overhead)
    return max(free)


def one_kernel(heads, tiles):
    peer = [2 * tiles] * (2 * tiles * heads)
    own = []
    for _ in range(heads):
        own += [4 * tiles - 2 * t for t in range(tiles)] + [2 * tiles - 2 * t for t in range(tiles)]
    return [peer + own]


def merged(heads, tiles):
    a, b = [], []
    for _ in range(heads):
        a += [2 * tiles - 2 * t for t in range(tiles)]
        b += [2 * tiles] * (3 * tiles) + [2 * tiles - 2 * t for t in range(tiles)]
    return [a, b]


def main():
    sms = int(sys.argv[1]) if len(sys.argv) > 1 else 132
    heads = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    tiles = int(sys.argv[3]) if len(sys.argv) > 3 else 32  # key tiles per chunk: 16K causal on 2 ranks
    print(f"# {sms} SMs, {heads} query heads, {tiles} key tiles per chunk; time units")
    print("# overhead  plan         CTAs  makespan  even    makespan/even")
    for overhead in (0, 2, 5, 10):
        for name, calls in (("one kernel", one_kernel(heads, tiles)), ("merged", merged(heads, tiles))):
            span = sum(makespan(c, sms, overhead) for c in calls)
            n = sum(len(c) for c in calls)
            even = sum(sum(c) + overhead * len(c) for c in calls) / sms
            print(f"{overhead:9d}  {name:10s} {n:6d} {span:9.0f} {even:7.0f} {span / even:10.4f}")


if __name__ == "__main__":
    main()
