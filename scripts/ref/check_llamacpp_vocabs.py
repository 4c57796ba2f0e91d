#!/usr/bin/env python3
"""kvtrim's tokenizer on llama.cpp's tokenizer test vocabularies.

llama.cpp ships vocab-only GGUFs (models/ggml-vocab-*.gguf) with test inputs (.inp) and the
token ids Hugging Face tokenizers produce for them (.out). This runs kvtrim's check_vocab tool
(tests/tools/check_vocab.cpp: no BOS, special tokens not parsed, as llama.cpp's
test-tokenizer-0) on every vocabulary that has cases, and prints a Markdown table (vocab,
tokenizer.ggml.model / pre, cases, mismatches, note). The files are not ours: they are read
from the llama.cpp source cache, never copied into the repository.

    scripts/ref/check_llamacpp_vocabs.py [--llamacpp DIR] [--bin build/release/tests/check_vocab] [-v]

Also checks a premise of the Falcon pre-tokenizer (tokenizer_pretok.h): Falcon's
tokenizer.json splits a space from the digits after it (Digits after ByteLevel), which kvtrim
and llama.cpp leave out; that only changes tokens if some merge joins "Ġ" with a digit.
Needs the `gguf` Python package for the model/pre columns and that check (in
~/.cache/kvtrim/refenv). Exit status 1 if any supported vocabulary has a mismatch.
"""
import argparse
import glob
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_LLAMACPP = os.path.expanduser("~/.cache/kvtrim/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp")


def gguf_meta(path):
    try:
        import gguf
    except ImportError:
        return None
    r = gguf.GGUFReader(path)

    def get(key):
        f = r.fields.get(key)
        if f is None:
            return None
        if len(f.data) == 1:
            return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")
        return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]

    return get


def falcon_space_digit_merges(path):
    get = gguf_meta(path)
    if get is None:
        return None
    merges = get("tokenizer.ggml.merges") or []
    return [m for m in merges if m.startswith("\u0120 ") and m[2:3].isdigit()
            or (m.startswith("\u0120") and m[1:2].isdigit())]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llamacpp", default=DEFAULT_LLAMACPP)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "release", "tests", "check_vocab"))
    ap.add_argument("-v", action="store_true", help="print every mismatching case")
    args = ap.parse_args()
    vocabs = sorted(glob.glob(os.path.join(args.llamacpp, "models", "ggml-vocab-*.gguf")))
    if not vocabs:
        sys.exit(f"no ggml-vocab-*.gguf under {args.llamacpp}/models")
    rows, failed = [], False
    for v in vocabs:
        name = os.path.basename(v)[len("ggml-vocab-"):-len(".gguf")]
        get = gguf_meta(v)
        kind = f"{get('tokenizer.ggml.model')} / {get('tokenizer.ggml.pre') or '-'}" if get else "?"
        if not (os.path.exists(v + ".inp") and os.path.exists(v + ".out")):
            rows.append((name, kind, "-", "-", "no test cases (.inp/.out) in llama.cpp"))
            continue
        p = subprocess.run([args.bin, v] + (["-v"] if args.v else []), capture_output=True, text=True)
        out = p.stdout.strip().splitlines()
        if args.v:
            for line in out[:-1]:
                print(line)
        last = out[-1] if out else ""
        if last.startswith("RESULT "):
            _, _, cases, bad = last.split()
            rows.append((name, kind, cases, bad, "" if bad == "0" else "MISMATCH"))
            failed |= bad != "0"
        elif last.startswith("UNSUPPORTED "):
            reason = last.split(" ", 2)[2]
            reason = reason[reason.find(": ") + 2:] if ": " in reason else reason
            rows.append((name, kind, "-", "-", "not supported: " + reason))
        else:
            rows.append((name, kind, "-", "-", f"check_vocab failed: {p.stderr.strip()}"))
            failed = True
    print("| vocab | model / pre | cases | mismatches | note |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    falcon = os.path.join(args.llamacpp, "models", "ggml-vocab-falcon.gguf")
    if os.path.exists(falcon):
        m = falcon_space_digit_merges(falcon)
        if m is None:
            print("\n(falcon space+digit merge check skipped: no gguf module)")
        else:
            print(f"\nFalcon merges joining the space character with a digit: {len(m)}" + (f" {m[:5]}" if m else ""))
            failed |= bool(m)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
