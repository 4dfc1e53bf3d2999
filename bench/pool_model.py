#!/usr/bin/python3
"""A model of the prefix policy and of chain placement, replaying a trace.

It runs the rules of docs/eviction.md on plain Python lists instead of a
node, to tell what the design keeps from what the real nodes keep:

- one store, or N stores of a third (an Nth) of the capacity each;
- per store: probation and protected LRU lists (protected at most 70 % of
  the store's entries; its overflow goes back to probation's warm end),
  victims from probation's cold end, then protected's;
- a ghost of probation's evictions (exact, two generations of `window`
  keys each, as the Bloom filter pair remembers the last 1-2 windows): one
  per store, or one for the whole pool (the key homes' directory ghosts
  together), sized --ghost-window times the capacity;
- per request, as kvpool-bench --trace: the leading run of blocks held
  anywhere is hit (touched last to first, so the head is the most recent),
  the missing blocks after it are written, blocks held behind the first
  miss are neither written nor touched;
- written blocks enter probation (or protected, when the ghost remembers
  them) each just colder than the one before, on the store holding the
  block before them; a chain with no block before it goes to the store its
  writer has fed fewest blocks (writers take requests round-robin), or,
  with --balance global, the store fed fewest by all writers together;
- with --reader-slots, a read of blocks held by another store first frees
  as many slots on the writer's store (evicting), as a node does when it
  reserves a slot for each block it fetches;
- with --placement writer, a request's new blocks go to the store of the
  node it was sent to (placement local, reads keeping no replica);
- with --victims pool, a store that needs room evicts the pool's coldest
  entry (the least recently used among the stores' next victims, wherever
  it is), so the pool's victims go in one order of recency, as one
  store's would, and each store may hold more or less than its share:
  what eviction coordinated across the pool would do at best;
- with --placement hash, each block lives on the store its id hashes to
  (a key home, as --placement home), a request's new blocks written there
  in chain order, each store with its own ghost (a key always comes back
  to the same store);
- with --policy lru, every store is a plain LRU list (no protected list,
  no ghost; hits touched and blocks written first to last, as a node with
  --eviction lru does: one store then keeps exactly what kvpool-bench's
  offline LRU keeps), for what the placements cost a pool of plain LRU
  caches.

--sweep replays seven capacities around --capacity (0.88 to 1.13 times)
and prints the mean, smallest and largest ratio: a pool's ratio moves by a
few per cent between neighbouring capacities, so one capacity says little
about a change of the rules.

Usage: bench/pool_model.py [--trace FILE] [--capacity N] [--nodes N]
         [--ghost shared|local] [--ghost-window X] [--reader-slots]
         [--balance writer|global] [--placement chain|hash|writer]
         [--victims store|pool] [--policy prefix|lru] [--sweep]
Prints the block hit ratio of one store of the whole capacity and of the
pool, and their ratio.
"""
import argparse
import json
import os
from collections import OrderedDict


class Ghost:
    def __init__(self, window):
        self.window = max(1, int(window))
        self.now, self.before = set(), set()

    def add(self, key):
        self.now.add(key)
        if len(self.now) >= self.window:
            self.before, self.now = self.now, set()

    def __contains__(self, key):
        return key in self.now or key in self.before


class Store:
    def __init__(self, entries, ghost, clock, lru=False):
        self.entries = entries
        self.lru = lru  # protected holds nothing, the ghost is never asked
        self.clock = clock  # [now], shared by the stores of a pool
        self.last = {}  # key -> when last committed or hit
        self.pool = None  # --victims pool: every store of the pool
        self.protected_max = 0 if lru else entries * 7 // 10
        self.probation = OrderedDict()  # coldest first
        self.protected = OrderedDict()
        self.ghost = ghost

    def __contains__(self, key):
        return key in self.probation or key in self.protected

    def size(self):
        return len(self.probation) + len(self.protected)

    def _overflow(self):
        while len(self.protected) > self.protected_max:
            key, _ = self.protected.popitem(last=False)
            self.probation[key] = True

    def _stamp(self, key):
        self.clock[0] += 1
        self.last[key] = self.clock[0]

    def coldest(self):
        """When this store's next victim was last used."""
        d = self.probation if self.probation else self.protected
        return self.last[next(iter(d))]

    def touch(self, key):
        self._stamp(key)
        if key in self.probation:
            del self.probation[key]
        else:
            del self.protected[key]
        self.protected[key] = True
        self._overflow()

    def evict_one(self):
        if self.probation:
            key, _ = self.probation.popitem(last=False)
            self.ghost.add(key)
        else:
            key, _ = self.protected.popitem(last=False)
        del self.last[key]

    def make_room(self, free):
        if self.pool is None:
            while self.size() > self.entries - free:
                self.evict_one()
            return
        room = sum(s.entries for s in self.pool) - free
        while sum(s.size() for s in self.pool) > room:
            min((s for s in self.pool if s.size()), key=Store.coldest).evict_one()

    def insert_chain(self, keys):
        # Each block just colder than the one before: put in reverse at the
        # warm end, the chain's head ends warmest (lru: in order, the tail
        # warmest).
        for k in (keys if self.lru else reversed(keys)):
            self._stamp(k)
        back = [] if self.lru else [k for k in keys if k in self.ghost]
        new = keys if self.lru else [k for k in keys if k not in self.ghost]
        for k in (new if self.lru else reversed(new)):
            self.probation[k] = True
        for k in reversed(back):
            self.protected[k] = True
        self._overflow()
        self.make_room(0)


