#!/usr/bin/env python3
"""Paired summary of `kvtrim eval mc` results files scored on the same items.

  python3 paired.py FULL.jsonl A.jsonl B.jsonl [...]

For each file: n, acc ± binomial s.e., mean KV / f16 with and without the session's bases, and
the share of items where it picks the same choice as FULL. For each consecutive pair after FULL
(A vs B, C vs D, ...): the paired accuracy difference ± its s.e. (s.d. of the per-item
differences / sqrt(n)) over the items both files scored. Standard library only.
"""
import json
import math
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                r = json.loads(line)
                rows[r["index"]] = r
    return rows


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    full = load(sys.argv[1])
    files = [(p, load(p)) for p in sys.argv[1:]]
    print("| file | n | acc | KV / f16 | KV / f16 w/o bases | same choice as full |")
    print("|---|---:|---:|---:|---:|---:|")
    for p, rows in files:
        n = len(rows)
        acc = mean([r["acc"] for r in rows.values()])
        se = math.sqrt(acc * (1 - acc) / (n - 1)) if n > 1 else 0.0
        kv = mean([r["kv_bytes"] / r["kv_bytes_dense"] for r in rows.values()])
        wo = [(r["kv_bytes"] - r["kv_bases"]) / r["kv_bytes_dense"] for r in rows.values() if r.get("kv_bases", -1) >= 0]
        wo_s = f"{mean(wo):.3f}" if len(wo) == n else "—"
        same = mean([rows[i]["pred"] == full[i]["pred"] for i in rows if i in full])
        print(f"| {p} | {n} | {acc:.3f} ± {se:.3f} | {kv:.3f} | {wo_s} | {same:.3f} |")
    rest = files[1:]
    for k in range(0, len(rest) - 1, 2):
        (pa, a), (pb, b) = rest[k], rest[k + 1]
        common = sorted(set(a) & set(b))
        d = [a[i]["acc"] - b[i]["acc"] for i in common]
        m = mean(d)
        sd = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1)) if len(d) > 1 else 0.0
        print(f"\n{pa} − {pb}: {m:+.3f} ± {sd / math.sqrt(len(d)):.3f} (paired, n = {len(d)};"
              f" {sum(x > 0 for x in d)} items only the first gets right, {sum(x < 0 for x in d)} only the second)")


if __name__ == "__main__":
    main()
