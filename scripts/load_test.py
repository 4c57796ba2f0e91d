#!/usr/bin/env python3
"""Load test of a running `kvtrim serve` over loopback (standard library only).

For each concurrency level (default 1, 4, 8, 16) it keeps that many streaming chat requests in
flight for --seconds, with prompts of mixed lengths, and reports completed requests, errors,
p50 / p99 latency, time to first token, aggregate decode tokens/s (completion tokens over the
level's wall time: prefills of new requests included), and from the server's /metrics its RSS
before and after and its own split of step time (decode tokens over decode time alone, and
prefill's share of the time). Results go to --out as JSON lines, one per level, written as each
level completes. Bounded in time: levels x (seconds + drain).

  build/ci/kvtrim serve -m smollm2 --parallel 16 -c 4096 --port 8080 &
  python3 scripts/load_test.py --url http://127.0.0.1:8080 --levels 1,4 --seconds 60

On a machine whose speed drifts within minutes (a shared VM), the levels of one run meet
different speeds; repeat them interleaved (--levels 1,4,1,4,1,4 --seconds 20): a level that
occurs more than once is then also summarised by its median decode tok/s, and the ratio of
medians to the first level's is printed at the end.

--multi-turn: conversations of 4-8 turns, each carrying its key, against replicas behind a load
balancer (scripts/load_multiturn.py; docs/results/scale_out/):

  deploy/nginx/run_local.sh start -n 3 -d /tmp/so && source /tmp/so/env
  python3 scripts/load_test.py --multi-turn --url $LB_URL --replicas ${REPLICA_URLS// /,} \
      --conversations 24 --concurrency 6
"""
import argparse
import json
import random
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

TOPICS = ["the history of the printing press", "how a refrigerator works", "the rules of chess",
          "why the sky is blue", "the life cycle of a star", "how vaccines train the immune system",
          "the causes of the French revolution", "how compilers optimise loops"]


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return float("nan")


def make_prompt(rng):
    # mixed lengths: 1 to 12 sentences of context before the question
    n = rng.choice([1, 2, 4, 8, 12])
    ctx = " ".join(f"Note {i}: {rng.choice(TOPICS)} is an interesting subject." for i in range(n))
    return f"{ctx}\nWrite a short paragraph about {rng.choice(TOPICS)}."


def one_request(url, rng, max_tokens, press):
    body = {"messages": [{"role": "user", "content": make_prompt(rng)}], "max_tokens": max_tokens,
            "temperature": 0.7, "seed": rng.randrange(1 << 30), "stream": True}
    if press:
        body["kv_press"] = press
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    first = None
    usage = None
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            j = json.loads(data)
            if "error" in j:
                raise RuntimeError(j["error"]["message"])
            if first is None:
                first = time.time() - t0
            if j.get("usage"):
                usage = j["usage"]
    return time.time() - t0, first or 0.0, usage["completion_tokens"] if usage else 0


