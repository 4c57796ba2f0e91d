#!/usr/bin/env python3
"""Fails when a C++ file has more lines that clang-format (the repository's .clang-format) would
change than it had when this check came in.

Most of the tree predates the format check, so formatting it all at once would touch every file
(and every blame). Instead each file's count of unformatted lines is recorded in
scripts/format_baseline.txt and may only shrink: a change that adds an unformatted line to a file
fails (new files start at 0), a change that formats some of a file's old lines passes and says
that the baseline can be lowered (--update). Works on a clean checkout (CI's): no diff against an
upstream is needed.

An unformatted line: a line of the file that the formatted file does not have at the same place
(difflib's replace / delete opcodes, counted on the original's side): a line over the 100-column
limit, a brace or an argument where clang-format puts it elsewhere, a comment it would reflow.

    scripts/check_format.py            # check every tracked .h / .cpp of the project
    scripts/check_format.py --update   # rewrite the baseline with today's counts
    scripts/check_format.py --show F   # the lines of F that clang-format would change (a diff)
    git clang-format-14 BASE           # (git's own tool) formats the lines changed since BASE

Exits 77 (ctest: skipped) when clang-format-14 is not installed: the Debian package is pinned so
that every machine counts the same lines (clang-format's output differs between versions).
"""
import argparse
import concurrent.futures
import difflib
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(ROOT, "scripts", "format_baseline.txt")
DIRS = ["src", "tools", "tests", "python/src", "fuzz", "bench", "include"]
# generated tables (a script writes them; their layout is the script's)
SKIP = {"src/model/tokenizer_unicode_data.h"}
CLANG_FORMAT = "clang-format-14"


def sources():
    out = subprocess.run(["git", "ls-files", "--"] + DIRS, cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    return sorted(p for p in out if p.endswith((".h", ".cpp")) and p not in SKIP
                  and os.path.exists(os.path.join(ROOT, p)))


def formatted(path):
    with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
        original = f.read()
    res = subprocess.run([CLANG_FORMAT, "--style=file", "--assume-filename=" + path],
                         cwd=ROOT, input=original, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{CLANG_FORMAT} failed on {path}: {res.stderr.strip()}")
    return original.split("\n"), res.stdout.split("\n")


def unformatted(path):
    a, b = formatted(path)
    n = 0
    for op, i1, i2, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op in ("replace", "delete"):
            n += i2 - i1
    return n


def read_baseline():
    counts = {}
    if os.path.exists(BASELINE):
        with open(BASELINE) as f:
            for line in f:
                if line.strip() and not line.startswith("#"):
                    path, n = line.rsplit(" ", 1)
                    counts[path] = int(n)
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--update", action="store_true", help="rewrite the baseline with today's counts")
    ap.add_argument("--show", metavar="FILE", help="print the diff clang-format would make to FILE")
    args = ap.parse_args()
    if shutil.which(CLANG_FORMAT) is None:
        print(f"check_format: {CLANG_FORMAT} is not installed (scripts/install_deps.sh --test)")
        return 77
    if args.show:
        a, b = formatted(os.path.relpath(os.path.abspath(args.show), ROOT))
        sys.stdout.writelines(difflib.unified_diff([x + "\n" for x in a], [x + "\n" for x in b],
                                                   args.show, args.show + " (formatted)"))
        return 0
    files = sources()
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        counts = dict(zip(files, pool.map(unformatted, files)))
    if args.update:
        with open(BASELINE, "w") as f:
            f.write("# Lines clang-format-14 would change, per file (scripts/check_format.py): a count\n"
                    "# may only shrink; files not listed must be formatted. Rewrite with --update.\n")
            for p in files:
                if counts[p]:
                    f.write(f"{p} {counts[p]}\n")
        print(f"check_format: baseline rewritten, {sum(counts.values())} unformatted lines in "
              f"{sum(1 for n in counts.values() if n)} of {len(files)} files")
        return 0
    base = read_baseline()
    worse = [(p, n, base.get(p, 0)) for p, n in counts.items() if n > base.get(p, 0)]
    better = [p for p, n in counts.items() if n < base.get(p, 0)]
    for p, n, b in worse:
        print(f"{p}: {n} lines clang-format would change, {b} allowed "
              f"(scripts/check_format.py --show {p}; git clang-format-14 formats your changed lines)")
    if better:
        print(f"check_format: {len(better)} file(s) now have fewer unformatted lines than the baseline "
              f"(e.g. {better[0]}): lower it with scripts/check_format.py --update")
    print(f"check_format: {len(files)} files, {sum(counts.values())} unformatted lines "
          f"(baseline {sum(base.values())}), {len(worse)} file(s) over their count")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
