#!/usr/bin/env python3
"""The same RULER-style samples through NVIDIA kvpress's own pipeline and through `kvtrim eval ruler`
(issue 13, item 4): scores side by side, scored by one rule, and the wall time of each tool.

What it does:
  1. Samples: `kvtrim eval ruler --dry-run --dump-samples OUT/samples.jsonl` (deterministic:
     sample i of a task depends on the seed only), or --data FILE. The JSONL has kvpress's RULER
     fields (task, context, question, answer_prefix, answers, max_new_tokens; plus metric);
     consecutive lines with the same task and context are one sample, as in kvtrim.
  2. Token check (once per OUT, needs gdb): kvtrim runs the first sample under gdb, which reads
     the token ids passed to Session::prefill (the context) and Session::generate (question +
     answer prefix); they are compared with the ids kvpress's pipeline builds (its own
     preprocess()). Written to OUT/token_check.json and printed.
  3. For each press (--presses, at --ratio): kvtrim (`eval ruler --data ... --format chat
     --press SPEC -t THREADS`) and kvpress (`pipeline("kv-press-text-generation")(context,
     questions=[...], answer_prefix=..., press=..., max_new_tokens=...)`, greedy, as kvpress's
     evaluation/evaluate.py runs RULER; model from the GGUF, dequantized to float32, sdpa).
     kvtrim's options are set to kvpress's defaults (tests/press/kvpress_ref_model_test.cpp
     checks these give kvpress's kept sets): snapkv window=64,kernel=5,pool=avg; streamingllm
     sinks=4; tova default; expected_attention window=1000000 (all prompt queries after the 4
     sinks),n_future=512,sinks=4,cov,vnorm,epsilon=0. kvtrim's cache is f32 (--kv-type) as
     transformers' DynamicCache.
  4. Scoring: kvtrim's score as written in its results; kvpress's outputs scored by the same
     rule reimplemented here from src/eval/scoring.cpp (control characters -> newline, strip
     ' \\n\\t\\r', ASCII-lowercase substring; string_match_all = 100 x fraction of references found,
     string_match_part = 100 if any; qa* -> part). The script re-scores kvtrim's outputs with it
     and reports whether every score agrees.
  5. Timing: wall seconds per sample, model loading excluded, both tools at --threads threads.
     kvpress: around the pipeline call. kvtrim: one process per press; a sample's time runs from
     kvtrim's "results:" line (model loaded, samples read) or the previous sample's last row to
     the moment its last row appears in kvtrim's results file (polled every 20 ms).
  Results go to OUT/results.jsonl, one line per (tool, press, sample), appended as each finishes;
  rerunning with the same OUT skips what is there (same tool setup, press, ratio, sample hash).
  OUT/summary.md: per-task scores (tool x press), RULER average, n, wall times and their ratio.

Protocol differences that remain (see the summary's notes): kvtrim prefills the context in
chunks of 256 (-b), kvpress in one pass; kvpress decodes with skip_special_tokens, kvtrim
concatenates token pieces; kvpress never checks its first generated token for EOS (it generates
on), kvtrim stops on any end-of-generation token. Answer prefix: kvtrim drops the prefix's leading
spaces (it follows the assistant header's newline); kvpress keeps RULER's " The special ..." /
" Answer:". By default (--answer-prefix kvtrim) kvpress is given the prefix without its leading
spaces, so both tools run the identical token ids; --answer-prefix raw gives kvpress the
dataset's prefix as kvpress's evaluation does.

Needs (never a dependency of the build or CI):
  /opt/kvpress-venv with kvpress==0.5.5 (python3 -m venv /opt/kvpress-venv &&
  /opt/kvpress-venv/bin/pip install kvpress==0.5.5 gguf); models/smollm2.gguf
  (scripts/install_models.py smollm2); a built kvtrim; gdb for the token check (else skipped).
usage:
  /opt/kvpress-venv/bin/python scripts/ref/kvpress_ruler.py --samples 5 --ctx-len 2048 \\
      --presses none,snapkv,streamingllm,tova,expected_attention --ratio 0.5 --threads 2 \\
      --out /tmp/kvpress_ruler [--kvtrim build/release/kvtrim] [--tasks niah_single_1,qa_1]
"""
import argparse
import json
import os
import queue
import shlex
import shutil
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name -> (kvpress class, kwargs beyond compression_ratio, kvtrim spec with {r}). The kvtrim
# options are kvpress's defaults, as verified in tests/press/kvpress_ref_model_test.cpp.
PRESSES = {
    "none": (None, {}, None),
    "snapkv": ("SnapKVPress", {}, "snapkv:ratio={r},window=64,kernel=5,pool=avg"),
    "streamingllm": ("StreamingLLMPress", {}, "streamingllm:ratio={r},sinks=4"),
    "tova": ("TOVAPress", {}, "tova:ratio={r}"),
    "expected_attention": ("ExpectedAttentionPress", {},
                           "expected_attention:ratio={r},window=1000000,n_future=512,sinks=4,cov=true,vnorm=true,"
                           "epsilon=0"),
    "knorm": ("KnormPress", {}, "knorm:ratio={r}"),
    "pyramidkv": ("PyramidKVPress", {}, "pyramidkv:ratio={r},window=64,kernel=5,pool=avg,beta=20"),
}
TOOLS = ("kvtrim", "kvpress")