def hash_store(block, nodes):
    x = (block * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 29)) % nodes


def replay(trace, capacity, nodes, args):
    shared = Ghost(capacity * args.ghost_window)
    own_ghost = args.ghost == "local" or args.placement == "hash"
    clock = [0]
    stores = [
        Store(capacity // nodes,
              Ghost(capacity // nodes * args.ghost_window) if own_ghost else shared, clock,
              args.policy == "lru")
        for _ in range(nodes)
    ]
    if args.victims == "pool" and nodes > 1:
        for s in stores:
            s.pool = stores
    where = {}
    fed = [[0] * nodes for _ in range(nodes)]  # fed[writer][store]
    hits = refs = 0
    for ri, blocks in enumerate(trace):
        writer = ri % nodes
        refs += len(blocks)
        p = 0
        while p < len(blocks) and blocks[p] in where and blocks[p] in where[blocks[p]]:
            p += 1
        hits += p
        remote = sum(1 for b in blocks[:p] if where[b] is not stores[writer])
        # The hits first: a node pins the blocks it holds before it
        # reserves slots for the ones it fetches, and each holder touches
        # what it serves; the reservation then evicts none of them.
        for b in (blocks[:p] if args.policy == "lru" else reversed(blocks[:p])):
            where[b].touch(b)
        if args.reader_slots and nodes > 1 and args.placement in ("chain", "writer") and remote:
            stores[writer].make_room(remote)
        new = [b for b in blocks[p:] if not (b in where and b in where[b])]
        if not new:
            continue
        if args.placement == "hash" and nodes > 1:
            parts = {}
            for b in new:
                parts.setdefault(hash_store(b, nodes), []).append(b)
            for target, keys in parts.items():
                for b in keys:
                    where[b] = stores[target]
                stores[target].insert_chain(keys)
            continue
        if args.placement == "writer":
            target = writer
        elif p > 0:
            target = stores.index(where[blocks[p - 1]])
        elif args.balance == "global":
            target = min(range(nodes), key=lambda s: sum(f[s] for f in fed))
        else:
            target = min(range(nodes), key=lambda s: fed[writer][s])
        fed[writer][target] += len(blocks) - p
        for b in new:
            where[b] = stores[target]
        stores[target].insert_chain(new)
    return hits / refs


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=os.path.join(here, "..", "..", "shared", "traces",
                                                    "synthetic_trace.jsonl"))
    ap.add_argument("--capacity", type=int, default=4416, help="entries of the whole pool")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--ghost", choices=["shared", "local"], default="shared")
    ap.add_argument("--ghost-window", type=float, default=4.0,
                    help="ghost generation, times the capacity (4: --directory-ghost's default)")
    ap.add_argument("--reader-slots", action="store_true")
    ap.add_argument("--balance", choices=["writer", "global"], default="writer")
    ap.add_argument("--placement", choices=["chain", "hash", "writer"], default="chain",
                    help="chain placement's rules, each block on the store its id hashes to, "
                    "or on its writer's store")
    ap.add_argument("--victims", choices=["store", "pool"], default="store",
                    help="each store evicts its own coldest entry, or the pool's coldest")
    ap.add_argument("--policy", choices=["prefix", "lru"], default="prefix",
                    help="every store's policy: the prefix policy's rules, or plain LRU")
    ap.add_argument("--sweep", action="store_true",
                    help="seven capacities around --capacity; mean, smallest and largest ratio")
    args = ap.parse_args()
    with open(args.trace) as f:
        trace = [json.loads(line)["hash_ids"] for line in f if line.strip()]
    one_args = argparse.Namespace(**vars(args))
    one_args.ghost_window = 1.0  # one node's own ghost: 1-2 times its entries
    capacities = [args.capacity]
    if args.sweep:
        capacities = [round(args.capacity * f) for f in (0.88, 0.93, 0.97, 1.0, 1.04, 1.09, 1.13)]
    ratios = []
    for capacity in capacities:
        one = replay(trace, capacity, 1, one_args)
        pool = replay(trace, capacity, args.nodes, args)
        print("one store of %d entries: %.4f; %d stores of %d: %.4f (%.3f)" %
              (capacity, one, args.nodes, capacity // args.nodes, pool, pool / one))
        ratios.append(pool / one)
    print("metric model_pool_hit_vs_single %.3f" % (sum(ratios) / len(ratios)))
    if args.sweep:
        print("metric model_pool_hit_vs_single_min %.3f" % min(ratios))
        print("metric model_pool_hit_vs_single_max %.3f" % max(ratios))


if __name__ == "__main__":
    main()
