#!/usr/bin/env python3
"""Prints the Markdown tables of docs/results/models/README.md from tests/data/arch/*.json:
the transformers-vs-llama.cpp agreement matrix, and per architecture the GGUF metadata keys and
tensors (of the f16 file; the quantized files have the same names).

usage: arch_refs_tables.py [matrix|gguf]...   (both by default)
"""
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARCH = os.path.join(REPO, "tests", "data", "arch")
ORDER = ["llama3", "qwen3", "mistral", "qwen2-yarn", "gemma2", "phi3", "phi3-longrope", "qwen3moe"]
TYPES = ["f32", "f16", "q8_0", "q4_k_m", "q6_k"]


def load():
    refs = {}
    for name in ORDER:
        p = os.path.join(ARCH, name + ".json")
        if os.path.exists(p):
            refs[name] = json.load(open(p))
    return refs


def matrix(refs):
    print("max |Δlogit| over the 20 recorded positions (full rows) · top-1 agreement over all 300 "
          "positions · greedy: leading tokens equal out of 32. **Bold** = file committed.\n")
    print("| arch (GGUF arch) | top-1 margin (transformers) min / median | "
          + " | ".join(TYPES) + " |")
    print("|---|---|" + "---|" * len(TYPES))
    for name, r in refs.items():
        m = r["transformers"]["top1_margin"]
        cells = []
        for t in TYPES:
            e = r["files"].get(t)
            if e is None:
                cells.append("–")
                continue
            v = e["vs_transformers"]
            s = f"{v['max_abs_dlogit']:.3g} · {v['top1_agree_count']}/300 · {v['greedy_match_prefix']}/32"
            cells.append(f"**{s}**" if e["committed"] else s)
        print(f"| {name} ({r.get('gguf_arch', '?')}) | {m['min']:.3g} / {m['median']:.3g} | "
              + " | ".join(cells) + " |")
    print()


def gguf(refs):
    for name, r in refs.items():
        if "gguf_keys" not in r:
            continue
        print(f"#### {name}: `{r['gguf_arch']}` ({r['hf_class']})\n")
        print("Keys (tokenizer arrays as type × length):\n")
        print("```")
        for k, v in r["gguf_keys"].items():
            if isinstance(v, dict) and "array" in v:
                v = f"[{v['array']} x {v['len']}]"
            elif isinstance(v, list) and len(v) > 8:
                v = f"[{len(v)} values: {v[0]}, {v[1]}, ..., {v[-1]}]"
            print(f"{k} = {v}")
        print("```\n")
        print("Tensors of the f16 file (name, type, GGUF shape ne0 × ne1 ...), "
              "block 0 only when the blocks have the same tensors:\n")
        print("```")
        blocks = {}
        for tname, ttype, shape in r["gguf_tensors_f16"]:
            if tname.startswith("blk."):
                b = int(tname.split(".")[1])
                blocks.setdefault(b, []).append((tname.split(".", 2)[2], ttype, shape))
        same = all(sorted(x[0] for x in v) == sorted(x[0] for x in blocks[0])
                   for v in blocks.values()) if blocks else True
        for tname, ttype, shape in r["gguf_tensors_f16"]:
            if tname.startswith("blk.") and same and not tname.startswith("blk.0."):
                continue
            print(f"{tname:32s} {ttype:4s} {' x '.join(map(str, shape))}")
        if same and blocks:
            print(f"(blk.1 .. blk.{max(blocks)}: the same names and shapes)")
        print("```\n")
        types = {t: e["tensor_types"] for t, e in r["files"].items()}
        print("Tensor types per file: " + "; ".join(f"{t}: {', '.join(v)}" for t, v in types.items())
              + "\n")


def main():
    what = sys.argv[1:] or ["matrix", "gguf"]
    refs = load()
    for w in what:
        {"matrix": matrix, "gguf": gguf}[w](refs)


if __name__ == "__main__":
    main()
