#!/usr/bin/env python3
"""kvtrim bench next to llama.cpp's llama-bench: one table of prefill / decode tokens/s and ratios.

Not part of CI. Builds llama.cpp's `llama-bench` from the llama-cpp-python sdist on PyPI (the
vendored llama.cpp, pinned version, built in ~/.cache/kvtrim/llamacpp by
scripts/ref/llamacpp_build.sh; nothing is written inside the repository but the results), then
runs both tools on the same GGUF, threads, prompt sizes and depths.

Cases (--cases, space-separated):
  ppN        prefill N tokens into an empty cache
  tgM@dD     decode M tokens with D tokens already in the cache (the D-token prefill is untimed)

Configurations per case:
  llama.cpp  flash attention on with K/V types f16, q8_0, q4_0 (--lcpp-types), plus f16 without
             flash attention (--lcpp-no-fa; faster at short depths, slow at long ones) — the
             fastest of them is "llama.cpp best"
  kvtrim     uncompressed f16; --kvtrim-types (e.g. q8_0: `-ctk q8_0 -ctv q8_0`); each --press
             (compressed after the depth's prefill, as `kvtrim bench --press`); with
             --kvtrim-f32-prefill, prefill cases also with `--f32-prefill` (f32 activations on
             sgemm; kvtrim's default since 2026-11-27 is 8-bit activations on the integer kernels,
             as llama.cpp computes prefill); --kvtrim-int8-prefill, also with an explicit
             `--int8-prefill` (for kvtrim binaries older than that, whose default was f32)

llama.cpp is built AVX2-only unless KVTRIM_LLAMACPP_CPU=native (see llamacpp_build.sh); the
variant is recorded in each llama.cpp line (`llamacpp_cpu`). Use one --out file per machine and
variant: a rerun skips lines already there whatever their variant.

Both tools report medians over --reps timed repetitions (llama-bench: the median of its
per-repetition samples_ts; kvtrim bench: its median). The two tools alternate per case so that
slow drifts of the machine hit both. Results are appended to --out as JSON lines, one per
(tool, model, case, config, threads, reps); a rerun skips the lines already there (resumes).
The table (markdown) goes to stdout, and to --table if given.

Usage:
  scripts/ref/llamacpp_bench.py --models "smollm2 gemma3-270m qwen2.5-coder-1.5b" \
      --cases "pp512 tg32@d512" --out docs/results/perf/side_by_side.jsonl
  scripts/ref/llamacpp_bench.py --models smollm2 --cases "tg32@d8192 tg32@d16384" \
      --press snapkv:0.75 --kvtrim-types q8_0 --out ...
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_SH = os.path.join(REPO, "scripts", "ref", "llamacpp_build.sh")


def log(msg):
    print(f"llamacpp_bench: {msg}", file=sys.stderr, flush=True)


def die(msg):
    print(f"llamacpp_bench: error: {msg}", file=sys.stderr)
    sys.exit(1)


def shell_helper(fn, *args):
    """Runs a function of llamacpp_build.sh; returns its stdout (stripped)."""
    cmd = f'REPO="{REPO}"; source "{BUILD_SH}"; {fn} "$@"'
    r = subprocess.run(["bash", "-c", cmd, "llamacpp_build", *args], stdout=subprocess.PIPE)
    if r.returncode != 0:
        return None
    return r.stdout.decode().strip()


def parse_case(c):
    m = re.fullmatch(r"pp(\d+)", c)
    if m:
        return {"kind": "pp", "n": int(m.group(1)), "depth": 0}
    m = re.fullmatch(r"tg(\d+)@d(\d+)", c)
    if m:
        return {"kind": "tg", "n": int(m.group(1)), "depth": int(m.group(2))}
    die(f"bad case '{c}' (want ppN or tgM@dD)")


def load_done(path):
    done = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                done[key_of(r)] = r
    return done


def key_of(r):
    return (r["tool"], r["model"], r["case"], r["config"], r["threads"], r["reps"])


def run_llamacpp(bin_path, gguf, case, ctk, fa, threads, reps):
    cmd = [bin_path, "-m", gguf, "-t", str(threads), "-r", str(reps), "-o", "json",
           "-fa", "1" if fa else "0", "-ctk", ctk, "-ctv", ctk, "--progress"]
    if case["kind"] == "pp":
        cmd += ["-p", str(case["n"]), "-n", "0"]
    else:
        cmd += ["-p", "0", "-n", str(case["n"]), "-d", str(case["depth"])]
    log(" ".join(cmd))
    r = subprocess.run(["nice", "-n", "0"] + cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        log(r.stderr.decode(errors="replace")[-2000:])
        return None, f"llama-bench exited with {r.returncode}"
    try:
        rows = json.loads(r.stdout.decode())
    except ValueError:
        return None, "llama-bench printed no JSON"
    if not rows:
        return None, "llama-bench printed no rows"
    samples = rows[0].get("samples_ts") or [rows[0]["avg_ts"]]
    return {"tps_median": statistics.median(samples), "tps_min": min(samples), "tps_max": max(samples),
            "samples": len(samples)}, None


def run_kvtrim(kvtrim, model, case, kvtype, presses, threads, reps, extra=()):
    cmd = [kvtrim, "bench", "-m", model, "-t", str(threads), "-r", str(reps), "--json", *extra]
    if case["kind"] == "pp":
        cmd += ["-p", str(case["n"]), "-n", "0"]
    else:
        cmd += ["-p", "0", "-n", str(case["n"]), "-d", str(case["depth"])]
    if kvtype != "f16":
        cmd += ["-ctk", kvtype, "-ctv", kvtype]
    for p in presses:
        cmd += ["--press", p]
    log(" ".join(cmd))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        log(r.stderr.decode(errors="replace")[-2000:])
        return None, f"kvtrim bench exited with {r.returncode}"
    try:
        rows = json.loads(r.stdout.decode())
    except ValueError:
        return None, "kvtrim bench printed no JSON"
    return rows, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2 gemma3-270m qwen2.5-coder-1.5b")
    ap.add_argument("--cases", default="pp512 tg32@d512")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--lcpp-types", default="f16 q8_0 q4_0", help="llama.cpp K/V types run with flash attention")
    ap.add_argument("--lcpp-no-fa", action="store_true", help="also run llama.cpp f16 without flash attention")
    ap.add_argument("--kvtrim-types", default="", help="kvtrim K/V types besides f16 (e.g. q8_0)")
    ap.add_argument("--press", action="append", default=[], help="kvtrim press (repeatable)")
    ap.add_argument("--kvtrim-int8-prefill", action="store_true",
                    help="pp cases: also run kvtrim with --int8-prefill (config 'f16,int8-prefill')")
    ap.add_argument("--kvtrim-f32-prefill", action="store_true",
                    help="pp cases: also run kvtrim with --f32-prefill (config 'f16,f32-prefill')")
    ap.add_argument("--kvtrim", default=os.path.join(REPO, "build", "release", "kvtrim"))
    ap.add_argument("--out", required=True, help="results (JSON lines, resumable)")
    ap.add_argument("--table", help="also write the markdown table here")
    a = ap.parse_args()

    if not os.access(a.kvtrim, os.X_OK):
        die(f"{a.kvtrim} not found (build it: scripts/build.sh release, or pass --kvtrim)")
    cases = [parse_case(c) for c in a.cases.split()]
    if shell_helper("llamacpp_build", "llama-bench") is None:
        die("building llama-bench failed (see above)")
    commit = shell_helper("llamacpp_commit") or "unknown"
    lcpu = os.environ.get("KVTRIM_LLAMACPP_CPU", "avx2")  # recorded; llamacpp_build.sh picks the build
    lbench = shell_helper("llamacpp_bin", "llama-bench")
    if not lbench:
        die("llamacpp_build.sh gave no llama-bench path")

    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    done = load_done(a.out)
    n_fail = 0

    def record(r):
        with open(a.out, "a") as f:
            f.write(json.dumps(r, sort_keys=True) + "\n")
        done[key_of(r)] = r

    t_start = time.time()
    total = len(a.models.split()) * len(cases)
    step = 0
    for model in a.models.split():
        gguf = shell_helper("llamacpp_resolve_model", model)
        if not gguf:
            die(f"model '{model}' not found (install it with scripts/install_models.py)")
        for case in cases:
            step += 1
            el = time.time() - t_start
            eta = el / (step - 1) * (total - step + 1) if step > 1 else 0
            log(f"[{step}/{total}] {model} {case_name(case)}  elapsed {el:.0f}s  eta {eta:.0f}s")
            base = {"model": model, "case": case_name(case), "threads": a.threads, "reps": a.reps}
            # llama.cpp configurations
            lc = [(t, True) for t in a.lcpp_types.split()] + ([("f16", False)] if a.lcpp_no_fa else [])
            for ctk, fa in lc:
                cfg = f"{ctk}{'' if fa else ',no-fa'}"
                r = dict(base, tool="llama.cpp", config=cfg, llamacpp_commit=commit, llamacpp_cpu=lcpu)
                if key_of(r) in done:
                    continue
                res, err = run_llamacpp(lbench, gguf, case, ctk, fa, a.threads, a.reps)
                if err:
                    log(f"{model} {cfg}: {err}")
                    n_fail += 1
                    continue
                record(dict(r, **res))
            # kvtrim configurations: one invocation per K/V type (presses ride along in it), and
            # for prefill cases optionally the 8-bit-activation prefill
            runs = [(kvtype, kvtype, ()) for kvtype in ["f16"] + a.kvtrim_types.split()]
            if a.kvtrim_int8_prefill and case["kind"] == "pp":
                runs.append(("f16", "f16,int8-prefill", ("--int8-prefill",)))
            if a.kvtrim_f32_prefill and case["kind"] == "pp":
                runs.append(("f16", "f16,f32-prefill", ("--f32-prefill",)))
            for kvtype, name, extra in runs:
                presses = a.press if (case["kind"] == "tg" and kvtype == "f16" and not extra) else []
                cfgs = [name] + [f"press={p}" for p in presses]
                if all(key_of(dict(base, tool="kvtrim", config=c)) in done for c in cfgs):
                    continue
                rows, err = run_kvtrim(a.kvtrim, model, case, kvtype, presses, a.threads, a.reps, extra)
                if err:
                    log(f"{model} kvtrim {name}: {err}")
                    n_fail += 1
                    continue
                for row in rows:
                    cfg = name if row["press"] == "none" else f"press={row['press']}"
                    r = dict(base, tool="kvtrim", config=cfg)
                    for k in ("tps_median", "tps_min", "tps_max", "kv_bytes", "bytes_per_token",
                              "roofline_fraction", "bandwidth_GBps"):
                        if k in row:
                            r[k] = row[k]
                    record(r)

    table = make_table(done, a)
    print(table)
    if a.table:
        with open(a.table, "w") as f:
            f.write(table + "\n")
    if n_fail:
        die(f"{n_fail} configuration(s) failed (see above); the others are in {a.out}")


def case_name(c):
    return f"pp{c['n']}" if c["kind"] == "pp" else f"tg{c['n']}@d{c['depth']}"


def fmt(r):
    return f"{r['tps_median']:.1f} ({r['tps_min']:.0f}–{r['tps_max']:.0f})"


def make_table(done, a):
    """One row per kvtrim configuration: medians (min–max over the repetitions)."""
    lines = ["| model | test | llama.cpp f16 (FA) | llama.cpp best | kvtrim config | kvtrim tok/s | "
             "vs llama.cpp f16 | vs llama.cpp best | KV MiB | kvtrim roofline |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for model in a.models.split():
        for c in a.cases.split():
            rows = [r for r in done.values() if r["model"] == model and r["case"] == c
                    and r["threads"] == a.threads and r["reps"] == a.reps]
            lc = {r["config"]: r for r in rows if r["tool"] == "llama.cpp"}
            kv = [r for r in rows if r["tool"] == "kvtrim"]
            f16 = lc.get("f16")
            if not f16 or not kv:
                continue
            best_cfg = max(lc, key=lambda k: lc[k]["tps_median"])
            best = lc[best_cfg]
            for r in sorted(kv, key=lambda r: (r["config"] != "f16", r["config"])):
                kvmib = f"{r['kv_bytes'] / 2**20:.2f}" if r.get("kv_bytes") else ""
                roof = f"{100 * r['roofline_fraction']:.0f} %" if r.get("roofline_fraction") else ""
                lines.append(
                    f"| {model} | {c} | {fmt(f16)} | {fmt(best)} {best_cfg} | {r['config']} | {fmt(r)} | "
                    f"{r['tps_median'] / f16['tps_median']:.2f}x | {r['tps_median'] / best['tps_median']:.2f}x | "
                    f"{kvmib} | {roof} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
