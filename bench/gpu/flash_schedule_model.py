#!/usr/bin/env python3
"""How long the fused attention's causal grid takes for the order its CTAs are dispatched in: a model, no GPU.

Causal CTAs differ in length: forward, query block i (of R rows) reads (i + 1) R/64 key tiles; backward, key block j
is read by the S/64 - j query blocks from its own. The hardware hands CTAs to free slots in the order of their linear
index. The model:
- each SM holds `slots` CTAs (the occupancy ncu reports);
- a CTA's time is `overhead` + its tiles, whatever else runs beside it (a latency-bound kernel's CTAs barely slow
  each other);
- a slot takes the next CTA in index order the moment it frees.
It prints the makespan against the perfect split of the same work, and the share of SM time with at least one CTA
resident (what ncu calls SM active cycles / elapsed cycles). Checked against the H200's ncu figures of the
block-fastest order: forward 78% active (model 81%), backward at 2 CTAs per SM 87% (model 87%).

  bench/gpu/flash_schedule_model.py [--sms 132] [--batch 8] [--heads 12] [--seq 1024] [--overhead 1]
"""
import argparse
import heapq


def schedule(costs, sms, slots):
    """(makespan, SM-active share) of CTAs of the given costs dispatched in list order."""
    free = [(0.0, slot) for slot in range(sms * slots)]
    heapq.heapify(free)
    runs = [[] for _ in range(sms)]
    for cost in costs:
        start, slot = heapq.heappop(free)
        runs[slot // slots].append((start, start + cost))
        heapq.heappush(free, (start + cost, slot))
    makespan = max(end for sm in runs for _, end in sm)
    active = 0.0
    for sm in runs:  # the union of each SM's CTA intervals
        lo = hi = None
        for start, end in sorted(sm):
            if hi is None or start > hi:
                active += 0 if hi is None else hi - lo
                lo, hi = start, end
            else:
                hi = max(hi, end)
        active += hi - lo
    return makespan, active / (sms * makespan)


def orders(batch, heads, blocks, tiles_per_block, overhead):
    """The CTA costs in each dispatch order. Rank 0 is the longest causal block (forward: the last query block, which
    reads every key tile; backward: the first key block, which every query block reads); each rank has
    tiles_per_block fewer 64-row tiles than the one before."""
    cost = [overhead + tiles_per_block * (blocks - rank) for rank in range(blocks)]
    return {
        # the block in blockIdx.x: each (head, sequence) runs its blocks from the longest to the shortest
        "block fastest": [c for _ in range(batch * heads) for c in cost],
        # the block in blockIdx.z (cta_grid): every head's longest CTAs first, the shortest last
        "block slowest": [c for c in cost for _ in range(batch * heads)],
    }


# (direction, rows per CTA, CTAs per SM as ncu or ptxas put them): the forward as measured (64 query rows, 125
# registers) and as built now (128 rows, two fragments per warp, ~240 registers); the backward at 2 CTAs per SM (228
# registers, unbounded) and 3 (the default bound).
CONFIGS = [("forward", 64, 4), ("forward", 128, 2), ("backward", 64, 2), ("backward", 64, 3)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--overhead", type=float, default=1.0, help="a CTA's fixed cost, in 64-row tiles")
    args = ap.parse_args()
    print(f"{args.sms} SMs, B {args.batch} x H {args.heads}, S {args.seq} causal, CTA overhead {args.overhead} tiles")
    print(f"{'direction':9s} {'rows':>4s} {'CTAs/SM':>7s}  {'order':13s}  {'makespan/ideal':>14s}  {'SM active':>9s}")
    for direction, rows, slots in CONFIGS:
        blocks = (args.seq + rows - 1) // rows
        for order, costs in orders(args.batch, args.heads, blocks, rows // 64, args.overhead).items():
            makespan, active = schedule(costs, args.sms, slots)
            ideal = sum(costs) / (args.sms * slots)
            print(f"{direction:9s} {rows:4d} {slots:7d}  {order:13s}  {makespan / ideal:14.3f}  {active:9.1%}")


if __name__ == "__main__":
    main()
