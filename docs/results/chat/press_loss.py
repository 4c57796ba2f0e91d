#!/usr/bin/env python3
"""Does the loss estimate predict the RULER score drop? (docs/results/chat/press_loss.md)

Reads a `kvtrim eval sweep ruler` results.jsonl whose rows carry press_loss /
press_evicted_mass (src/engine/press_loss.h) and prints, per (press, ratio) cell, the number of
rows, the mean score, the drop against the uncompressed baseline on the same questions, the
mean estimate and evicted attention mass; then Spearman's rank correlation between the cells'
mean estimate and their score drop (and the same per row: estimate vs that question's drop),
with a permutation p-value. Standard library only.

usage: press_loss.py RESULTS.jsonl
"""
import json
import random
import sys
from collections import defaultdict


def ranks(xs):
    """Average ranks (ties share the mean of their positions), 1-based."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def pearson(a, b):
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va = sum((x - ma) ** 2 for x in a)
    vb = sum((y - mb) ** 2 for y in b)
    return cov / (va * vb) ** 0.5 if va > 0 and vb > 0 else float("nan")


def spearman(a, b):
    return pearson(ranks(a), ranks(b))


def perm_p(a, b, n=20000, seed=1):
    """Two-sided permutation p-value of Spearman's rho."""
    rho = spearman(a, b)
    rng = random.Random(seed)
    rb = ranks(b)
    ra = ranks(a)
    hits = 0
    for _ in range(n):
        rng.shuffle(rb)
        if abs(pearson(ra, rb)) >= abs(rho) - 1e-12:
            hits += 1
    return (hits + 1) / (n + 1)


def main(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if r.get("bench") == "ruler"]
    base = {(r["id"], r["q"]): r["score"] for r in rows if r["press"] == "none"}
    cells = defaultdict(list)
    for r in rows:
        if r["press"] != "none" and (r["id"], r["q"]) in base:
            cells[(r["press"], r["ratio"])].append(r)
    print("| press | ratio | n rows | with estimate | score | drop | mean estimate | mean evicted mass |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    est, mass, drop = [], [], []
    row_est, row_drop = [], []
    for (press, ratio), rs in sorted(cells.items()):
        measured = [r for r in rs if r.get("press_loss") is not None]
        score = sum(r["score"] for r in rs) / len(rs)
        d = sum(base[(r["id"], r["q"])] - r["score"] for r in rs) / len(rs)
        e = sum(r["press_loss"] for r in measured) / len(measured) if measured else float("nan")
        m = sum(r["press_evicted_mass"] for r in measured) / len(measured) if measured else float("nan")
        print(f"| {press} | {ratio:.2f} | {len(rs)} | {len(measured)} | {score:.1f} | {d:.1f} | {e:.4f} | {m:.4f} |")
        if measured:
            est.append(e)
            mass.append(m)
            drop.append(d)
        for r in measured:
            row_est.append(r["press_loss"])
            row_drop.append(base[(r["id"], r["q"])] - r["score"])
    nb = len(base)
    print(f"\nbaseline (press none): {nb} questions, mean score {sum(base.values()) / max(nb, 1):.1f}")
    print(f"cells: {len(est)}; rows with an estimate: {len(row_est)}")
    print(f"Spearman(mean estimate, score drop) over cells: {spearman(est, drop):+.3f} "
          f"(permutation p = {perm_p(est, drop):.3f})")
    print(f"Spearman(mean evicted mass, score drop) over cells: {spearman(mass, drop):+.3f} "
          f"(permutation p = {perm_p(mass, drop):.3f})")
    print(f"Spearman(estimate, drop) over rows: {spearman(row_est, row_drop):+.3f} "
          f"(permutation p = {perm_p(row_est, row_drop, n=2000):.3f})")
    # within each press (does the estimate order the ratios?) and across presses at one ratio
    for press in sorted({p for p, _ in cells}):
        ks = sorted(k for k in cells if k[0] == press)
        e = [sum(r["press_loss"] for r in cells[k]) / len(cells[k]) for k in ks]
        d = [sum(base[(r["id"], r["q"])] - r["score"] for r in cells[k]) / len(cells[k]) for k in ks]
        print(f"  {press}: Spearman over its ratios {spearman(e, d):+.3f}")
    for ratio in sorted({q for _, q in cells}):
        ks = sorted(k for k in cells if k[1] == ratio)
        e = [sum(r["press_loss"] for r in cells[k]) / len(cells[k]) for k in ks]
        d = [sum(base[(r["id"], r["q"])] - r["score"] for r in cells[k]) / len(cells[k]) for k in ks]
        print(f"  ratio {ratio:.2f}: Spearman across presses {spearman(e, d):+.3f} ({len(ks)} presses)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