def run_level(url, n, seconds, max_tokens, press, seed):
    stop_at = time.time() + seconds
    lat, ttft, toks, errors = [], [], [], []
    lock = threading.Lock()

    def worker(i):
        rng = random.Random(seed * 1000 + i)
        while time.time() < stop_at:
            try:
                l, f, t = one_request(url, rng, max_tokens, press)
                with lock:
                    lat.append(l)
                    ttft.append(f)
                    toks.append(t)
            except (urllib.error.URLError, RuntimeError, OSError, ValueError) as e:
                with lock:
                    errors.append(str(e))

    rss0 = metric(url, "kvtrim_process_resident_bytes")
    kv0 = metric(url, "kvtrim_kv_bytes_total")
    # the server's own split of its step time (each step's time shared by its prefill and decode
    # tokens): decode tok/s over decode time alone, and prefill's share of the time
    srv_names = ("kvtrim_decode_seconds_total", "kvtrim_prefill_seconds_total", "kvtrim_decode_tokens_total",
                 "kvtrim_prefill_tokens_total")
    srv0 = [metric(url, m) for m in srv_names]
    t0 = time.time()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    rss1 = metric(url, "kvtrim_process_resident_bytes")
    kv1 = metric(url, "kvtrim_kv_bytes_total")
    ds, ps, dt, pt = [b - a for a, b in zip(srv0, [metric(url, m) for m in srv_names])]
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")
    return {"streams": n, "seconds": round(wall, 1), "completed": len(lat), "errors": len(errors),
            "error_samples": errors[:3], "p50_latency_s": q(lat, 0.5), "p99_latency_s": q(lat, 0.99),
            "p50_ttft_s": q(ttft, 0.5), "completion_tokens": sum(toks),
            "decode_tok_s": sum(toks) / wall if wall > 0 else 0.0,
            "mean_tokens_per_request": statistics.mean(toks) if toks else 0.0,
            "server_decode_only_tok_s": dt / ds if ds > 0 else float("nan"),
            "server_prefill_share": ps / (ps + ds) if ps + ds > 0 else float("nan"),
            "server_prefill_tokens": int(pt) if pt == pt else 0,
            "rss_before_mib": rss0 / 2**20, "rss_after_mib": rss1 / 2**20,
            # the conversations the slots keep between requests (cache_prompt) are part of the RSS;
            # RSS minus them is what must not grow from round to round
            "kv_held_before_mib": kv0 / 2**20, "kv_held_after_mib": kv1 / 2**20,
            "rss_minus_kv_before_mib": (rss0 - kv0) / 2**20, "rss_minus_kv_after_mib": (rss1 - kv1) / 2**20,
            "press": press or "none"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--levels", default="1,4,8,16", help="concurrent streams per round")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--press", default="", help="kv_press of every request")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="", help="JSON lines, one per level (appended)")
    mt = ap.add_argument_group("multi-turn mode (scripts/load_multiturn.py)")
    mt.add_argument("--multi-turn", action="store_true", help="conversations of 4-8 turns, each with its key")
    mt.add_argument("--conversations", type=int, default=24)
    mt.add_argument("--concurrency", type=int, default=6, help="conversations in flight")
    mt.add_argument("--key-in", choices=["header", "body", "derived"], default="header",
                    help="X-Conversation-Id header, prompt_cache_key in the body, or none on the first turn and "
                         "the reply's derived key after")
    mt.add_argument("--stream-every", type=int, default=3, help="every Nth turn streams (0 = none)")
    mt.add_argument("--replicas", default="", help="comma-separated replica URLs whose /metrics are sampled")
    mt.add_argument("--signal", action="append", default=[], metavar="AT:PID:SIG",
                    help="send SIG (KILL, TERM) to PID AT seconds into the run")
    mt.add_argument("--label", default="")
    a = ap.parse_args()
    try:
        urllib.request.urlopen(a.url + "/health", timeout=5).read()
    except (urllib.error.URLError, OSError) as e:
        sys.exit(f"load_test: no server at {a.url}: {e}")
    if a.multi_turn:
        import load_multiturn  # scripts/, beside this file
        load_multiturn.run(a)
        return
    print(f"{'streams':>7} {'done':>5} {'err':>4} {'p50 s':>7} {'p99 s':>7} {'ttft s':>7} {'dec tok/s':>9} "
          f"{'RSS MiB':>15} {'KV held MiB':>13} {'RSS-KV MiB':>15}  (x first level; server: decode-only tok/s, "
          f"prefill share of step time)")
    base = None
    levels = [int(x) for x in a.levels.split(",")]
    per_level = {}
    per_level_srv = {}
    for n in levels:
        r = run_level(a.url, n, a.seconds, a.max_tokens, a.press, a.seed)
        per_level.setdefault(n, []).append(r["decode_tok_s"])
        per_level_srv.setdefault(n, []).append(r["server_decode_only_tok_s"])
        base = base or r["decode_tok_s"]
        r["decode_vs_first_level"] = r["decode_tok_s"] / base if base else 0.0
        print(f"{n:>7} {r['completed']:>5} {r['errors']:>4} {r['p50_latency_s']:>7.2f} {r['p99_latency_s']:>7.2f} "
              f"{r['p50_ttft_s']:>7.2f} {r['decode_tok_s']:>9.1f} {r['rss_before_mib']:>7.1f}->{r['rss_after_mib']:<7.1f}"
              f" {r['kv_held_before_mib']:>6.1f}->{r['kv_held_after_mib']:<6.1f}"
              f" {r['rss_minus_kv_before_mib']:>7.1f}->{r['rss_minus_kv_after_mib']:<7.1f}"
              f"  ({r['decode_vs_first_level']:.2f}x; {r['server_decode_only_tok_s']:.1f}, "
              f"{100 * r['server_prefill_share']:.0f} %)", flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(r) + "\n")
    if any(len(v) > 1 for v in per_level.values()):
        first = statistics.median(per_level[levels[0]])
        first_s = statistics.median(per_level_srv[levels[0]])
        print("medians over the repeated levels:")
        for n, v in per_level.items():
            m = statistics.median(v)
            ms = statistics.median(per_level_srv[n])
            print(f"{n:>7} streams: {m:9.1f} dec tok/s over {len(v)} level(s)  "
                  f"({m / first if first else 0.0:.2f}x the first level's median; server decode-only "
                  f"{ms:.1f} tok/s, {ms / first_s if first_s else 0.0:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
