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
Second table: llama.cpp's cases are few and short, so the same vocabularies are also run on
the multilingual text set of tests/data/pretok_refs.json against Hugging Face `tokenizers`
itself: a tokenizers.Tokenizer is built from the GGUF's tokens and merges (BPE, ignore_merges
as the family's tokenizer.json has it) with the family's tokenizer.json pre_tokenizer made of
tokenizers' own components (Split(..., "isolated"), Digits, Punctuation, ByteLevel). Models
whose tokenizer.json has an NFC normalizer (Qwen2) are built without it, as llama.cpp and
kvtrim do not normalise. Byte-level BPE vocabularies only (the SentencePiece ones are covered
by llama.cpp's cases and by tests/tokenizer/tokenizer_model_test.cpp on Gemma 3).

Needs the `gguf` and `tokenizers` Python packages (in ~/.cache/kvtrim/refenv). Exit status 1
if any supported vocabulary has a mismatch.
"""
import argparse
import glob
import os
import re
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
        if f.types and f.types[0] == gguf.GGUFValueType.ARRAY and f.types[-1] != gguf.GGUFValueType.STRING:
            return [f.parts[i][0] for i in f.data]
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


def hf_tokenizer(get):
    """A Hugging Face tokenizer with the vocabulary of a GGUF and its family's pre_tokenizer, or
    None for a pre-tokenizer this script does not describe."""
    sys.path.insert(0, os.path.dirname(__file__))
    import make_pretok_refs as P
    from tokenizers import AddedToken, Regex, Tokenizer, models
    from tokenizers import pre_tokenizers as pt

    def literal(p):  # Oniguruma reads \uXXXX differently: give the characters, as tokenizer.json does
        return re.sub(r"\\u([0-9a-fA-F]{4})|\\U([0-9a-fA-F]{8})", lambda m: chr(int(m.group(1) or m.group(2), 16)), p)

    def iso(patterns):
        return [pt.Split(Regex(literal(p)), behavior="isolated") for p in patterns]

    def byte_level(use_regex):
        return [pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=use_regex)]

    pre = get("tokenizer.ggml.pre")
    ignore_merges = False
    if pre in ("gpt-2", "mpt"):
        seq = byte_level(True)
    elif pre in ("starcoder", "refact", "command-r", "smollm"):
        seq = [pt.Digits(individual_digits=True)] + byte_level(True)
    elif pre == "qwen2":
        seq = iso([P.QWEN2]) + byte_level(False)
    elif pre == "qwen35":
        seq = iso([P.QWEN35]) + byte_level(False)
    elif pre == "llama-bpe":
        seq = iso([P.LLAMA3]) + byte_level(False)
        ignore_merges = True
    elif pre == "deepseek-llm":
        seq = iso(P.DEEPSEEK_LLM[:5]) + [pt.Digits(individual_digits=False)] + byte_level(False)
    elif pre == "deepseek-coder":
        seq = iso(P.DEEPSEEK_CODER[:4]) + [pt.Digits(individual_digits=True)] + byte_level(False)
    elif pre == "falcon":
        seq = ([pt.Punctuation(behavior="contiguous")] + byte_level(True)
               + [pt.Digits(individual_digits=False)] + iso([r"[0-9][0-9][0-9]"]))
    else:
        return None
    tokens = get("tokenizer.ggml.tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges")]
    t = Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
    t.pre_tokenizer = pt.Sequence(seq)
    # User-defined tokens (token type 4) are the tokenizer.json's non-special added tokens
    # (MPT's whitespace runs, DeepSeek Coder's "ö", "ü", ...): matched in the raw text first.
    types = get("tokenizer.ggml.token_type")
    user = [tokens[i] for i, ty in enumerate(types) if int(ty) == 4]
    if user:
        t.add_tokens([AddedToken(u, special=False, normalized=False) for u in user])
    return t


def hf_rows(vocabs, binary, tmp, verbose):
    sys.path.insert(0, os.path.dirname(__file__))
    import make_pretok_refs as P
    texts = [t for _, t in P.TEXTS] + [P.combined_text()]
    rows, failed = [], False
    for v in vocabs:
        name = os.path.basename(v)[len("ggml-vocab-"):-len(".gguf")]
        get = gguf_meta(v)
        if get("tokenizer.ggml.model") != "gpt2" or not (os.path.exists(v + ".inp")):
            continue
        tok = hf_tokenizer(get)
        if tok is None:
            rows.append((name, get("tokenizer.ggml.pre"), "-", "-", "no Hugging Face pre_tokenizer described"))
            continue
        prefix = os.path.join(tmp, name)
        with open(prefix + ".inp", "w", encoding="utf-8") as f:
            f.write("\n__ggml_vocab_test__\n".join(texts))
        with open(prefix + ".out", "w", encoding="utf-8") as f:
            for t in texts:
                f.write(" ".join(str(i) for i in tok.encode(t, add_special_tokens=False).ids) + "\n")
        p = subprocess.run([binary, v, "--cases", prefix] + (["-v"] if verbose else []),
                           capture_output=True, text=True)
        out = p.stdout.strip().splitlines()
        if verbose:
            for line in out[:-1]:
                print(line)
        last = out[-1] if out else ""
        if last.startswith("RESULT "):
            _, _, cases, bad = last.split()
            rows.append((name, get("tokenizer.ggml.pre"), cases, bad, "" if bad == "0" else "MISMATCH"))
            failed |= bad != "0"
        else:
            rows.append((name, get("tokenizer.ggml.pre"), "-", "-", f"check_vocab failed: {last} {p.stderr.strip()}"))
            failed = True
    return rows, failed


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
    try:
        import tokenizers
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            hrows, hfailed = hf_rows(vocabs, args.bin, tmp, args.v)
        print(f"\nMultilingual texts (tests/data/pretok_refs.json) against Hugging Face tokenizers "
              f"{tokenizers.__version__} built from each GGUF's vocabulary:\n")
        print("| vocab | pre | texts | mismatches | note |")
        print("|---|---|---|---|---|")
        for r in hrows:
            print("| " + " | ".join(r) + " |")
        failed |= hfailed
    except ImportError:
        print("\n(Hugging Face comparison skipped: no tokenizers module)")
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
