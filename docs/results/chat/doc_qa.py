#!/usr/bin/env python3
"""RULER-style document QA through kvtrim's HTTP API (docs/results/chat/doc_qa.md, issue 40).

For every sample of a RULER samples file (`kvtrim eval ruler --dry-run --dump-samples F`) and
every press, the document is sent as the first user turn and the question as the next one
(`messages: [{user: DOC}, {user: QUESTION}]`, greedy, `max_tokens` = the task's), to a
`kvtrim serve --parallel 1` this script starts. Each (press, sample) is asked twice in a row:

  first  the slot holds another document: the request prefills the document, compresses it
         (the question is the protected tail, never compressed) and answers: what asking one
         question of a fresh document costs (re-prefilling per question costs this each time);
  again  the same request once more: the slot's conversation is [DOC, Q, answer], the server
         truncates it to the compressed document (a cached prefix; the earlier question and
         answer are dropped), prefills the question only and answers: "compress once, query
         many". The answer must equal the first one (same compressed document, same question).

Scored with RULER's scorers (string_match_all for niah/vt/cwe/fwe, string_match_part for qa),
as `kvtrim eval ruler` scores. Then, unless --no-eval, `kvtrim eval ruler --data SAMPLES`
runs the same samples and presses (the harness's protocol: one user turn, context compressed,
question and answer prefix not) for the side-by-side table.

Rows are appended to OUT_DIR/http.jsonl as each finishes; a rerun skips the (press, id) pairs
already there (resume). The eval runs resume by themselves (their --out files). A progress
line with ETA goes to stderr. Standard library only.

usage: doc_qa.py --kvtrim BIN -m MODEL --samples FILE --press none --press snapkv:0.5 ...
                 --out-dir DIR [-t THREADS] [-c CTX] [--port P] [--no-eval] [--report-only]
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict


def score(output, answers, metric):
    """RULER's string_match_all (fraction of references found, 0-100) or string_match_part
    (100 if any is found), case-insensitive, on the output with control characters turned
    into newlines and stripped (src/eval/scoring.cpp does the same)."""
    out = re.sub(r"[\x00-\x1f]", "\n", output).strip().lower()
    found = [a.lower() in out for a in answers]
    if metric == "part":
        return 100.0 if any(found) else 0.0
    return 100.0 * sum(found) / len(answers)


def metric_of(row):
    m = row.get("metric")
    if m:
        return m
    return "part" if row["task"].startswith("qa") else "all"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=3600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read()), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        raise SystemExit(f"doc_qa: {url} answered {e.code}: {e.read().decode()[:400]}")


def wait_ready(url, proc, log):
    # kvtrim serve loads the model, then binds; /health answers once it listens
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"doc_qa: kvtrim serve exited ({proc.returncode}): see {log}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)


def load_samples(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    ids, seen = [], defaultdict(int)
    for r in rows:
        ids.append(f"{r['task']}/{seen[r['task']]}")
        seen[r["task"]] += 1
    return list(zip(ids, rows))


def load_done(path):
    done = {}
    if os.path.exists(path):
        for line in open(path):
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line: rerun it
            done[(r["press"], r["id"])] = r
    return done


def progress(i, n, t0, what):
    el = time.monotonic() - t0
    eta = el / i * (n - i) if i else 0
    bar = "#" * int(30 * i / n)
    sys.stderr.write(f"\r[{bar:<30}] {i}/{n} {what[:40]:<40} {el/60:5.1f} min, ETA {eta/60:5.1f} min")
    sys.stderr.flush()


def ask(url, press, sample):
    body = {"messages": [{"role": "user", "content": sample["context"]},
                         {"role": "user", "content": sample["question"]}],
            "max_tokens": sample["max_new_tokens"], "temperature": 0, "kv_press": press}
    j, wall = post(url + "/v1/chat/completions", body)
    kv = j["kvtrim"]
    return {"output": j["choices"][0]["message"]["content"], "wall_s": wall,
            "prompt_tokens": j["usage"]["prompt_tokens"],
            "cached_tokens": j["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0),
            "completion_tokens": j["usage"]["completion_tokens"],
            "kv_bytes": kv["kv_bytes"], "kv_bytes_dense": kv["kv_bytes_dense"],
            "compression": kv.get("compression")}


def run_http(a, samples):
    out = os.path.join(a.out_dir, "http.jsonl")
    done = load_done(out)
    todo = [(p, i, s) for p in a.presses for i, s in samples if (p, i) not in done]
    if not todo:
        return
    port = a.port or free_port()
    url = f"http://127.0.0.1:{port}"
    log = os.path.join(a.out_dir, "serve.log")
    proc = subprocess.Popen([a.kvtrim, "serve", "-m", a.model, "--port", str(port), "-c", str(a.ctx),
                             "--parallel", "1", "-t", str(a.threads)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_ready(url, proc, log)
        t0 = time.monotonic()
        with open(out, "a") as f:
            for k, (press, sid, s) in enumerate(todo):
                progress(k, len(todo), t0, f"{press} {sid}")
                first = ask(url, press, s)
                again = ask(url, press, s)
                m = metric_of(s)
                row = {"press": press, "id": sid, "task": s["task"], "metric": m,
                       "answers": s["answers"] if isinstance(s["answers"], list) else [s["answers"]],
                       "first": first, "again": again}
                row["score"] = score(first["output"], row["answers"], m)
                row["score_again"] = score(again["output"], row["answers"], m)
                f.write(json.dumps(row) + "\n")
                f.flush()
            progress(len(todo), len(todo), t0, "done")
            sys.stderr.write("\n")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def eval_name(press):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", press)


def run_eval(a):
    for press in a.presses:
        out = os.path.join(a.out_dir, f"eval_{eval_name(press)}.jsonl")
        cmd = [a.kvtrim, "eval", "ruler", "-m", a.model, "--data", a.samples, "--out", out,
               "-t", str(a.threads)]
        if press != "none":
            cmd += ["--press", press]
        sys.stderr.write(f"eval ruler --press {press}\n")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def ruler_mean(rows, key):
    """RULER's average: mean per task, then over tasks."""
    by = defaultdict(list)
    for r in rows:
        by[r["task"]].append(r[key])
    return mean([mean(v) for v in by.values()]), sum(len(v) for v in by.values())


