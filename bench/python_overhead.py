#!/usr/bin/env python3
"""The Python package's overhead: model.generate (kvtrim.Model, details=True) against `kvtrim
run` on the same prompt, press and thread count, interleaved repetitions; prints each side's
median prefill and decode tokens/s and the ratios of medians (Python / CLI).

    build/pyvenv/bin/python bench/python_overhead.py --kvtrim build/release/kvtrim --reps 5

The CLI's numbers are the ones it prints on stderr ("prefill X tokens/s | ... decode Y tokens/s");
the Python side's come from the same engine timers (details=True). Model loading is outside both
(the CLI loads the model every run; its time is not in either rate).
"""
import argparse
import re
import statistics
import subprocess

import kvtrim

PROMPT = ("The history of the printing press begins with movable type in East Asia and continues in "
          "fifteenth-century Mainz, where Johannes Gutenberg combined a screw press, oil-based ink and "
          "cast metal type. ") * 12 + "\n\nIn short, the printing press"


def cli_run(args, model, prompt, n, threads, press):
    cmd = [args.kvtrim, "run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "-t", str(threads)]
    if press:
        cmd += ["--press", press, "--press-protect", "16"]
    err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    m = re.search(r"prefill ([\d.]+) tokens/s \| generated (\d+) tokens, decode ([\d.]+) tokens/s", err)
    return float(m.group(1)), float(m.group(3)), int(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvtrim", default="build/release/kvtrim")
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--press", default="", help="e.g. snapkv:0.5 (the prompt's last 16 tokens protected)")
    args = ap.parse_args()
    model = kvtrim.Model(args.model, threads=args.threads)
    py, cli = {"prefill": [], "decode": []}, {"prefill": [], "decode": []}
    for r in range(args.reps):
        d = model.generate(PROMPT, max_tokens=args.n, details=True, press=args.press or None,
                           protect=16 if args.press else 0)
        c = cli_run(args, model.path, PROMPT, args.n, args.threads, args.press)
        assert len(d["tokens"]) == c[2] > 0, (len(d["tokens"]), c[2])
        py["prefill"].append(d["prefill_tps"])
        py["decode"].append(d["decode_tps"])
        cli["prefill"].append(c[0])
        cli["decode"].append(c[1])
        print(f"rep {r + 1}/{args.reps}: prefill python {d['prefill_tps']:.1f} cli {c[0]:.1f} tok/s, "
              f"decode python {d['decode_tps']:.1f} cli {c[1]:.1f} tok/s", flush=True)
    n_prompt = len(model.tokenize(PROMPT))
    print(f"\n{args.model}, {n_prompt}-token prompt, {args.n} generated, {args.threads} thread(s), "
          f"press {args.press or 'none'}, {args.reps} interleaved repetitions (medians):")
    for what in ("prefill", "decode"):
        mp, mc = statistics.median(py[what]), statistics.median(cli[what])
        print(f"  {what:7s} tok/s: python {mp:8.1f} ({min(py[what]):.1f}-{max(py[what]):.1f})   "
              f"cli {mc:8.1f} ({min(cli[what]):.1f}-{max(cli[what]):.1f})   ratio of medians {mp / mc:.3f}")


if __name__ == "__main__":
    main()
