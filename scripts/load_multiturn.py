"""Multi-turn mode of scripts/load_test.py (`--multi-turn`): conversations behind a balancer.

--conversations conversations of 4 to 8 turns each (--concurrency of them at a time) go to --url
(nginx in front of kvtrim serve replicas, deploy/nginx/run_local.sh). Every turn carries its
conversation's key (the X-Conversation-Id header; `--key-in body`: prompt_cache_key in the body;
`--key-in derived`: none on the first turn, then the key its reply carried) and resends the
whole history, as a chat client does. Every --stream-every'th turn streams.
Reported: the cache hit rate of follow-up turns (cached_tokens / prompt tokens of turns 2+, as
usage.prompt_tokens_details reports them), throughput (requests/s, completion tokens/s), failed
turns (non-200, transport errors, streams cut before [DONE]), turns whose replica changed from the
conversation's previous turn (X-Kvtrim-Replica) and their hit rate (a re-prefill elsewhere), and,
from each --replicas URL's /metrics sampled every 0.5 s, the peak of kvtrim_kv_bytes_reserved and
kvtrim_kv_bytes_total against kvtrim_kv_budget_bytes. --signal AT:PID:SIG sends SIG (KILL, TERM)
to PID AT seconds into the run (a replica killed or drained mid-run).
"""
import http.client
import json
import os
import random
import signal
import threading
import time
import urllib.parse
import urllib.request

SYSTEM = ("You are a helpful assistant for a library. Answer briefly and precisely. The library opens at nine "
          "and closes at six, lends up to five books for three weeks, and has a reading room on the second "
          "floor, a children's corner, a map collection and public computers that need a library card.")
QUESTIONS = ["When does the library open?", "How many books can I borrow?", "Where is the reading room?",
             "Do I need a card for the computers?", "How long can I keep a book?", "Is there a map collection?",
             "What about children?", "When does it close?", "Can you summarise the rules?", "Thanks, anything else?"]


def metric_values(url, names):
    out = {}
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] in names:
                    out[parts[0]] = float(parts[1])
    except OSError:
        pass  # a replica that was killed or drained
    return out


def one_turn(base, key, key_in, messages, max_tokens, stream, seed):
    """One request; returns a dict with status, text, usage, replica, error, cut."""
    u = urllib.parse.urlparse(base)
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.7, "seed": seed, "stream": stream}
    headers = {"Content-Type": "application/json"}
    if key_in == "body":
        body["prompt_cache_key"] = key
    elif key:  # "header", or "derived" once the first reply gave the key
        headers["X-Conversation-Id"] = key
    if stream:
        body["stream_options"] = {"include_usage": True}
    res = {"status": 0, "text": "", "usage": None, "replica": "", "error": "", "cut": False, "stream": stream}
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
        c.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        r = c.getresponse()
        res["status"] = r.status
        res["replica"] = r.getheader("X-Kvtrim-Replica", "")
        res["key"] = r.getheader("X-Conversation-Id", "")
        if not stream or r.status != 200:
            data = r.read()
            if r.status == 200:
                j = json.loads(data)
                res["text"] = j["choices"][0]["message"]["content"]
                res["usage"] = j["usage"]
            else:
                res["error"] = data[:200].decode("utf-8", "replace")
            return res
        done = False
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            if line[6:] == "[DONE]":
                done = True
                break
            j = json.loads(line[6:])
            if "error" in j:
                res["error"] = j["error"]["message"]
                continue
            for ch in j.get("choices", []):
                res["text"] += ch.get("delta", {}).get("content", "") or ""
            if j.get("usage"):
                res["usage"] = j["usage"]
        if not done:
            res["cut"] = True
            res["error"] = "stream ended before [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as e:
        res["cut"] = stream and res["status"] == 200
        res["error"] = f"{type(e).__name__}: {e}"
    return res


