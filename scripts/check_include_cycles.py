#!/usr/bin/env python3
"""Finds #include cycles in src/ and tools/ (issue 44; python3 only, well under 2 s).

Reads every #include "..." of the C++ files under src/ and tools/, resolved as the compiler
does (the including file's folder first, then src/ and include/, the project's include paths;
system <...> includes and headers from elsewhere are ignored). A file and its header are one
component (session.h + session.cpp = src/engine/session), and so is a private header named
<component>_impl.h or <component>_internal.h in the same folder (tokenizer_impl.h belongs to
src/model/tokenizer): component A depends on B when a file of A includes a header of B. It
reports:
  - cycles between components: each strongly connected set, with one shortest cycle through
    each of its components (a cycle inside one folder, or between folders), and the include
    behind each step;
  - cycles between folders: the module graph (src/<module>, tools/<tool>) must have none;
    DESIGN.md section 2's layer order is printed with it, and an include that points up that
    order (a lower layer including a higher one) is reported as well.
Exits 1 if any is found outside ALLOWED below, 0 otherwise. Usage: scripts/check_include_cycles.py
[--root DIR] [-v]
"""
import argparse
import os
import re
import sys
from collections import deque

# The cycles that exist today, each as its components in order (the first depends on the
# second, ..., the last on the first). A strongly connected set passes only when every cycle in
# it is listed here, so these pass and any new cycle, or a new component joining one, fails.
# Remove an entry when its cycle is fixed (the script says when one no longer exists).
ALLOWED = [
    # Private headers (no .cpp of their own) of a component whose implementation is split over
    # several .cpp files: they include the component's header and its .cpp files include them.
    # Named <component>_impl.h they would count as part of it (see unit_of).
    ("src/model/tokenizer", "src/model/tokenizer_vocab"),        # tokenizer_{bpe,spm,gguf}.cpp
    ("src/server/scheduler", "src/server/scheduler_slot"),       # scheduler_{admission,submit}.cpp
    # Two components that need each other: arch.h includes model.h (the architectures build on
    # Model) and model.cpp includes arch/arch.h (Model dispatches to them).
    ("src/model/arch/arch", "src/model/model"),
    # plot_svg.h includes sweep_ppl.h (it plots the sweep's rows), sweep_ppl.cpp includes
    # plot_svg.h (the sweep writes its plot).
    ("src/eval/plot_svg", "src/eval/sweep_ppl"),
    # stief_checkpoint.cpp includes stief_train.h (it saves the trainer's state), stief_train.cpp
    # includes stief_checkpoint.h (the trainer resumes from it).
    ("src/calib/stief_checkpoint", "src/calib/stief_train"),
]
MAX_ENUMERATED = 12  # a strongly connected set larger than this is never allowed

# DESIGN.md section 2: layers point one way (a module may include its own layer or lower ones).
# eval sits beside tools and drives the engine; server is the library behind `kvtrim serve`.
LAYERS = [
    ("core",),
    ("ops",),
    ("gguf", "tokenizer", "model", "kv", "press", "calib"),
    ("engine",),
    ("eval", "server"),
    ("tools",),
]
LAYER_OF = {m: i for i, group in enumerate(LAYERS) for m in group}

EXTS = (".h", ".hpp", ".cpp", ".cc", ".inl")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def module_of(path):
    """src/press/basis/x.cpp -> press; tools/kvtrim/x.cpp -> tools."""
    parts = path.split("/")
    if parts[0] == "tools":
        return "tools"
    return parts[1] if len(parts) > 2 else parts[0]


def layer_of(module):
    return LAYER_OF.get(module)


PRIVATE_SUFFIXES = ("_impl", "_internal")


def unit_of(path):
    """The component a file belongs to: its path without the extension, and without the
    _impl / _internal suffix of a private header."""
    stem, ext = os.path.splitext(path)
    if ext != ".cpp":
        for suffix in PRIVATE_SUFFIXES:
            if stem.endswith(suffix):
                return stem[: -len(suffix)]
    return stem


