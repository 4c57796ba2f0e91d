#!/usr/bin/env python3
"""Paired view of a GSM8K sweep's results.jsonl (kvtrim eval sweep gsm8k): per cell, over the
questions every cell answered, the accuracy, how often its final answer equals the uncompressed
model's (whether right or wrong: fidelity to the full cache), and, against each other cell at
the same ratio, the discordant pairs and a two-sided sign-test p-value.
Usage: agreement.py results.jsonl"""
import collections
import json
import math
import re
import sys


def final_answer(out):
    # kvtrim's gsm8k_extract_answer (src/eval/gsm8k.cpp): "####" first, else the last number
    out = out.split("Question:")[0]
    m = re.search(r"####\s*(-?[$0-9.,]*[0-9][$0-9.,]*)", out)
    if m:
        s = m.group(1)
    else:
        nums = re.findall(r"-?[$0-9.,]*[0-9][$0-9.,]*", out)
        if not nums:
            return None
        s = nums[-1]
    s = s.replace(",", "").replace("$", "").rstrip(".")
    try:
        return float(s)
    except ValueError:
        return None


def sign_test(b, c):
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    p = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * p)


rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cells = collections.OrderedDict()
for r in rows:
    cells.setdefault((r["press"], r["ratio"]), {})[r["id"]] = r
ids = set.intersection(*(set(v) for v in cells.values()))
base = cells[("none", 0.0)]
print(f"{len(ids)} questions answered by every cell\n")
print("| press | ratio | KV / f16 w/o bases | correct | accuracy | same answer as uncompressed |")
print("|---|---:|---:|---:|---:|---:|")
for (p, ratio), v in cells.items():
    corr = sum(v[i]["score"] > 0 for i in ids)
    same = sum(final_answer(v[i]["output"]) == final_answer(base[i]["output"]) for i in ids)
    wo = sum((v[i]["kv_bytes"] - v[i].get("kv_bases", 0)) / v[i]["kv_bytes_dense"] for i in ids) / len(ids)
    print(f"| {p} | {ratio:.2f} | {wo:.3f} | {corr} / {len(ids)} | {100 * corr / len(ids):.1f} | "
          f"{same} / {len(ids)} |")
print("\n| ratio | A | B | A right, B wrong | B right, A wrong | sign test p |")
print("|---:|---|---|---:|---:|---:|")
presses = [p for (p, _) in cells if p != "none"]
presses = list(dict.fromkeys(presses))
ratios = sorted({r for (_, r) in cells if r > 0})
for ratio in ratios:
    for ia in range(len(presses)):
        for ib in range(ia + 1, len(presses)):
            a, b = cells.get((presses[ia], ratio)), cells.get((presses[ib], ratio))
            if not a or not b:
                continue
            ab = sum(a[i]["score"] > 0 and b[i]["score"] == 0 for i in ids)
            ba = sum(b[i]["score"] > 0 and a[i]["score"] == 0 for i in ids)
            print(f"| {ratio:.2f} | {presses[ia]} | {presses[ib]} | {ab} | {ba} | {sign_test(ab, ba):.2f} |")
