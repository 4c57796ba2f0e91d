#!/usr/bin/env python3
"""Fails on C++ functions longer than a limit (default 100 lines) that are not on the allow-list.

A long function is usually several responsibilities in one place (STYLE.md): split it before
adding to it. The functions that were already longer when this check came in are listed, each
with its length, in scripts/function_length_allow.txt; an entry may only shrink: a listed function
that grows past its recorded length fails too, and an entry whose function is gone or now short
is reported as stale (remove it).

What counts as a function: a definition that starts at column 0 (free functions, out-of-class
member functions, TEST / TEST_F bodies — the tree's style does not indent namespaces) and ends at
its `}` in column 0; its length is from the first line of the signature to the closing brace.
Functions defined inside class bodies are not measured (they are short in this tree).

    scripts/check_function_length.py [--limit N] [--update]   # --update rewrites the allow-list
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOW = os.path.join(ROOT, "scripts", "function_length_allow.txt")
DIRS = ["src", "tools", "tests", "python/src", "fuzz", "bench"]
NOT_FUNCTION = re.compile(r"^(namespace|class|struct|enum|union|extern|using|typedef|#|//|/\*|\*)")
NAME = re.compile(r"([A-Za-z_~][A-Za-z0-9_:~<>=!+\-*/&|\[\]]*)\s*\(")


def functions(path):
    """Yields (name, first line, length) of the column-0 function definitions of a file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        code = line.split("//")[0].rstrip()
        if code and not line[0].isspace() and not NOT_FUNCTION.match(line) and code.endswith("{") \
                and not code.startswith("}"):
            # the signature: this line and the column-0 lines just above it that continue it
            start = i
            while start > 0 and lines[start - 1] and not lines[start - 1].rstrip().endswith((";", "}", "{")) \
                    and not NOT_FUNCTION.match(lines[start - 1]) and not lines[start - 1].startswith("template"):
                start -= 1
            sig = " ".join(lines[start:i + 1])
            if "(" not in sig or re.match(r"^\s*(const\s+)?\w[\w:<>, ]*\s+\w+\s*=", sig):
                i += 1
                continue
            end = i + 1
            while end < len(lines) and not lines[end].startswith("}"):
                end += 1
            m = NAME.search(sig.split("(")[0] + "(")
            name = m.group(1) if m else sig.strip()[:40]
            if name in ("TEST", "TEST_F", "TEST_P", "TYPED_TEST"):
                args = sig.split("(", 1)[1].split(")")[0].replace(" ", "")
                name = name + "(" + args + ")"
            yield name, start + 1, end - start + 1
            i = end + 1
            continue
        i += 1


def scan():
    found = {}
    for d in DIRS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, d)):
            for fn in sorted(files):
                if not fn.endswith((".cpp", ".h", ".cc")) or fn.endswith("_unicode_data.h"):
                    continue
                p = os.path.join(dirpath, fn)
                rel = os.path.relpath(p, ROOT)
                for name, first, n in functions(p):
                    key = rel + ":" + name
                    # several overloads of one name in a file: the longest stands for them
                    if n > found.get(key, (0, 0))[0]:
                        found[key] = (n, first)
    return found


def read_allow():
    allow = {}
    if not os.path.exists(ALLOW):
        return allow
    with open(ALLOW) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line:
                key, n = line.rsplit(" ", 1)
                allow[key] = int(n)
    return allow


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--update", action="store_true", help="rewrite the allow-list from the tree")
    a = ap.parse_args()
    found = scan()
    long_ones = {k: v for k, v in found.items() if v[0] > a.limit}
    if a.update:
        with open(ALLOW, "w") as f:
            f.write("# Functions over %d lines when scripts/check_function_length.py came in (2026-11-29), with\n"
                    "# their length then: split one when you next change it, and remove its line. An entry may\n"
                    "# only shrink; a function not listed here must stay within the limit.\n" % a.limit)
            for k in sorted(long_ones):
                f.write("%s %d\n" % (k, long_ones[k][0]))
        print("wrote %s: %d functions" % (os.path.relpath(ALLOW, ROOT), len(long_ones)))
        return 0
    allow = read_allow()
    bad = []
    for k, (n, first) in sorted(long_ones.items()):
        path = k.split(":", 1)[0]
        if k not in allow:
            bad.append("%s:%d: %s is %d lines (limit %d): split it" % (path, first, k.split(":", 1)[1], n, a.limit))
        elif n > allow[k]:
            bad.append("%s:%d: %s grew to %d lines (allowed %d, the limit %d): split it, do not add to it"
                       % (path, first, k.split(":", 1)[1], n, allow[k], a.limit))
    stale = [k for k in allow if k not in long_ones]
    for s in stale:
        print("note: %s is no longer over the limit (or gone): remove it from %s" % (s, os.path.relpath(ALLOW, ROOT)))
    for b in bad:
        print(b)
    print("%d functions over %d lines, %d allowed, %d failing" % (len(long_ones), a.limit, len(long_ones) - len(bad), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