def read_graph(root):
    files = []
    for top in ("src", "tools"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for n in names:
                if n.endswith(EXTS):
                    files.append(os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/"))
    known = set(files)
    graph = {f: [] for f in files}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        here = os.path.dirname(f)
        for inc in INCLUDE_RE.findall(text):
            for base in (here, "src", "include"):
                cand = os.path.normpath(os.path.join(base, inc)).replace(os.sep, "/")
                if cand in known:
                    if cand not in graph[f]:
                        graph[f].append(cand)
                    break
    return graph


def unit_graph(graph):
    """Components (a file and its header) and, per dependency, one include behind it."""
    units, why = {}, {}
    for f, ws in graph.items():
        uf = unit_of(f)
        units.setdefault(uf, [])
        for w in ws:
            uw = unit_of(w)
            units.setdefault(uw, [])
            if uw != uf and uw not in units[uf]:
                units[uf].append(uw)
                why[(uf, uw)] = (f, w)
    return units, why


def canonical(cycle):
    """A cycle's components rotated to start at the least one (no repeated last element)."""
    k = cycle.index(min(cycle))
    return tuple(cycle[k:] + cycle[:k])


def elementary_cycles(graph, members):
    """Every simple cycle inside members (small sets only), canonical."""
    order = sorted(members)
    out = set()
    for i, s in enumerate(order):
        allowed = set(order[i:])
        stack = [(s, [s])]
        while stack:
            v, path = stack.pop()
            for w in graph[v]:
                if w == s:
                    out.add(canonical(path))
                elif w in allowed and w not in path:
                    stack.append((w, path + [w]))
    return out


def sccs(graph):
    """Tarjan's strongly connected components, iteratively; only those with a cycle."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            recurse = False
            for j in range(i, len(graph[v])):
                w = graph[v][j]
                if w not in index:
                    work.append((v, j + 1))
                    work.append((w, 0))
                    recurse = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph[v]:
                    out.append(sorted(comp))
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
    return out


def shortest_cycle(graph, start, members):
    """The shortest cycle start -> ... -> start inside members (BFS)."""
    prev = {start: None}
    q = deque([start])
    while q:
        v = q.popleft()
        for w in graph[v]:
            if w not in members:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                q.append(w)
    return None


def cycles_of(graph, comp):
    """One shortest cycle through each member, each cycle printed once (rotated to its least file)."""
    members, seen, out = set(comp), set(), []
    for f in comp:
        c = shortest_cycle(graph, f, members)
        if not c:
            continue
        key = canonical(c[:-1])
        if key not in seen:
            seen.add(key)
            out.append(list(key) + [key[0]])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("-v", "--verbose", action="store_true", help="also print the allowed cycles")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    files = read_graph(root)
    n_edges = sum(len(v) for v in files.values())
    graph, why = unit_graph(files)
    allowed = {canonical(list(c)) for c in ALLOWED}
    problems = 0

    def show(c):
        steps = []
        for a, b in zip(c, c[1:]):
            f, w = why[(a, b)]
            steps.append(f"    {a} -> {b}: {f} includes {w}")
        return "  " + " -> ".join(c) + "\n" + "\n".join(steps)

    found = set()
    for comp in sccs(graph):
        members = set(comp)
        cycles = elementary_cycles(graph, members) if len(comp) <= MAX_ENUMERATED else None
        if cycles is not None:
            found |= cycles
        if cycles is not None and cycles <= allowed:
            if args.verbose:
                for c in sorted(cycles):
                    print("allowed cycle:\n" + show(list(c) + [c[0]]))
            continue
        folders = sorted({os.path.dirname(u) for u in comp})
        where = f"inside {folders[0]}/" if len(folders) == 1 else "between " + ", ".join(d + "/" for d in folders)
        print(f"include cycle {where} ({len(comp)} components: " + ", ".join(os.path.basename(u) for u in comp) + "):")
        shown = cycles_of(graph, comp)
        if cycles is not None:  # every cycle not allowed, after the shortest ones
            shown += [list(c) + [c[0]] for c in sorted(cycles - allowed) if list(c) + [c[0]] not in shown]
        for c in shown:
            print(show(c))
        problems += 1
    for c in sorted(allowed - found):
        print("note: allowed cycle " + " -> ".join(c) + " no longer exists: remove it from ALLOWED")

    # Modules: cycles and includes pointing up the layers.
    mgraph, mwhy = {}, {}
    for f, ws in files.items():
        mf = module_of(f)
        mgraph.setdefault(mf, [])
        for w in ws:
            mw = module_of(w)
            if mw != mf:
                if mw not in mgraph[mf]:
                    mgraph[mf].append(mw)
                mwhy.setdefault((mf, mw), (f, w))
            mgraph.setdefault(mw, [])
    order = " > ".join("/".join(g) for g in reversed(LAYERS))
    mcomps = sccs(mgraph)
    for comp in mcomps:
        for c in cycles_of(mgraph, comp):
            print("folder cycle: " + " -> ".join(c))
            for a, b in zip(c, c[1:]):
                f, w = mwhy[(a, b)]
                print(f"  {a} -> {b}: {f} includes {w}")
            problems += 1
    for (a, b), (f, w) in sorted(mwhy.items()):
        la, lb = layer_of(a), layer_of(b)
        if la is None or lb is None:
            print(f"note: module {a if la is None else b} has no layer in LAYERS")
        elif lb > la:
            print(f"layer order broken: {a} includes {b} ({f} includes {w})")
            problems += 1
    if problems:
        print(f"layer order (DESIGN.md section 2, higher first): {order}")
    print(f"{len(files)} files ({len(graph)} components), {n_edges} includes, {len(ALLOWED)} allowed cycles: "
          + ("no include cycle" if not problems else f"{problems} problem(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