def report(a, samples):
    http = load_done(os.path.join(a.out_dir, "http.jsonl"))
    lines = ["| press | n | HTTP score | again: same answer | eval ruler score | KV / f16 (HTTP) "
             "| first request s (median) | again s (median) | again / first |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for press in a.presses:
        rows = [r for (p, _), r in http.items() if p == press]
        if not rows:
            continue
        s_http, n = ruler_mean(rows, "score")
        same = sum(r["first"]["output"] == r["again"]["output"] for r in rows)
        ev_path = os.path.join(a.out_dir, f"eval_{eval_name(press)}.jsonl")
        s_eval = "–"
        if os.path.exists(ev_path):
            ev = [json.loads(x) for x in open(ev_path) if x.strip()]
            if ev:
                se, ne = ruler_mean(ev, "score")
                s_eval = f"{se:.1f} (n {ne})"
        ratio = [r["first"]["kv_bytes"] / r["first"]["kv_bytes_dense"] for r in rows]
        w1 = sorted(r["first"]["wall_s"] for r in rows)
        w2 = sorted(r["again"]["wall_s"] for r in rows)
        med1, med2 = w1[len(w1) // 2], w2[len(w2) // 2]
        per = sorted(r["again"]["wall_s"] / r["first"]["wall_s"] for r in rows)
        lines.append(f"| {press} | {n} | {s_http:.1f} | {same}/{len(rows)} | {s_eval} | {mean(ratio):.3f} "
                     f"| {med1:.2f} | {med2:.2f} | {per[len(per) // 2]:.2f} |")
    print("\n".join(lines))
    print()
    print("| press | task | HTTP | eval ruler | context tokens | compressed before → after | "
          "loss estimate | HTTP output (first 60 chars) |")
    print("|---|---|---:|---:|---:|---|---:|---|")
    for press in a.presses:
        ev_path = os.path.join(a.out_dir, f"eval_{eval_name(press)}.jsonl")
        ev = {}
        if os.path.exists(ev_path):
            for x in open(ev_path):
                if x.strip():
                    r = json.loads(x)
                    ev[r["id"]] = r["score"]
        for sid, _ in samples:
            r = http.get((press, sid))
            if not r:
                continue
            c = r["first"].get("compression") or {}
            ba = (f"{c.get('compressed_tokens_before', 0):.0f} → {c.get('compressed_tokens_after', 0):.0f}"
                  if c.get("applied") else (c.get("note", "–") if c else "–"))
            loss = c.get("loss", {}).get("estimate")
            out = r["first"]["output"].replace("\n", " ").replace("|", "/")[:60]
            print(f"| {press} | {sid} | {r['score']:.0f} | {ev.get(sid, float('nan')):.0f} "
                  f"| {c.get('context_tokens', '–')} | {ba} | {'–' if loss is None else f'{loss:.3f}'} | {out} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvtrim", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--samples", required=True)
    ap.add_argument("--press", action="append", required=True,
                    help="a press spec (repeat; 'none' for the uncompressed baseline)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args()
    a.presses = a.press
    os.makedirs(a.out_dir, exist_ok=True)
    samples = load_samples(a.samples)
    if not a.report_only:
        run_http(a, samples)
        if not a.no_eval:
            run_eval(a)
    report(a, samples)


if __name__ == "__main__":
    main()
