#!/usr/bin/env python3
"""Seeded, deterministic LLM request traces of several shapes, in the
Mooncake JSONL format that kvpool-bench --trace replays (tools/trace.h).

    bench/workloads.py SHAPE [--seed N] [--scale X] > trace.jsonl
    bench/workloads.py --list

A trace's blocks are named the way an engine's prefix cache names them: a
block's id stands for its content *and everything before it*, so two
requests share a block only while their prompts agree from the first token
(ids are given out in order of first use, from 0). Each block is 512
tokens, as in the given trace. The same shape, seed and scale always give
the same bytes from the same interpreter (the benches and tests run
/usr/bin/python3; Python's random module seeds and draws alike across
recent versions, but does not promise it).

Shapes (see bench/README.md, "Traffic shapes"):
  chat      multi-turn conversations: each turn's prompt is the whole
            conversation so far plus a new message; a few system prompts
            shared by all; think times between turns, sessions interleaved.
  shared    many users behind a few long system prompts (Zipf popularity),
            each request a short question of its own, some followed up.
  rag       retrieval: a system prompt, then 2-4 documents of a corpus
            (Zipf popularity, in rank order), then the question.
  agentic   tool loops: a shared tool-definition prefix, a task, then steps
            that each append a tool's output; pauses between steps (some
            long, as a tool call or a human in the loop), subagents that
            branch from their parent's context.
  scan      one-shot prompts (never seen again) mixed with a hot set.
  loop      the same prompts requested in the same cyclic order, a working
            set a little larger than a mid-sized cache, with one-shot noise.
"""
import argparse
import json
import random
import sys

BLOCK_TOKENS = 512


class Blocks:
    """Prefix-chained block ids: (parent id, content) -> id."""

    def __init__(self):
        self.ids = {}

    def chain(self, contents, parent=-1):
        out = []
        for c in contents:
            key = (parent, c)
            bid = self.ids.get(key)
            if bid is None:
                bid = len(self.ids)
                self.ids[key] = bid
            out.append(bid)
            parent = bid
        return out


class Trace:
    def __init__(self):
        self.blocks = Blocks()
        self.requests = []  # (t_ms, seq, contents, output_tokens)
        self.unique = 0

    def fresh(self, n):
        """n blocks of new content."""
        self.unique += n
        return [("u", self.unique - n + i) for i in range(n)]

    def add(self, t_ms, contents, output_tokens, session=None, retain=False):
        """session, retain: what an orchestrator knows (agentic): the
        request's session, and whether the session will resume after it (a
        tool call is out), so its context is worth retaining until then."""
        self.requests.append((t_ms, len(self.requests), list(contents), output_tokens,
                              session, retain))

    def lines(self, rng):
        for t, _, contents, out, session, retain in sorted(self.requests,
                                                           key=lambda r: (r[0], r[1])):
            ids = self.blocks.chain(contents)
            # The last block is partly filled, as a prompt rarely ends on a block.
            tokens = len(ids) * BLOCK_TOKENS - rng.randrange(BLOCK_TOKENS)
            line = {"timestamp": int(t), "input_length": tokens, "output_length": out,
                    "hash_ids": ids}
            if session is not None:
                line["session"] = session
                line["retain"] = retain
            yield line


def zipf_picker(rng, n, s):
    weights = [1.0 / (i + 1) ** s for i in range(n)]
    order = list(range(n))
    rng.shuffle(order)  # popularity is not id order
    return lambda: order[rng.choices(range(n), weights)[0]]