def run(a):
    rng = random.Random(a.seed)
    convs = [{"key": f"lt{a.seed}-c{i}", "turns": rng.randint(4, 8)} for i in range(a.conversations)]
    replicas = [x for x in a.replicas.split(",") if x]
    names = ("kvtrim_kv_bytes_reserved", "kvtrim_kv_bytes_total", "kvtrim_kv_budget_bytes")
    peaks = {u: {n: 0.0 for n in names} for u in replicas}
    turns, lock = [], threading.Lock()
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            for u in replicas:
                for n, v in metric_values(u, names).items():
                    peaks[u][n] = max(peaks[u][n], v)
            stop.wait(0.5)

    def signaller(at, pid, sig):
        if not stop.wait(at):
            os.kill(pid, getattr(signal, "SIG" + sig))
            print(f"  t={at:.0f}s: SIG{sig} to pid {pid}", flush=True)

    pending = list(range(len(convs)))

    def worker(w):
        while True:
            with lock:
                if not pending:
                    return
                ci = pending.pop(0)
            c = convs[ci]
            key = "" if a.key_in == "derived" else c["key"]  # derived: the first reply's key from then on
            msgs = [{"role": "system", "content": SYSTEM}]
            prev = ""
            for t in range(c["turns"]):
                q = QUESTIONS[(ci + t) % len(QUESTIONS)]
                # the first message names the visitor: conversations differ from their first turn
                # (as real ones do), so their derived keys differ too
                msgs.append({"role": "user", "content": f"I am visitor {ci}. {q}" if t == 0 else q})
                stream = a.stream_every > 0 and (ci + t) % a.stream_every == 0
                r = one_turn(a.url, key, a.key_in, msgs, a.max_tokens, stream, a.seed * 7919 + ci * 31 + t)
                r.update(conv=ci, turn=t, t=time.time() - t0, moved=bool(prev and r["replica"] and r["replica"] != prev))
                with lock:
                    turns.append(r)
                prev = r["replica"] or prev
                key = key or r.get("key", "")
                msgs.append({"role": "assistant", "content": r["text"] or "(no answer)"})

    t0 = time.time()
    threads = [threading.Thread(target=sampler, daemon=True)]
    for s in a.signal:
        at, pid, sig = s.split(":")
        threads.append(threading.Thread(target=signaller, args=(float(at), int(pid), sig.upper()), daemon=True))
    workers = [threading.Thread(target=worker, args=(w,)) for w in range(a.concurrency)]
    for t in threads + workers:
        t.start()
    for t in workers:
        t.join()
    wall = time.time() - t0
    stop.set()

    ok = [r for r in turns if r["status"] == 200 and not r["error"]]
    follow = [r for r in ok if r["turn"] > 0 and r["usage"]]
    moved = [r for r in follow if r["moved"]]
    hit = lambda rs: (sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in rs) /
                      max(1, sum(r["usage"]["prompt_tokens"] for r in rs)))
    failed = [r for r in turns if r not in ok]
    out = {"mode": "multi-turn", "label": a.label, "conversations": len(convs), "turns": len(turns),
           "turns_ok": len(ok), "failed": len(failed),
           "failed_streams_cut": sum(1 for r in failed if r["cut"]),
           "failed_samples": [f"conv {r['conv']} turn {r['turn']} status {r['status']} stream {r['stream']}: "
                              f"{r['error'][:120]}" for r in failed[:5]],
           "follow_up_turns": len(follow), "follow_up_hit_rate": hit(follow),
           "moved_turns": len(moved), "moved_hit_rate": hit(moved) if moved else None,
           "seconds": round(wall, 1), "requests_per_s": len(ok) / wall,
           "completion_tok_s": sum(r["usage"]["completion_tokens"] for r in ok if r["usage"]) / wall,
           "prompt_tokens_prefilled": sum(r["usage"]["prompt_tokens"] - r["usage"]["prompt_tokens_details"]
                                          ["cached_tokens"] for r in ok if r["usage"]),
           "turns_per_replica": {}, "replica_peaks": peaks}
    for r in ok:
        out["turns_per_replica"][r["replica"]] = out["turns_per_replica"].get(r["replica"], 0) + 1
    print(json.dumps(out, indent=1), flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(out) + "\n")
    return out
