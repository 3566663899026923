#!/usr/bin/env python3
"""How long the fused attention's causal grid takes for the order its CTAs are dispatched in: a model, no GPU.

Causal CTAs differ in length: forward, query block i reads i + 1 key tiles; backward, key block j is read by the
S/64 - j query blocks from its own. The hardware hands CTAs to free slots in the order of their linear index. The model:
- each SM holds `slots` CTAs (the occupancy ncu reports);
- a CTA's time is `overhead` + its tiles, whatever else runs beside it (a latency-bound kernel's CTAs barely slow
  each other);
- a slot takes the next CTA in index order the moment it frees.
It prints the makespan against the perfect split of the same work, and the share of SM time with at least one CTA
resident (what ncu calls SM active cycles / elapsed cycles). Checked against the H200's ncu figures of the
block-fastest order: forward 78% active (model 81%), backward at 2 CTAs per SM 87% (model 87%).

  bench/gpu/flash_schedule_model.py [--sms 132] [--batch 8] [--heads 12] [--seq 1024] [--block 64]
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


def orders(batch, heads, blocks, overhead):
    """The CTA costs in each dispatch order. Rank 0 is the longest causal block (forward: the last query block, which
    reads every key tile; backward: the first key block, which every query block reads); rank r has r fewer tiles."""
    cost = [overhead + blocks - rank for rank in range(blocks)]
    return {
        # the block in blockIdx.x: each (head, sequence) runs its blocks from the longest to the shortest
        "block fastest": [c for _ in range(batch * heads) for c in cost],
        # the block in blockIdx.z (cta_grid): every head's longest CTAs first, the shortest last
        "block slowest": [c for c in cost for _ in range(batch * heads)],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--overhead", type=float, default=1.0, help="a CTA's fixed cost, in key or query tiles")
    args = ap.parse_args()
    blocks = (args.seq + args.block - 1) // args.block
    # CTAs per SM (ncu's occupancy): forward 4 (125 registers); backward 2 (228 registers) or 3 (168, the default)
    slots = {"forward": (4,), "backward": (2, 3)}
    print(f"{args.sms} SMs, B {args.batch} x H {args.heads}, {blocks} causal blocks of {args.block}, "
          f"CTA overhead {args.overhead} tiles")
    print(f"{'direction':9s} {'CTAs/SM':>7s}  {'order':13s}  {'makespan/ideal':>14s}  {'SM active':>9s}")
    for direction, counts in slots.items():
        for n in counts:
            for order, costs in orders(args.batch, args.heads, blocks, args.overhead).items():
                makespan, active = schedule(costs, args.sms, n)
                ideal = sum(costs) / (args.sms * n)
                print(f"{direction:9s} {n:7d}  {order:13s}  {makespan / ideal:14.3f}  {active:9.1%}")

if __name__ == "__main__":
    main()