# ---- samples and the scorer (src/eval/scoring.cpp, src/eval/rng.h) ----

def fnv1a64(data: bytes, h=0xCBF29CE484222325):
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def content_hash(s):
    """EvalSample::content_hash: the sample_hash kvtrim writes."""
    h = fnv1a64(s["task"].encode())
    h = fnv1a64(("\x1f" + s["context"]).encode(), h)
    for q in s["questions"]:
        h = fnv1a64(("\x1e" + q["question"] + "\x1f" + q["answer_prefix"] + "\x1f" + str(q["max_new_tokens"])).encode(), h)
        for a in q["answers"]:
            h = fnv1a64(("\x1d" + a).encode(), h)
    return "%016x" % h


def ascii_lower(s):
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in s)


def postprocess(pred):
    s = "".join("\n" if ord(c) < 0x20 else c for c in pred)
    return s.strip(" \n\t\r")


def score(metric, pred, refs):
    p = ascii_lower(postprocess(pred))
    if metric == "part":
        return 100.0 if any(ascii_lower(r) in p for r in refs) else 0.0
    if not refs:
        return 0.0
    return 100.0 * sum(ascii_lower(r) in p for r in refs) / len(refs)


def load_samples(path):
    """Consecutive lines with the same task and context are one sample (as kvtrim's --data)."""
    samples, per_task = [], {}
    with open(path, encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            d = json.loads(line)
            ans = d["answers"] if isinstance(d["answers"], list) else [d["answers"]]
            q = {"question": d["question"], "answer_prefix": d.get("answer_prefix", ""), "answers": ans,
                 "max_new_tokens": int(d["max_new_tokens"])}
            if samples and samples[-1]["task"] == d["task"] and samples[-1]["context"] == d["context"]:
                samples[-1]["questions"].append(q)
                continue
            metric = d.get("metric") or ("part" if d["task"].startswith("qa") else "all")
            idx = per_task.get(d["task"], 0)
            per_task[d["task"]] = idx + 1
            samples.append({"task": d["task"], "index": idx, "id": f"{d['task']}/{idx}", "context": d["context"],
                            "metric": metric, "questions": [q], "line": ln})
    for s in samples:
        s["hash"] = content_hash(s)
    return samples


def write_samples(path, samples, max_new_tokens=None):
    with open(path, "w", encoding="utf-8") as f:
        for s in samples:
            for q in s["questions"]:
                f.write(json.dumps({"task": s["task"], "context": s["context"], "question": q["question"],
                                    "answer_prefix": q["answer_prefix"], "answers": q["answers"],
                                    "max_new_tokens": max_new_tokens or q["max_new_tokens"], "metric": s["metric"]},
                                   ensure_ascii=False) + "\n")


def kvpress_prefix(ap, mode):
    # kvtrim's PromptBuilder::question_tokens drops the prefix's leading spaces (' ' only).
    return ap.lstrip(" ") if mode == "kvtrim" else ap


# ---- results file ----

class Results:
    def __init__(self, path):
        self.path = path
        self.rows = []
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = f.read()
            if data and not data.endswith(b"\n"):  # a torn last line: cut it, it runs again
                data = data[: data.rfind(b"\n") + 1]
                with open(path, "wb") as f:
                    f.write(data)
            for line in data.decode("utf-8").splitlines():
                if line.strip():
                    self.rows.append(json.loads(line))
        self.done = {self.key(r) for r in self.rows}
        self.f = open(path, "a", encoding="utf-8")

    @staticmethod
    def key(r):
        return (r["tool"], r["setup"], r["press"], r["ratio"], r["id"], r["sample_hash"])

    def add(self, row):
        self.f.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.f.flush()
        self.rows.append(row)
        self.done.add(self.key(row))


# ---- kvtrim ----

def kvtrim_cmd(args, data, out, spec, extra=()):
    cmd = [args.kvtrim, "eval", "ruler", "-m", args.model, "--data", data, "--samples", "1000000", "--format", "chat",
           "--kv-type", args.kv_type, "-t", str(args.threads), "--out", out]
    if spec:
        cmd += ["--press", spec]
    return cmd + shlex.split(args.kvtrim_extra) + list(extra)


def run_kvtrim(args, press, ratio, spec, pending, setup, res, progress):
    """Runs the pending samples in one kvtrim process; a row per sample as its last question lands."""
    tag = f"{press}_{ratio:g}" if spec else press
    if args.kvtrim_extra:  # its own files: another setup
        tag += "_" + "".join(c if c.isalnum() else "_" for c in args.kvtrim_extra).strip("_")
    data = os.path.join(args.out, f"kvtrim_in_{tag}.jsonl")
    out = os.path.join(args.out, f"kvtrim_out_{tag}.jsonl")
    log = os.path.join(args.out, f"kvtrim_{tag}.log")
    write_samples(data, pending)
    if os.path.exists(out):
        os.remove(out)
    # kvtrim numbers the samples of --data by their order per task: rebuild those ids.
    local = {}
    cnt = {}
    for s in pending:
        i = cnt.get(s["task"], 0)
        cnt[s["task"]] = i + 1
        local[f"{s['task']}/{i}"] = s
    cmd = kvtrim_cmd(args, data, out, spec)
    started = threading.Event()
    lines = queue.Queue()
    with open(log, "w") as logf:
        logf.write(" ".join(cmd) + "\n")
        logf.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)

        def read_err():
            for line in proc.stderr:
                lines.put(line)
                if line.startswith("results:"):
                    started.set()

        def read_out():
            for line in proc.stdout:
                lines.put(line)

        th = [threading.Thread(target=read_err, daemon=True), threading.Thread(target=read_out, daemon=True)]
        for t in th:
            t.start()
        t_last = None
        got = {}  # local id -> list of rows
        pos = 0
        buf = b""
        while True:
            alive = proc.poll() is None
            now = time.perf_counter()
            if t_last is None and started.is_set():
                t_last = now
            if os.path.exists(out):
                with open(out, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                pos += len(chunk)
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    r = json.loads(line)
                    got.setdefault(r["id"], []).append(r)
                    s = local[r["id"]]
                    if r["sample_hash"] != s["hash"]:
                        raise SystemExit(f"kvtrim row {r['id']}: sample_hash {r['sample_hash']} != {s['hash']}")
                    if len(got[r["id"]]) == len(s["questions"]):
                        rows = sorted(got[r["id"]], key=lambda x: x["q"])
                        wall = now - (t_last if t_last is not None else now)
                        t_last = now
                        py = [score(s["metric"], x["output"], x["answers"]) for x in rows]
                        row = {"tool": "kvtrim", "setup": setup, "press": press, "ratio": ratio if spec else 0.0,
                               "spec": spec or "none", "id": s["id"], "task": s["task"], "sample_hash": s["hash"],
                               "metric": s["metric"], "scores": [x["score"] for x in rows],
                               "score": sum(x["score"] for x in rows) / len(rows), "py_scores": py,
                               "outputs": [x["output"] for x in rows], "answers": [x["answers"] for x in rows],
                               "wall_s": round(wall, 4), "threads": args.threads,
                               "n_context": rows[0]["n_context"], "n_question": [x["n_question"] for x in rows],
                               "n_generated": [x["n_generated"] for x in rows],
                               "context_prefill_s": rows[0]["context_prefill_s"],
                               "decode_tps": [x["decode_tps"] for x in rows], "stop": [x["stop"] for x in rows],
                               "kv_bytes": rows[0]["kv_bytes"], "kv_bytes_dense": rows[0]["kv_bytes_dense"]}
                        res.add(row)
                        progress(row)
            while not lines.empty():
                logf.write(lines.get())
            logf.flush()
            if not alive:
                break
            time.sleep(0.02)
        for t in th:
            t.join(timeout=5)
        while not lines.empty():
            logf.write(lines.get())
    if proc.returncode != 0:
        raise SystemExit(f"kvtrim failed (exit {proc.returncode}); see {log}")
    missing = [k for k, s in local.items() if len(got.get(k, [])) != len(s["questions"])]
    if missing:
        raise SystemExit(f"kvtrim wrote no rows for {missing[:5]}... ; see {log}")


# ---- kvpress ----

class Kvpress:
    def __init__(self, args):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
        from transformers.utils import logging as hf_logging
        import kvpress  # noqa: F401  (registers the pipeline)

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        torch.set_num_threads(args.threads)
        self.torch = torch
        self.kvp = kvpress
        t = time.perf_counter()
        self.tok = AutoTokenizer.from_pretrained(args.model_dir, gguf_file=args.gguf)
        self.model = AutoModelForCausalLM.from_pretrained(args.model_dir, gguf_file=args.gguf, dtype=torch.float32,
                                                          attn_implementation="sdpa")
        self.model.eval()
        self.pipe = pipeline("kv-press-text-generation", model=self.model, tokenizer=self.tok, device="cpu")
        self.load_s = time.perf_counter() - t
        # Per call: the first inner-model call is the context prefill (with the press); every
        # outer call after it produces one token.
        self.n_outer = 0
        self.t_inner = []
        self.model.register_forward_pre_hook(lambda m, a: setattr(self, "n_outer", self.n_outer + 1))
        self.model.model.register_forward_pre_hook(lambda m, a: self.t_inner.append(time.perf_counter()))
        self.model.model.register_forward_hook(lambda m, a, o: self.t_inner.append(time.perf_counter()))
        print(f"kvpress: model loaded in {self.load_s:.1f} s (kvpress {_version('kvpress')}, transformers "
              f"{_version('transformers')}, torch {torch.__version__}, {torch.get_num_threads()} threads)", flush=True)

    def make_press(self, press, ratio):
        cls, kw, _ = PRESSES[press]
        return None if cls is None else getattr(self.kvp, cls)(compression_ratio=ratio, **kw)

    def run(self, s, press_obj, ap_mode):
        qs = s["questions"]
        aps = {q["answer_prefix"] for q in qs}
        mnts = {q["max_new_tokens"] for q in qs}
        if len(aps) != 1 or len(mnts) != 1:
            raise SystemExit(f"{s['id']}: questions of one context need one answer_prefix and max_new_tokens (kvpress)")
        self.n_outer = 0
        self.t_inner = []
        t0 = time.perf_counter()
        with self.torch.inference_mode():
            out = self.pipe(s["context"], questions=[q["question"] for q in qs],
                            answer_prefix=kvpress_prefix(qs[0]["answer_prefix"], ap_mode), press=press_obj,
                            max_new_tokens=qs[0]["max_new_tokens"])
        wall = time.perf_counter() - t0
        prefill = self.t_inner[1] - self.t_inner[0] if len(self.t_inner) >= 2 else None
        return out["answers"], wall, prefill, self.n_outer

    def ids(self, s, ap_mode):
        q = s["questions"][0]
        t = self.pipe.preprocess(s["context"], questions=[q["question"]],
                                 answer_prefix=kvpress_prefix(q["answer_prefix"], ap_mode), max_context_length=int(1e10))
        return t["context_ids"][0].tolist(), t["questions_ids"][0][0].tolist()


def _version(p):
    import importlib.metadata as md
    return md.version(p)


# ---- token check through gdb ----

GDB_SCRIPT = r"""
set pagination off
set confirm off
python
import gdb, json
out = {}
def vec_ints(addr):
    inf = gdb.selected_inferior()
    b, e = [int.from_bytes(inf.read_memory(addr + 8 * i, 8).tobytes(), 'little') for i in range(2)]
    m = inf.read_memory(b, e - b).tobytes()
    return [int.from_bytes(m[4 * i:4 * i + 4], 'little', signed=True) for i in range((e - b) // 4)]
class BP(gdb.Breakpoint):
    def __init__(self, spec, key, reg):
        super().__init__(spec, internal=True)
        self.key, self.reg = key, reg
    def stop(self):
        if self.key not in out:
            out[self.key] = vec_ints(int(gdb.parse_and_eval(self.reg)))
            with open(OUTFILE, 'w') as f:
                json.dump(out, f)
        return False
# Session::prefill(const std::vector<int>&): this in rdi, the vector in rsi. Session::generate
# returns a GenerateResult by value: the return slot in rdi, this in rsi, the vector in rdx.
BP('kvtrim::Session::prefill(std::vector<int, std::allocator<int> > const&)', 'context', '$rsi')
BP("kvtrim::Session::generate(std::vector<int, std::allocator<int> > const&, kvtrim::GenerateParams const&, "
   "std::function<bool (int, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > "
   "const&)> const&)", 'question', '$rdx')
end
run
quit
"""


def token_check(args, kp, sample):
    path = os.path.join(args.out, "token_check.json")
    if not shutil.which("gdb"):
        print("token check: gdb not found, skipped", flush=True)
        return
    one = os.path.join(args.out, "token_check_sample.jsonl")
    write_samples(one, [sample], max_new_tokens=1)
    ids_file = os.path.join(args.out, "token_check_kvtrim_ids.json")
    if os.path.exists(ids_file):
        os.remove(ids_file)
    gdb_file = os.path.join(args.out, "token_check.gdb")
    with open(gdb_file, "w") as f:
        f.write(GDB_SCRIPT.replace("OUTFILE", repr(ids_file)))
    kout = os.path.join(args.out, "token_check_kvtrim_out.jsonl")
    if os.path.exists(kout):
        os.remove(kout)
    cmd = ["gdb", "-q", "-batch", "-x", gdb_file, "--args"] + kvtrim_cmd(args, one, kout, None)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if not os.path.exists(ids_file):
        print(f"token check: gdb captured nothing (exit {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        return
    with open(ids_file) as f:
        kt = json.load(f)
    res = {"sample": sample["id"], "sample_hash": sample["hash"], "kvtrim": kt}
    for mode in ("kvtrim", "raw"):
        c, q = kp.ids(sample, mode)
        res[f"kvpress_{mode}_prefix"] = {"context": c, "question": q,
                                         "context_equal": c == kt.get("context"), "question_equal": q == kt.get("question")}
    with open(path, "w") as f:
        json.dump(res, f)
    kc, kq = kt.get("context", []), kt.get("question", [])
    print(f"token check on {sample['id']} (kvtrim ids read by gdb at Session::prefill / Session::generate):")
    print(f"  kvtrim  context  n={len(kc)} {kc[:12]} ... {kc[-8:]}")
    print(f"  kvtrim  question n={len(kq)} {kq[:6]} ... {kq[-14:]}")
    for mode in ("kvtrim", "raw"):
        r = res[f"kvpress_{mode}_prefix"]
        print(f"  kvpress context  n={len(r['context'])} {r['context'][:12]} ... {r['context'][-8:]}  "
              f"identical: {r['context_equal']}   [answer prefix: {mode}]")
        print(f"  kvpress question n={len(r['question'])} {r['question'][:6]} ... {r['question'][-14:]}  "
              f"identical: {r['question_equal']}")
    print(flush=True)


# ---- summary ----

def summarize(args, samples, presses, res, setups, notes):
    hashes = {s["id"]: s["hash"] for s in samples}
    tasks = []
    for s in samples:
        if s["task"] not in tasks:
            tasks.append(s["task"])
    n_task = {t: sum(1 for s in samples if s["task"] == t) for t in tasks}
    cell = {}  # (tool, press) -> {id: row}
    for r in res.rows:
        if hashes.get(r["id"]) != r["sample_hash"] or r["setup"] != setups[r["tool"]]:
            continue
        ratio = args.ratio if PRESSES[r["press"]][2] else 0.0
        if r["press"] not in presses or abs(r["ratio"] - ratio) > 1e-9:
            continue
        cell.setdefault((r["tool"], r["press"]), {})[r["id"]] = r
    L = []
    L.append(f"# kvtrim vs kvpress on RULER-style samples ({args.model}, ctx-len {args.ctx_len}, ratio {args.ratio:g}, "
             f"{args.threads} thread{'s' if args.threads != 1 else ''})\n")
    L.append(f"Samples: {os.path.relpath(args.samples_file, args.out)} ({len(samples)} samples, {len(tasks)} tasks); "
             f"kvtrim: {setups['kvtrim']}; kvpress: {setups['kvpress']}.\n")
    cols = [(p, t) for p in presses for t in TOOLS]
    L.append("| task | n | " + " | ".join(f"{p} {t}" for p, t in cols) + " |")
    L.append("|---|---:|" + "---:|" * len(cols))
    avg = {c: [] for c in cols}
    for task in tasks:
        cells = []
        for p, t in cols:
            rows = [r for r in cell.get((t, p), {}).values() if r["task"] == task]
            if not rows:
                cells.append("—")
                continue
            m = sum(r["score"] for r in rows) / len(rows)
            avg[(p, t)].append(m)
            cells.append(f"{m:.1f}" + (f" ({len(rows)})" if len(rows) != n_task[task] else ""))
        L.append(f"| {task} | {n_task[task]} | " + " | ".join(cells) + " |")
    L.append("| **average** | " + str(len(samples)) + " | " +
             " | ".join(f"**{sum(v) / len(v):.1f}**" if v else "—" for v in avg.values()) + " |")
    L.append("")
    L.append("(cell = mean score over the task's samples; `(k)` = only k of n done; average = mean over tasks, RULER's.)\n")
    L.append("| press | n (both) | kvtrim s/sample | kvpress s/sample | kvtrim / kvpress | kvtrim context prefill s | "
             "kvpress context prefill s | same output |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    tot = {"kvtrim": 0.0, "kvpress": 0.0, "n": 0}
    for p in presses:
        a, b = cell.get(("kvtrim", p), {}), cell.get(("kvpress", p), {})
        both = [i for i in a if i in b]
        if not both:
            L.append(f"| {p} | 0 | " + " | ".join(
                [f"{sum(r['wall_s'] for r in a.values()) / len(a):.2f} ({len(a)})" if a else "—",
                 f"{sum(r['wall_s'] for r in b.values()) / len(b):.2f} ({len(b)})" if b else "—"]) + " | — | — | — | — |")
            continue
        wa = sum(a[i]["wall_s"] for i in both) / len(both)
        wb = sum(b[i]["wall_s"] for i in both) / len(both)
        pa = sum(a[i]["context_prefill_s"] for i in both) / len(both)
        pbs = [b[i]["context_prefill_s"] for i in both if b[i].get("context_prefill_s") is not None]
        pb = sum(pbs) / len(pbs) if pbs else float("nan")
        same = sum(1 for i in both if [postprocess(o) for o in a[i]["outputs"]] == [postprocess(o) for o in b[i]["outputs"]])
        tot["kvtrim"] += sum(a[i]["wall_s"] for i in both)
        tot["kvpress"] += sum(b[i]["wall_s"] for i in both)
        tot["n"] += len(both)
        L.append(f"| {p} | {len(both)} | {wa:.2f} | {wb:.2f} | {wa / wb:.3f} | {pa:.2f} | {pb:.2f} | {same}/{len(both)} |")
    if tot["n"]:
        L.append(f"| **all** | {tot['n']} | {tot['kvtrim'] / tot['n']:.2f} | {tot['kvpress'] / tot['n']:.2f} | "
                 f"{tot['kvtrim'] / tot['kvpress']:.3f} | | | |")
    L.append("")
    L.append("(wall seconds per sample, model loading excluded, over the samples both tools ran; same output = "
             "identical postprocessed outputs.)\n")
    kt = [r for c, rows in cell.items() if c[0] == "kvtrim" for r in rows.values()]
    agree = sum(1 for r in kt if r["py_scores"] == r["scores"])
    L.append(f"Scorer check: this script's scorer gives kvtrim's own score on {agree}/{len(kt)} kvtrim rows.\n")
    L.extend(notes)
    text = "\n".join(L) + "\n"
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=5, help="samples per task")
    ap.add_argument("--ctx-len", type=int, default=2048)
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data", help="use this JSONL (kvtrim's --data format) instead of generating samples")
    ap.add_argument("--presses", default="none,snapkv,streamingllm,tova,expected_attention",
                    help="comma-separated, of: " + ",".join(PRESSES))
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--kvtrim", default=next((p for p in (os.path.join(REPO, "build", b, "kvtrim") for b in ("release", "ci"))
                                              if os.access(p, os.X_OK)), os.path.join(REPO, "build", "release", "kvtrim")),
                    help="kvtrim binary (default: build/release/kvtrim, else build/ci/kvtrim)")
    ap.add_argument("--model", default="smollm2", help="kvtrim -m")
    ap.add_argument("--model-dir", default=os.path.join(REPO, "models"))
    ap.add_argument("--gguf", default="smollm2.gguf")
    ap.add_argument("--kv-type", default="f32", help="kvtrim's cache precision (transformers' cache is float32)")
    ap.add_argument("--answer-prefix", choices=("kvtrim", "raw"), default="kvtrim",
                    help="kvtrim: kvpress gets the prefix without leading spaces, as kvtrim runs it (identical ids); "
                         "raw: the dataset's prefix, as kvpress's evaluation")
    ap.add_argument("--tools", default="kvtrim,kvpress")
    ap.add_argument("--kvtrim-extra", default="",
                    help="more kvtrim options, e.g. --int8-prefill (part of kvtrim's setup: its rows are kept apart)")
    ap.add_argument("--no-token-check", action="store_true")
    args = ap.parse_args()

    presses = [p.strip() for p in args.presses.split(",") if p.strip()]
    for p in presses:
        if p not in PRESSES:
            raise SystemExit(f"unknown press '{p}' (known: {', '.join(PRESSES)})")
    tools = [t for t in args.tools.split(",") if t]
    args.kvtrim = os.path.abspath(args.kvtrim)
    if "kvtrim" in tools and not os.access(args.kvtrim, os.X_OK):
        raise SystemExit(f"no kvtrim binary at {args.kvtrim} (--kvtrim PATH)")
    os.makedirs(args.out, exist_ok=True)

    # 1. Samples.
    if args.data:
        args.samples_file = os.path.abspath(args.data)
    else:
        args.samples_file = os.path.join(args.out, "samples.jsonl")
        cmd = [args.kvtrim, "eval", "ruler", "-m", args.model, "--ctx-len", str(args.ctx_len), "--samples",
               str(args.samples), "--tasks", args.tasks, "--seed", str(args.seed), "--format", "chat", "--dry-run",
               "--dump-samples", args.samples_file, "-t", str(args.threads)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    samples = load_samples(args.samples_file)
    if args.data:
        keep = None if args.tasks == "all" else set(args.tasks.split(","))
        samples = [s for s in samples if (keep is None or s["task"] in keep) and s["index"] < args.samples]
    print(f"{len(samples)} samples from {args.samples_file}", flush=True)

    setups = {"kvtrim": f"{os.path.basename(args.kvtrim)} -m {args.model} --format chat --kv-type {args.kv_type} "
                        f"-t {args.threads}" + (f" {args.kvtrim_extra}" if args.kvtrim_extra else ""),
              "kvpress": f"kvpress {_version('kvpress')} {args.gguf} float32 sdpa, {args.threads} threads, "
                         f"answer prefix {args.answer_prefix}"}
    res = Results(os.path.join(args.out, "results.jsonl"))
    kp = None
    need_kp = "kvpress" in tools and any(
        (("kvpress", setups["kvpress"], p, args.ratio if PRESSES[p][2] else 0.0, s["id"], s["hash"]) not in res.done)
        for p in presses for s in samples)
    check = not args.no_token_check and not os.path.exists(os.path.join(args.out, "token_check.json"))
    if need_kp or check:
        kp = Kvpress(args)
    if check:
        token_check(args, kp, samples[0])

    total = sum(1 for _ in presses for _ in samples) * len(tools)
    state = {"done": 0, "t0": time.perf_counter(), "wall": 0.0}

    def progress(row):
        state["done"] += 1
        state["wall"] += row["wall_s"]
        el = time.perf_counter() - state["t0"]
        print(f"[{state['done']}/{state['todo']}] {row['tool']:7s} {row['press']:18s} {row['id']:18s} "
              f"score {row['score']:5.1f}  {row['wall_s']:6.2f} s  out {json.dumps(row['outputs'][0][:60])}  "
              f"elapsed {el / 60:.1f} min", flush=True)

    state["todo"] = total - sum(
        1 for t in tools for p in presses for s in samples
        if (t, setups[t], p, args.ratio if PRESSES[p][2] else 0.0, s["id"], s["hash"]) in res.done)
    print(f"{state['todo']} (tool, press, sample) runs to do, {total - state['todo']} already in "
          f"{os.path.join(args.out, 'results.jsonl')}", flush=True)

    for press in presses:
        spec_t = PRESSES[press][2]
        ratio = args.ratio if spec_t else 0.0
        spec = spec_t.format(r=f"{args.ratio:g}") if spec_t else None
        for tool in tools:
            pending = [s for s in samples
                       if (tool, setups[tool], press, ratio, s["id"], s["hash"]) not in res.done]
            if not pending:
                continue
            print(f"== {tool} {press}{' ' + spec if spec and tool == 'kvtrim' else ''}: {len(pending)} samples",
                  flush=True)
            if tool == "kvtrim":
                run_kvtrim(args, press, ratio, spec, pending, setups["kvtrim"], res, progress)
                continue
            press_obj = kp.make_press(press, args.ratio)
            for s in pending:
                outs, wall, prefill, n_outer = kp.run(s, press_obj, args.answer_prefix)
                sc = [score(s["metric"], o, q["answers"]) for o, q in zip(outs, s["questions"])]
                row = {"tool": "kvpress", "setup": setups["kvpress"], "press": press, "ratio": ratio,
                       "spec": repr(press_obj) if press_obj is not None else "none", "id": s["id"], "task": s["task"],
                       "sample_hash": s["hash"], "metric": s["metric"], "scores": sc, "score": sum(sc) / len(sc),
                       "outputs": outs, "answers": [q["answers"] for q in s["questions"]], "wall_s": round(wall, 4),
                       "threads": args.threads, "context_prefill_s": round(prefill, 4) if prefill else None,
                       "n_forward_after_context": n_outer}
                res.add(row)
                progress(row)

    notes = ["Protocol notes: both tools prefill the chat-templated context alone (compressed once, without the "
             "question), then question + answer prefix at positions continuing the uncompressed length, greedy. "
             "kvtrim prefills in chunks of 256 tokens and runs its own kernels (f32 weights dequantized from the "
             "same GGUF, cache " + args.kv_type + "); kvpress/transformers one float32 pass with sdpa. kvpress "
             "decodes with skip_special_tokens and does not stop on an EOS as its first token; kvtrim stops at any "
             "end-of-generation token. Answer prefix: " +
             ("kvpress is given kvtrim's (leading spaces dropped), so the ids are identical."
              if args.answer_prefix == "kvtrim" else "kvpress keeps the leading space (RULER's), kvtrim drops it."),
             ]
    tc = os.path.join(args.out, "token_check.json")
    if os.path.exists(tc):
        with open(tc) as f:
            t = json.load(f)
        r = t[f"kvpress_{args.answer_prefix}_prefix"]
        notes.append(f"\nToken check ({t['sample']}): context ids identical: {r['context_equal']} "
                     f"({len(t['kvtrim'].get('context', []))} tokens); question ids identical: {r['question_equal']}.")
    print()
    print(summarize(args, samples, presses, res, setups, notes))


if __name__ == "__main__":
    main()
