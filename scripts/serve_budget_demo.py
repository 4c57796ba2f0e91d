#!/usr/bin/env python3
"""How many long conversations does `kvtrim serve` hold in a fixed --kv-budget, and do they
still answer? For each configuration (uncompressed f16, a press, quantized cache types) the
script starts the server with the same budget, sends N conversations one after another (each
a RULER-style needle prompt of ~4k tokens through /v1/chat/completions), then asks each a
follow-up question. It reports the conversations still held at the end (slots with a cache),
the bytes held, evictions and pressure compressions (/metrics), the answers' accuracy on both
turns, and how many follow-ups found their conversation cached (usage cached_tokens).
Results go to --out (JSON lines, one per configuration, written as each completes).

  build/ci/kvtrim eval ruler -m smollm2 --ctx-len 4000 --samples 10 --tasks niah_single_1 \\
      --dry-run --dump-samples /tmp/niah4k.jsonl
  python3 scripts/serve_budget_demo.py --data /tmp/niah4k.jsonl --budget 512MiB
"""
import argparse
import json
import re
import subprocess
import sys
import time
import urllib.request

CONFIGS = {
    "f16": [],
    "snapkv:0.5": ["--press", "snapkv:0.5", "--pressure-press", "snapkv:0.5"],
    "q8": ["-ctk", "q8", "-ctv", "q8"],
}


def call(url, path, body=None):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return r.read().decode()


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def chat(url, messages):
    j = json.loads(call(url, "/v1/chat/completions",
                        {"messages": messages, "max_tokens": 24, "temperature": 0}))
    return j["choices"][0]["message"]["content"], j


def run_config(a, name, flags, samples):
    port = a.port
    cmd = [a.bin, "serve", "-m", a.model, "--port", str(port), "-c", str(a.ctx), "--parallel",
           str(len(samples)), "--kv-budget", a.budget, "-t", str(a.threads)] + flags
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                call(url, "/health")
                break
            except OSError:
                time.sleep(0.2)
        convs, first_ok, t0 = [], 0, time.time()
        for i, s in enumerate(samples):
            msgs = [{"role": "user", "content": s["context"] + "\n\n" + s["question"] +
                     " Answer with the number only."}]
            reply, j = chat(url, msgs)
            ok = any(ans in reply for ans in s["answers"])
            first_ok += ok
            convs.append((msgs + [{"role": "assistant", "content": reply}], s))
            print(f"  [{name}] conversation {i + 1}/{len(samples)}: {'right' if ok else 'wrong'} "
                  f"({j['usage']['prompt_tokens']} tokens, KV {j['kvtrim']['kv_bytes'] / 2**20:.1f} MiB)",
                  flush=True)
        slots = json.loads(call(url, "/v1/kvtrim/slots"))
        held = sum(1 for s in slots["slots"] if s["n_past"] > 0)
        held_bytes = slots["held_bytes"]
        m1 = call(url, "/metrics")
        follow_ok, cached = 0, 0
        for msgs, s in convs:
            reply, j = chat(url, msgs + [{"role": "user", "content": "Repeat that number."}])
            follow_ok += any(ans in reply for ans in s["answers"])
            cached += j["usage"]["prompt_tokens_details"]["cached_tokens"] > 0.5 * j["usage"]["prompt_tokens"]
        m2 = call(url, "/metrics")
        n = len(samples)
        r = {"config": name, "budget": a.budget, "conversations": n,
             "held_after_first_turns": held, "held_mib": held_bytes / 2**20,
             "evictions": metric(m1, "kvtrim_evictions_total"),
             "pressure_compressions": metric(m1, "kvtrim_pressure_compressions_total"),
             "first_turn_right": first_ok, "follow_up_right": follow_ok, "follow_ups_cached": cached,
             "evictions_after_follow_ups": metric(m2, "kvtrim_evictions_total"),
             "seconds": round(time.time() - t0, 1), "flags": " ".join(flags)}
        return r
    finally:
        srv.terminate()
        srv.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/ci/kvtrim")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--data", required=True, help="samples JSONL (kvtrim eval ruler --dump-samples)")
    ap.add_argument("--budget", default="512MiB")
    ap.add_argument("--ctx", type=int, default=4600)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=18123)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    samples = [json.loads(l) for l in open(a.data) if l.strip()]
    if not samples:
        sys.exit("serve_budget_demo: no samples in " + a.data)
    print(f"{'config':>11} {'held':>4} {'MiB':>7} {'evict':>5} {'press':>5} {'1st ok':>6} {'2nd ok':>6} {'cached':>6}")
    for name in a.configs.split(","):
        r = run_config(a, name, CONFIGS[name], samples)
        print(f"{name:>11} {r['held_after_first_turns']:>4} {r['held_mib']:>7.1f} {r['evictions']:>5.0f} "
              f"{r['pressure_compressions']:>5.0f} {r['first_turn_right']:>3}/{r['conversations']:<2} "
              f"{r['follow_up_right']:>3}/{r['conversations']:<2} {r['follow_ups_cached']:>3}/{r['conversations']:<2}",
              flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
