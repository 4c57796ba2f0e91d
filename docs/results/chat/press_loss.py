#!/usr/bin/env python3
"""Does the loss estimate predict the RULER score drop? (docs/results/chat/press_loss.md)

Reads a `kvtrim eval sweep ruler` results.jsonl whose rows carry press_loss /
press_evicted_mass (src/engine/press_loss.h) and prints, per (press, ratio) cell, the number of
rows, the mean score, the drop against the uncompressed baseline on the same questions, the
mean estimate and evicted attention mass; then Spearman's rank correlation between the cells'
mean estimate and their score drop (and the same per row: estimate vs that question's drop),
with a permutation p-value (exact, over every permutation, for 8 points or fewer). Rows say
which queries the estimate was measured on (press_loss_queries: "question" | "window"; rows
written before the field existed: the window).

With a second file (the same sweep, the estimate measured another way), also a paired bootstrap
over the questions: resampling the baseline's questions (the same draw for both files), the
difference of the over-cells Spearman, second minus first, with its 95 % interval.
Standard library only.

usage: press_loss.py RESULTS.jsonl [OTHER_RESULTS.jsonl]
"""
import itertools
import json
import random
import sys
from collections import Counter, defaultdict


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
    """Two-sided permutation p-value of Spearman's rho (exact for len(a) <= 8)."""
    rho = spearman(a, b)
    rng = random.Random(seed)
    rb = ranks(b)
    ra = ranks(a)
    if len(a) <= 8:
        perms = list(itertools.permutations(rb))
        hits = sum(abs(pearson(ra, list(pb))) >= abs(rho) - 1e-12 for pb in perms)
        return hits / len(perms)
    hits = 0
    for _ in range(n):
        rng.shuffle(rb)
        if abs(pearson(ra, rb)) >= abs(rho) - 1e-12:
            hits += 1
    return (hits + 1) / (n + 1)


def load(path):
    """The baseline's score per question and the press rows per (press, ratio) cell."""
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if r.get("bench") == "ruler"]
    base = {(r["id"], r["q"]): r["score"] for r in rows if r["press"] == "none"}
    cells = defaultdict(list)
    for r in rows:
        if r["press"] != "none" and (r["id"], r["q"]) in base:
            cells[(r["press"], r["ratio"])].append(r)
    return base, cells


def cells_rho(base, cells, weights):
    """Spearman(mean estimate, mean drop) over cells, each question counted weights[question] times."""
    est, drop = [], []
    for rs in cells.values():
        w = [weights.get((r["id"], r["q"]), 0) for r in rs]
        n = sum(w)
        if n == 0 or any(r.get("press_loss") is None for r in rs):
            continue
        est.append(sum(wi * r["press_loss"] for wi, r in zip(w, rs)) / n)
        drop.append(sum(wi * (base[(r["id"], r["q"])] - r["score"]) for wi, r in zip(w, rs)) / n)
    return spearman(est, drop)


def compare(path_a, path_b, n=2000, seed=1):
    """Paired bootstrap over the baseline's questions of the over-cells Spearman, b minus a."""
    base_a, cells_a = load(path_a)
    base_b, cells_b = load(path_b)
    qs = sorted(set(base_a) & set(base_b))
    one = {q: 1 for q in qs}
    ra, rb = cells_rho(base_a, cells_a, one), cells_rho(base_b, cells_b, one)
    rng = random.Random(seed)
    diffs = []
    for _ in range(n):
        w = Counter(rng.choice(qs) for _ in qs)
        d = cells_rho(base_b, cells_b, w) - cells_rho(base_a, cells_a, w)
        if d == d:  # not nan (a draw where every cell ties)
            diffs.append(d)
    diffs.sort()
    lo, hi = diffs[int(0.025 * len(diffs))], diffs[int(0.975 * len(diffs)) - 1]
    print(f"\npaired bootstrap over {len(qs)} questions ({len(diffs)} draws): Spearman over cells "
          f"{rb:+.3f} ({path_b}) - {ra:+.3f} ({path_a}) = {rb - ra:+.3f}, 95 % interval [{lo:+.3f}, {hi:+.3f}]; "
          f"second <= first in {sum(d <= 0 for d in diffs) / len(diffs):.1%} of the draws")


def main(path):
    base, cells = load(path)
    used = Counter(r.get("press_loss_queries", "window") for rs in cells.values() for r in rs
                   if r.get("press_loss") is not None)
    print("estimate measured on: " + ", ".join(f"{k} {v} rows" for k, v in sorted(used.items())) + "\n")
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
        print(f"  {press}: Spearman over its ratios {spearman(e, d):+.3f} ({len(ks)} cells, "
              f"{sum(len(cells[k]) for k in ks)} rows; permutation p = {perm_p(e, d):.3f})")
    for ratio in sorted({q for _, q in cells}):
        ks = sorted(k for k in cells if k[1] == ratio)
        e = [sum(r["press_loss"] for r in cells[k]) / len(cells[k]) for k in ks]
        d = [sum(base[(r["id"], r["q"])] - r["score"] for r in cells[k]) / len(cells[k]) for k in ks]
        print(f"  ratio {ratio:.2f}: Spearman across presses {spearman(e, d):+.3f} ({len(ks)} presses, "
              f"{sum(len(cells[k]) for k in ks)} rows; permutation p = {perm_p(e, d):.3f})")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1])
    if len(sys.argv) == 3:
        print(f"\n--- {sys.argv[2]}")
        main(sys.argv[2])
        compare(sys.argv[1], sys.argv[2])