def shape_chat(rng, tr, scale):
    systems = [[("sys", p, i) for i in range(rng.randint(2, 6))] for p in range(4)]
    sessions = int(600 * scale)
    t = 0.0
    for _ in range(sessions):
        t += rng.expovariate(1 / 1500.0)  # a new session every 1.5 s
        history = list(systems[rng.randrange(len(systems))])
        turn_t = t
        for _ in range(1 + min(int(rng.expovariate(1 / 4.0)), 30)):
            history += tr.fresh(rng.randint(1, 3))  # the user's message
            out = rng.randint(50, 900)
            tr.add(turn_t, history, out)
            history += tr.fresh(max(1, out // BLOCK_TOKENS))  # the answer joins the context
            turn_t += rng.expovariate(1 / 40000.0)  # think time, 40 s mean


def shape_shared(rng, tr, scale):
    prompts = [[("sys", p, i) for i in range(rng.randint(20, 70))] for p in range(8)]
    pick = zipf_picker(rng, len(prompts), 1.1)
    t = 0.0
    followups = []
    for _ in range(int(2000 * scale)):
        t += rng.expovariate(1 / 300.0)
        if followups and rng.random() < 0.15:
            ctx = followups.pop(rng.randrange(len(followups)))
            ctx = ctx + tr.fresh(rng.randint(1, 2))
        else:
            ctx = prompts[pick()] + tr.fresh(rng.randint(1, 6))
        tr.add(t, ctx, rng.randint(20, 400))
        if rng.random() < 0.3:
            followups.append(ctx + tr.fresh(1))
            if len(followups) > 200:
                followups.pop(0)


def shape_rag(rng, tr, scale):
    system = [("sys", 0, i) for i in range(2)]
    docs = [[("doc", d, i) for i in range(rng.randint(3, 12))] for d in range(400)]
    pick = zipf_picker(rng, len(docs), 0.9)
    t = 0.0
    for _ in range(int(3000 * scale)):
        t += rng.expovariate(1 / 300.0)
        chosen, k = [], rng.randint(2, 4)
        while len(chosen) < k:
            d = pick()
            if d not in chosen:
                chosen.append(d)
        ctx = list(system)
        for d in chosen:
            ctx += docs[d]
        tr.add(t, ctx + tr.fresh(1), rng.randint(50, 500))


def shape_agentic(rng, tr, scale):
    tools = [("tools", 0, i) for i in range(16)]
    events = []  # (t, agent context, steps left, session)
    t = 0.0
    for sid in range(int(90 * scale)):
        t += rng.expovariate(1 / 6000.0)
        events.append((t, tools + tr.fresh(rng.randint(2, 6)), rng.randint(4, 24), sid))
    sessions = len(events)
    while events:
        events.sort(key=lambda e: e[0])
        now, ctx, left, sid = events.pop(0)
        tr.add(now, ctx, rng.randint(30, 300), session=sid, retain=left > 1)
        ctx = ctx + tr.fresh(1)  # the model's tool call
        if left > 1:
            # A tool's output joins the context; the pause is the tool's run:
            # seconds mostly, minutes for some (a build, a human's approval).
            pause = rng.expovariate(1 / 3000.0) if rng.random() < 0.85 else rng.uniform(60e3, 300e3)
            events.append((now + pause, ctx + tr.fresh(rng.randint(1, 4)), left - 1, sid))
            if rng.random() < 0.08:  # a subagent starts from the parent's context
                events.append((now + rng.uniform(100, 2000), ctx + tr.fresh(2),
                               rng.randint(3, 12), sessions))
                sessions += 1


def shape_scan(rng, tr, scale):
    hot = [tr.fresh(8) for _ in range(60)]
    pick = zipf_picker(rng, len(hot), 0.8)
    t = 0.0
    for _ in range(int(3000 * scale)):
        t += rng.expovariate(1 / 300.0)
        if rng.random() < 0.6:
            tr.add(t, tr.fresh(rng.randint(10, 60)), rng.randint(10, 300))
        else:
            tr.add(t, hot[pick()] + tr.fresh(1), rng.randint(10, 300))


def shape_loop(rng, tr, scale):
    prompts = [tr.fresh(8) for _ in range(165)]
    t = 0.0
    for _ in range(int(20 * scale)):
        for p in prompts:
            t += rng.expovariate(1 / 300.0)
            tr.add(t, p + tr.fresh(1), rng.randint(10, 200))
            if rng.random() < 0.25:
                t += rng.expovariate(1 / 300.0)
                tr.add(t, tr.fresh(rng.randint(4, 12)), rng.randint(10, 200))


SHAPES = {"chat": shape_chat, "shared": shape_shared, "rag": shape_rag,
          "agentic": shape_agentic, "scan": shape_scan, "loop": shape_loop}


def generate(shape, seed=1, scale=1.0):
    """The trace's lines, as dicts."""
    rng = random.Random("%s/%d" % (shape, seed))
    tr = Trace()
    SHAPES[shape](rng, tr, scale)
    return list(tr.lines(rng))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", nargs="?", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", type=float, default=1.0, help="requests, relative to the default")
    ap.add_argument("--list", action="store_true", help="print the shapes' names")
    a = ap.parse_args(argv)
    if a.list:
        print("\n".join(SHAPES))
        return 0
    if a.shape is None:
        ap.error("a shape is required (--list names them)")
    if not a.scale > 0:
        ap.error("--scale must be positive")
    out = sys.stdout
    for line in generate(a.shape, a.seed, a.scale):
        out.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
