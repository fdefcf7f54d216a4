"""Past one PostgreSQL, in simulation: names (queues, namespaces, mailboxes, batchers) spread over K clusters by a
routing table, each cluster as fast as ``bench/servers.py`` measured one to be (docs/scaling.md).

    .venv/bin/python -m bench.clusters_sim [--results bench/servers-results.json] [--clusters 1,4,16]

The model: every operation belongs to one name and runs on the cluster the routing table gives that name (a
name never spans clusters: that is what keeps every guarantee inside one PostgreSQL). A cluster's capacity
is the measured rates of the best server count: an operation of kind k costs 1/rate_k seconds of it. Load per
name follows a Zipf law (``--skew`` 0 is uniform); the offered load is ``--utilization`` × K clusters'
worth. Time runs in 10 ms ticks for ``--seconds``: Poisson arrivals per cluster, first come first served,
backlog carried over. The offered load stays the same share of the clusters whatever K, so a routing table
that spreads it evenly keeps every wait as short as with one cluster. Two routing tables: ``hash`` (name hash mod K) and ``placed`` (names sorted by
their load, each put on the least-loaded cluster: what an operator's table does with measured loads).
Printed and written to ``--out``: achieved operations/s, the share of the offered load served, the busiest
cluster's load, the hottest name's share, and the p99 wait of an operation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TICK_S = 0.01
MIX = {"creates": 0.4, "processed": 0.4, "steps": 0.2}
"""What one operation is: every created interaction is processed once; machine steps beside them."""


@dataclass(frozen=True)
class Outcome:
    clusters: int
    skew: float
    routing: str
    offered: float
    achieved: float
    served: float
    """Achieved / offered: below 1, some cluster cannot keep up and its backlog grows without end."""
    busiest_load: float
    """Offered load of the busiest cluster over its capacity (> 1: it falls behind, whatever the others do)."""
    hottest_name_share: float
    p99_wait_ms: float


def cluster_capacity(results: dict[str, object]) -> dict[str, float]:
    """One cluster's ceiling per kind: the best rate over the measured server counts."""
    runs = results["runs"]  # type: ignore[index]
    return {kind: max(float(run[kind]["rate"]) for run in runs) for kind in MIX}  # type: ignore[attr-defined,index]


def cost_per_op(capacity: dict[str, float]) -> float:
    """Seconds of one cluster an average operation of the mix costs."""
    return sum(share / capacity[kind] for kind, share in MIX.items())


def zipf_shares(names: int, skew: float) -> list[float]:
    weights = [1 / (rank**skew) for rank in range(1, names + 1)]
    total = sum(weights)
    return [w / total for w in weights]


def route(shares: list[float], clusters: int, how: str) -> list[int]:
    """The routing table: name index → cluster."""
    if how == "hash":
        return [int.from_bytes(hashlib.sha256(f"name-{n}".encode()).digest()[:8], "big") % clusters for n in range(len(shares))]
    load = [0.0] * clusters
    table = [0] * len(shares)
    for n in sorted(range(len(shares)), key=lambda i: -shares[i]):
        target = min(range(clusters), key=load.__getitem__)
        table[n] = target
        load[target] += shares[n]
    return table


def poisson(rng: random.Random, mean: float) -> int:
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def percentile(weighted: list[tuple[float, int]], q: float) -> float:
    total = sum(n for _, n in weighted)
    seen = 0
    for value, n in sorted(weighted):
        seen += n
        if seen >= q * total:
            return value
    return 0.0


def simulate(clusters: int, skew: float, how: str, capacity: dict[str, float], args: argparse.Namespace) -> Outcome:
    rng = random.Random(args.seed)
    cost = cost_per_op(capacity)
    per_cluster_ops = 1 / cost
    offered = args.utilization * clusters * per_cluster_ops
    shares = zipf_shares(args.names, skew)
    table = route(shares, clusters, how)
    cluster_share = [0.0] * clusters
    for n, c in enumerate(table):
        cluster_share[c] += shares[n]
    backlog = [0.0] * clusters  # seconds of work waiting
    waits: list[tuple[float, int]] = []
    """(wait, how many arrivals waited that long)."""
    done = 0.0
    ticks = int(args.seconds / TICK_S)
    for _ in range(ticks):
        for c in range(clusters):
            arrivals = poisson(rng, offered * cluster_share[c] * TICK_S)
            if arrivals:
                # FIFO: an arrival waits for the work queued before it (within a tick they count as one).
                waits.append((backlog[c], arrivals))
            backlog[c] += arrivals * cost
            served = min(backlog[c], TICK_S)
            backlog[c] -= served
            done += served / cost
    achieved = done / args.seconds
    return Outcome(
        clusters=clusters, skew=skew, routing=how, offered=round(offered, 1), achieved=round(achieved, 1),
        served=round(min(1.0, achieved / offered), 3),
        busiest_load=round(max(cluster_share) * offered / per_cluster_ops, 2),
        hottest_name_share=round(shares[0], 4),
        p99_wait_ms=round(1000 * percentile(waits, 0.99), 1),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=HERE / "servers-results.json", help="bench/servers.py's output")
    parser.add_argument("--capacity", type=lambda v: {k: float(x) for k, x in (p.split("=") for p in v.split(","))},
                        default=None, help="one cluster's rates instead of --results, e.g. creates=675,processed=10063,steps=357")
    parser.add_argument("--clusters", type=lambda v: [int(x) for x in v.split(",")], default=[1, 4, 16])
    parser.add_argument("--skews", type=lambda v: [float(x) for x in v.split(",")], default=[0.0, 0.8, 1.0])
    parser.add_argument("--names", type=int, default=10_000, help="queues + namespaces + mailboxes + batchers")
    parser.add_argument("--utilization", type=float, default=0.8, help="offered load per cluster, as a share of its capacity")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--out", type=Path, default=HERE / "clusters-sim.json")
    args = parser.parse_args()
    if args.capacity is not None:
        capacity = args.capacity
        if set(capacity) != set(MIX):
            sys.exit(f"--capacity needs exactly {', '.join(MIX)}")
    elif args.results.exists():
        capacity = cluster_capacity(json.loads(args.results.read_text()))
    else:
        sys.exit(f"{args.results} is missing: run bench/servers.py first (or give --capacity)")
    per_cluster = 1 / cost_per_op(capacity)
    print(f"one cluster: {', '.join(f'{k} {v:,.0f}/s' for k, v in capacity.items())}; "
          f"at the mix {MIX}: {per_cluster:,.0f} operations/s")
    outcomes = [simulate(k, skew, how, capacity, args) for skew in args.skews for k in args.clusters for how in ("hash", "placed")
                if not (k == 1 and how == "placed")]
    print("| skew | clusters | routing | offered/s | achieved/s | served | busiest cluster load | hottest name | p99 wait |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for o in outcomes:
        print(f"| {o.skew} | {o.clusters} | {o.routing} | {o.offered:,.0f} | {o.achieved:,.0f} | {o.served:.0%} | "
              f"{o.busiest_load:.2f} | {o.hottest_name_share:.1%} | {o.p99_wait_ms:,.0f} ms |")
    args.out.write_text(json.dumps({"capacity": capacity, "mix": MIX, "per_cluster_ops": round(per_cluster, 1),
                                    "args": {k: v for k, v in vars(args).items() if k not in ("results", "out")},
                                    "outcomes": [asdict(o) for o in outcomes]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
