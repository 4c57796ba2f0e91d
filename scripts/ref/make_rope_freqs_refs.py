#!/usr/bin/env python3
"""llama.cpp's logits on SmolLM2 with Llama 3's per-frequency RoPE divisors added (issue 39's case).

kvtrim used to load a llama GGUF carrying `rope_freqs.weight` and ignore it. This writes
SmolLM2's GGUF (models/smollm2.gguf) again with `rope_freqs.weight` = 1 on the first half of the
frequencies and 8 on the second, and again with 8 on the first half and 1 on the second (the
files are written to ~/.cache/kvtrim, never committed), runs them
in llama.cpp (llama-cpp-python, n_ctx 512) and records, per prompt, the prompt's token ids, the
top-5 logits after the prompt and the greedy continuation; plus the same for the unmodified file,
so the test can check that the divisors change llama.cpp's result too. Output:
tests/data/rope_freqs_refs.json, read by tests/model/rope_freqs_model_test.cpp (which writes the
same modified file with kvtrim's own GGUF writer).

Needs the reference venv of make_arch_refs.py (gguf from the llama.cpp sdist, llama-cpp-python
over the shared libllama: LLAMA_CPP_LIB_PATH).
usage: LLAMA_CPP_LIB_PATH=~/.cache/kvtrim/llamacpp/build-refshared/bin \\
       ~/.cache/kvtrim/refenv/bin/python scripts/ref/make_rope_freqs_refs.py
"""
import json
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]
N_GEN = 16
# and a long one, where the divisors matter most (they slow the low frequencies): the start of
# WikiText-2 test, cut to LONG_TOKENS tokens
LONG_TOKENS = 400


def write_with_rope_freqs(src, dst, high8):
    import gguf

    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), vt)
    n_rot = int(r.fields[f"{arch}.rope.dimension_count"].contents()) if f"{arch}.rope.dimension_count" in r.fields \
        else int(r.fields[f"{arch}.embedding_length"].contents()) // int(r.fields[f"{arch}.attention.head_count"].contents())
    half = n_rot // 2
    lo, hi = [1.0] * (half // 2), [8.0] * (half - half // 2)
    factors = np.array(hi + lo if high8 else lo + hi, dtype=np.float32)
    # tensors: keep the file's bytes and types
    for t in r.tensors:  # (t.data: the bytes per row for quantized types, the values otherwise)
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.add_tensor("rope_freqs.weight", factors)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return factors


def run(path):
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=512, n_batch=512, logits_all=True, n_threads=2, verbose=False)
    out = []
    text = open(os.path.join(REPO, "..", "shared", "data", "wikitext-2", "test.txt"), encoding="utf-8").read()
    long_toks = llm.tokenize(text.encode(), add_bos=False, special=False)[:LONG_TOKENS]
    for p in PROMPTS + [None]:
        toks = llm.tokenize(p.encode(), add_bos=False, special=False) if p is not None else long_toks
        p = p if p is not None else f"(WikiText-2 test, first {LONG_TOKENS} tokens)"
        llm.reset()
        llm.eval(toks)
        first = np.array(llm.scores[len(toks) - 1])
        top5 = np.argsort(-first)[:5]
        gen = []
        for _ in range(N_GEN):
            nxt = int(np.argmax(np.array(llm.scores[llm.n_tokens - 1])))
            gen.append(nxt)
            llm.eval([nxt])
        out.append({"prompt": p, "prompt_tokens": [int(t) for t in toks], "top5_ids": [int(i) for i in top5],
                    "top5_logits": [float(first[i]) for i in top5], "continuation": gen})
        print(f"  {p!r} -> {llm.detokenize(gen).decode('utf-8', errors='replace')!r}", flush=True)
    del llm
    return out


def main():
    src = os.path.join(REPO, "models", "smollm2.gguf")
    if not os.path.exists(src):
        sys.exit(f"error: {src} not installed (python3 scripts/install_models.py smollm2)")
    print("== llama.cpp, SmolLM2 as installed", flush=True)
    refs = {"model": "smollm2", "n_ctx": 512, "plain": run(src), "variants": {}}
    # low8: issue 39's file (8 on the second half of the frequencies: the slow ones, a small effect
    # on short prompts); high8: 8 on the first half (the fast ones: an effect far above the engines'
    # rounding, so that a loader ignoring the tensor fails the test)
    for name, high8 in (("low8", False), ("high8", True)):
        dst = os.path.join(os.path.expanduser("~/.cache/kvtrim"), f"smollm2_rope_freqs_{name}.gguf")
        factors = write_with_rope_freqs(src, dst, high8)
        print(f"== llama.cpp, SmolLM2 + rope_freqs.weight ({name})", flush=True)
        refs["variants"][name] = {"rope_freqs": [float(x) for x in factors], "runs": run(dst)}
    out = os.path.join(REPO, "tests", "data", "rope_freqs_refs.json")
    with open(out, "w") as f:
        json.dump(refs, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    sys.exit(main())
