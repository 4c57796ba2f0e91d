#!/usr/bin/env python3
"""Reference outputs of llama.cpp (through llama-cpp-python) on the real models.

Writes tests/data/model_refs.json with, per model:
  - greedy continuations (token ids) of fixed prompts, and the top-5 logits at the first
    generated position;
  - perplexity of the first tokens of WikiText-2 test with llama.cpp's perplexity windows
    (non-overlapping windows of n_ctx, first token replaced by BOS, second half scored).
The kvtrim model tests compare against these.

Needs: pip install llama-cpp-python (builds llama.cpp from source), numpy; models installed.
usage: scripts/ref/make_model_refs.py [--models smollm2,gemma3-270m,...] [--ppl-tokens N]
"""
import argparse
import json
import math
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "Water boils at 100 degrees Celsius. At the top of Mount Everest, water boils at",
]
N_GEN = 24


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


def ppl_llamacpp_windows(llm, tokens, n_ctx, bos):
    n_chunk = len(tokens) // n_ctx
    nll, n = 0.0, 0
    first = n_ctx // 2
    for c in range(n_chunk):
        win = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if bos is not None:
            win[0] = bos
        llm.reset()
        llm.eval(win)
        logits = np.array(llm.scores[:n_ctx])
        for j in range(first, n_ctx - 1):
            nll -= log_softmax(logits[j])[win[j + 1]]
            n += 1
    return math.exp(nll / n), n


def main():
    from llama_cpp import Llama, llama_cpp as lc  # noqa: F401

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,gemma3-270m,qwen2.5-coder-1.5b")
    ap.add_argument("--ppl-ctx", type=int, default=512)
    ap.add_argument("--ppl-tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    out_path = os.path.join(REPO, "tests", "data", "model_refs.json")
    refs = json.load(open(out_path)) if os.path.exists(out_path) else {}
    text = open(os.path.join(REPO, "..", "shared", "data", "wikitext-2", "test.txt"), encoding="utf-8").read()
    for name in args.models.split(","):
        path = os.path.join(REPO, "models", name + ".gguf")
        print(f"== {name}", flush=True)
        llm = Llama(model_path=path, n_ctx=max(args.ppl_ctx, 256), n_batch=512, logits_all=True,
                    n_threads=args.threads, verbose=False)
        add_bos = llm._model.add_bos_token() if hasattr(llm._model, "add_bos_token") else True
        bos = llm.token_bos() if add_bos else None
        entry = {"add_bos": bool(add_bos), "bos": bos, "greedy": []}
        for p in PROMPTS:
            toks = llm.tokenize(p.encode(), add_bos=bool(add_bos), special=False)
            llm.reset()
            llm.eval(toks)
            first_logits = np.array(llm.scores[len(toks) - 1])
            top5 = np.argsort(-first_logits)[:5]
            gen = []
            for _ in range(N_GEN):
                nxt = int(np.argmax(np.array(llm.scores[llm.n_tokens - 1])))
                gen.append(nxt)
                llm.eval([nxt])
            entry["greedy"].append({
                "prompt": p, "prompt_tokens": toks, "continuation": gen,
                "text": llm.detokenize(gen).decode("utf-8", errors="replace"),
                "top5_ids": [int(i) for i in top5], "top5_logits": [float(first_logits[i]) for i in top5],
            })
            print(f"  {p!r} -> {entry['greedy'][-1]['text']!r}", flush=True)
        # perplexity, llama.cpp windows, on the first --ppl-tokens tokens
        toks = llm.tokenize(text.encode(), add_bos=bool(add_bos), special=False)[:args.ppl_tokens]
        ppl, n = ppl_llamacpp_windows(llm, toks, args.ppl_ctx, bos)
        entry["ppl"] = {"file": "wikitext-2/test.txt", "n_ctx": args.ppl_ctx, "max_tokens": args.ppl_tokens,
                        "ppl": ppl, "n_scored": n}
        print(f"  ppl (ctx {args.ppl_ctx}, first {args.ppl_tokens} tokens) = {ppl:.4f} over {n} tokens", flush=True)
        refs[name] = entry
        del llm
        with open(out_path, "w") as f:
            json.dump(refs, f, indent=1)
    print("wrote", out_path)


if __name__ == "__main__":
    sys.exit(main())
