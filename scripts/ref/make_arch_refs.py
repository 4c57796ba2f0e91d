#!/usr/bin/env python3
"""Tiny random-weight checkpoints of the architectures kvtrim loads, converted to GGUF by
llama.cpp's own converter, with reference logits from Hugging Face transformers and llama.cpp.

For each architecture (llama3, qwen3, mistral, qwen2-yarn, gemma2, phi3, phi3-longrope,
qwen3moe) this script
  1. builds a model from the architecture's real transformers config class (few layers, real
     head layout, hidden 256, vocab 512), random weights from a fixed seed (norm weights and
     biases perturbed too, so that a missing norm or bias shows), saved in f32 with
     save_pretrained, plus a tiny tokenizer it trains (byte-level BPE or SentencePiece) on a
     few KB of WikiText-2, because the converter needs one;
  2. converts it with vendor/llama.cpp/convert_hf_to_gguf.py (through hf_to_gguf.py, which only
     forces the BPE pre-tokenizer name) to f32 and f16, and quantizes the f32 file with
     llama-quantize to Q8_0, Q4_K_M and Q6_K;
  3. feeds one fixed sequence of 300 token ids (seeded; BOS first where the GGUF adds BOS) to
     transformers (f32, eager attention) and to llama.cpp (llama-cpp-python, every file), and
     records the full logit rows at fixed positions, the argmax at every position, 32 greedy
     tokens from the first 16 ids, and how far llama.cpp is from transformers per file;
  4. writes tests/data/arch/<name>.json and copies the chosen GGUF files next to it;
     tests/data/arch/summary.json holds the agreement matrix without logits.

Reference tools live in a venv outside the repository (see docs/results/models/README.md).
llama-cpp-python is loaded with LLAMA_CPP_LIB_PATH pointing at a shared build of the same
vendored llama.cpp (the one that also gives llama-quantize).

usage: make_arch_refs.py [--archs llama3,qwen3,...] [--work DIR] [--lcpp DIR] [--quantize BIN]
                         [--lib DIR] [--skip-lcpp] [--force]
"""
import argparse
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(REPO, "tests", "data", "arch")
CACHE = os.path.expanduser("~/.cache/kvtrim")
LCPP_PY_VERSION = "0.3.36"
DEFAULT_SRC = os.path.join(CACHE, "llamacpp", f"llama_cpp_python-{LCPP_PY_VERSION}")
DEFAULT_BUILD = os.path.join(CACHE, "llamacpp", "build-refshared", "bin")

VOCAB = 512
N_TOKENS = 300
POSITIONS = [0, 1, 2, 5, 10, 20, 31, 32, 33, 48, 63, 64, 65, 100, 127, 128, 200, 255, 256, 299]
N_PROMPT = 16
N_GREEDY = 32
ALL_TYPES = ["f32", "f16", "q8_0", "q4_k_m", "q6_k"]
QUANT_NAMES = {"q8_0": "Q8_0", "q4_k_m": "Q4_K_M", "q6_k": "Q6_K"}

# Tokenizers. BPE: byte-level, GPT-2 style pre-tokenizer; the GGUF declares the pre-tokenizer
# named here (kvtrim and llama.cpp then split text their own way for that name; the references
# are on token ids, so only loading matters). SPM: SentencePiece BPE with byte fallback.
TOKENIZERS = {
    "bpe-llama3": dict(kind="bpe", pre="llama-bpe",
                       specials=["<|begin_of_text|>", "<|end_of_text|>"], bos=0, eos=1),
    "bpe-qwen": dict(kind="bpe", pre="qwen2",
                     specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None, eos=0),
    "spm": dict(kind="spm", pre=None, specials=["<unk>", "<s>", "</s>"], bos=1, eos=2),
}


def common(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                initializer_range=0.08, rms_norm_eps=1e-6, max_position_embeddings=512)
    base.update(kw)
    return base


def longrope_factors(n):
    short = [round(1.0 + 0.5 * i / (n - 1), 4) for i in range(n)]
    long = [round(1.0 + 7.0 * (i / (n - 1)) ** 2, 4) for i in range(n)]
    return short, long


def arch_specs():
    short, long = longrope_factors(32)  # head_dim 64 -> 32 rotation pairs
    return {
        # Llama 3: rope_freqs.weight (the converter computes the per-pair divisors); the
        # original context (64) and the factors make low and high frequencies differ here.
        "llama3": dict(cls="LlamaConfig", tok="bpe-llama3", add_bos=True, seed=1001,
                       cfg=common(num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                  tie_word_embeddings=False, hidden_act="silu",
                                  rope_parameters=dict(rope_type="llama3", rope_theta=500000.0,
                                                       factor=8.0, low_freq_factor=1.0,
                                                       high_freq_factor=4.0,
                                                       original_max_position_embeddings=64))),
        # Qwen3: QK-norm, no biases, n_head * head_dim (512) != hidden (256), tied output.
        "qwen3": dict(cls="Qwen3Config", tok="bpe-qwen", add_bos=False, seed=1002,
                      cfg=common(num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                 tie_word_embeddings=True, attention_bias=False,
                                 rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
        # Mistral-style llama: head_dim 128 with hidden 256 and 4 heads (q is 512 wide).
        "mistral": dict(cls="MistralConfig", tok="spm", add_bos=True, seed=1003,
                        cfg=common(num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                                   tie_word_embeddings=False, sliding_window=None,
                                   rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
        # Qwen2 with YaRN: factor = max_position_embeddings / original (transformers derives the
        # attention factor from that ratio), QKV biases, tied output.
        "qwen2-yarn": dict(cls="Qwen2Config", tok="bpe-qwen", add_bos=False, seed=1004,
                           cfg=common(num_attention_heads=4, num_key_value_heads=2,
                                      tie_word_embeddings=True, max_position_embeddings=256,
                                      rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0,
                                                           factor=4.0,
                                                           original_max_position_embeddings=64))),
        # Gemma 2: soft-caps, sliding window 32 on even layers (0, 2), sandwich norms, tied,
        # embeddings scaled by sqrt(hidden). query_pre_attn_scalar = head_dim, because llama.cpp
        # scales by 1/sqrt(head_dim) for every Gemma 2 but the 27B and the GGUF has no key for it.
        "gemma2": dict(cls="Gemma2Config", tok="spm", add_bos=True, seed=1005,
                       cfg=common(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=64, query_pre_attn_scalar=64,
                                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                  sliding_window=32, hidden_activation="gelu_pytorch_tanh",
                                  initializer_range=0.1,
                                  rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
        # Phi-3: fused qkv and gate_up. sliding_window None: llama.cpp disables Phi-3's sliding
        # window (a warning at load), so a window would only make the two references differ.
        "phi3": dict(cls="Phi3Config", tok="spm", add_bos=False, seed=1006,
                     cfg=common(num_attention_heads=4, num_key_value_heads=2,
                                tie_word_embeddings=False, sliding_window=None,
                                original_max_position_embeddings=512,
                                rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
        # Phi-3 LongRoPE: rope_factors_long/short tensors, attention factor from the ratio
        # 256 / 64. llama.cpp takes the long factors when n_ctx > original context (here
        # always: n_ctx 512); transformers when the sequence is longer than 64, so the greedy
        # run (48 tokens) is made to use the long factors too (see hf_forward).
        "phi3-longrope": dict(cls="Phi3Config", tok="spm", add_bos=False, seed=1007,
                              cfg=common(num_attention_heads=4, num_key_value_heads=2,
                                         tie_word_embeddings=False, sliding_window=None,
                                         max_position_embeddings=256,
                                         original_max_position_embeddings=64,
                                         rope_parameters=dict(rope_type="longrope",
                                                              rope_theta=10000.0,
                                                              short_factor=short, long_factor=long,
                                                              original_max_position_embeddings=64))),
        # Qwen3-MoE: 8 experts, top-2, normalized top-k weights, every layer sparse.
        "qwen3moe": dict(cls="Qwen3MoeConfig", tok="bpe-qwen", add_bos=False, seed=1008,
                         cfg=common(num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                    tie_word_embeddings=False, num_experts=8,
                                    num_experts_per_tok=2, moe_intermediate_size=256,
                                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    }


ORDER = ["llama3", "qwen3", "mistral", "qwen2-yarn", "gemma2", "phi3", "phi3-longrope", "qwen3moe"]


def log(msg):
    print(msg, flush=True)


def nice_run(cmd, **kw):
    log("  $ " + " ".join(str(c) for c in cmd))
    subprocess.run(["nice", "-n", "19"] + [str(c) for c in cmd], check=True, **kw)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def r5(x):
    """Rounds to 5 significant digits (as JSON numbers)."""
    return [float(f"{v:.5g}") for v in np.asarray(x, dtype=np.float64).ravel()]


# ---------------------------------------------------------------------------------------
# Tokenizers


def training_text(max_bytes=60000):
    path = os.path.join(REPO, "..", "shared", "data", "wikitext-2", "test.txt")
    lines, n = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or not line.isascii():
                continue
            lines.append(line)
            n += len(line)
            if n >= max_bytes:
                break
    return lines


def write_bpe_tokenizer(d, tk):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=tk["specials"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    tok.save(os.path.join(d, "tokenizer.json"))
    assert tok.get_vocab_size() <= VOCAB
    for i, s in enumerate(tk["specials"]):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
          "add_eos_token": False, "model_max_length": 4096, "clean_up_tokenization_spaces": False,
          "eos_token": tk["specials"][tk["eos"]],
          "bos_token": tk["specials"][tk["bos"]] if tk["bos"] is not None else None}
    return tc


def write_spm_tokenizer(d, tk):
    import sentencepiece as spm

    prefix = os.path.join(d, "spm")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text()), model_prefix=prefix, vocab_size=VOCAB,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, split_digits=True, num_threads=1, minloglevel=2)
    os.replace(prefix + ".model", os.path.join(d, "tokenizer.model"))
    os.remove(prefix + ".vocab")
    return {"tokenizer_class": "LlamaTokenizer", "add_bos_token": False, "add_eos_token": False,
            "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
            "model_max_length": 4096, "clean_up_tokenization_spaces": False}


# ---------------------------------------------------------------------------------------
# Checkpoint


def build_checkpoint(name, spec, d):
    import torch
    import transformers

    tk = TOKENIZERS[spec["tok"]]
    os.makedirs(d, exist_ok=True)
    ids = dict(bos_token_id=tk["bos"], eos_token_id=tk["eos"], pad_token_id=None)
    cfg = getattr(transformers, spec["cls"])(**spec["cfg"], **ids)
    torch.manual_seed(spec["seed"])
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32,
                                                          attn_implementation="eager")
    # Norm weights start at 1 (Gemma: 0, as 1 + w) and biases at 0: perturb them, so a norm or
    # bias that is read wrong or dropped changes the logits.
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1 and "norm" in pname:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1 and pname.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(d, safe_serialization=True)
    tc = write_bpe_tokenizer(d, tk) if tk["kind"] == "bpe" else write_spm_tokenizer(d, tk)
    tc["add_bos_token"] = bool(spec["add_bos"])
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=1)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"  {spec['cls']}: {n_params} parameters -> {d}")


def token_ids(spec):
    tk = TOKENIZERS[spec["tok"]]
    rng = np.random.default_rng(spec["seed"] + 7)
    ids = [int(t) for t in rng.integers(0, VOCAB, N_TOKENS)]
    if spec["add_bos"]:
        ids[0] = tk["bos"]
    return ids


# ---------------------------------------------------------------------------------------
# transformers


def hf_forward(d, ids):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
    rope = getattr(model.model, "rotary_emb", None)
    if rope is not None and getattr(rope, "long_inv_freq", None) is not None:
        # LongRoPE: transformers picks the factor set by the length of the sequence in this call,
        # llama.cpp by the context size. The 300-token forward used the long factors; keep them
        # for the short greedy run as llama.cpp (n_ctx 512 > 64) does.
        rope.original_inv_freq = rope.long_inv_freq.clone()
    seq = list(ids[:N_PROMPT])
    greedy = []
    with torch.no_grad():
        for _ in range(N_GREEDY):  # no cache: every step recomputes the whole sequence
            out = model(torch.tensor([seq]), use_cache=False).logits[0, -1]
            t = int(torch.argmax(out))
            greedy.append(t)
            seq.append(t)
    return logits, greedy


# ---------------------------------------------------------------------------------------
# llama.cpp


def convert(d, spec, lcpp, out_path, outtype):
    tk = TOKENIZERS[spec["tok"]]
    cmd = [sys.executable, os.path.join(HERE, "hf_to_gguf.py"), "--lcpp", lcpp]
    if tk["pre"]:
        cmd += ["--pre", tk["pre"]]
    cmd += ["--", d, "--outtype", outtype, "--outfile", out_path]
    nice_run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def quantize(binary, src, dst, qname, threads):
    """llama-quantize SRC DST TYPE; without the binary, the function it calls
    (llama_model_quantize in libllama, default parameters but the file type), in process."""
    if binary and os.path.isfile(binary):
        nice_run([binary, src, dst, qname, str(threads)], stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
        return
    import llama_cpp as lc

    log(f"  llama_model_quantize {os.path.basename(src)} -> {os.path.basename(dst)} ({qname})")
    params = lc.llama_model_quantize_default_params()
    params.ftype = getattr(lc, f"LLAMA_FTYPE_MOSTLY_{qname}")
    params.nthread = threads
    rc = lc.llama_model_quantize(src.encode(), dst.encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src}, {qname}) returned {rc}")


def llamacpp_forward(path, ids, threads):
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=512, n_batch=512, n_ubatch=512, logits_all=True,
                n_threads=threads, n_threads_batch=threads, verbose=False)
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)], dtype=np.float32)
    llm.reset()
    llm.eval(ids[:N_PROMPT])
    greedy = []
    for _ in range(N_GREEDY):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        greedy.append(t)
        llm.eval([t])
    del llm
    return logits, greedy


def gguf_summary(path):
    """Metadata keys (scalars as values, arrays as [type, length]) and tensors of a GGUF."""
    from gguf import GGUFReader
    from gguf.constants import GGUFValueType

    r = GGUFReader(path)
    keys = {}
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            continue
        t = field.types[0] if field.types else None
        if t == GGUFValueType.ARRAY:
            sub = field.types[-1].name if len(field.types) > 1 else "?"
            if name.startswith("tokenizer.ggml."):
                keys[name] = {"array": sub, "len": len(field.data)}
            else:
                keys[name] = field.contents()
        else:
            keys[name] = field.contents()
    tensors = [[t.name, t.tensor_type.name, [int(x) for x in t.shape]] for t in r.tensors]
    return keys, tensors


def lcpp_commit(src):
    try:
        text = open(os.path.join(src, "CHANGELOG.md"), encoding="utf-8").read()
    except OSError:
        return "unknown"
    sec = text.split(f"## [{LCPP_PY_VERSION}]", 1)
    if len(sec) < 2:
        return "unknown"
    m = re.search(r"llama\.cpp@([0-9a-f]+)", sec[1].split("\n## [", 1)[0])
    return m.group(1) if m else "unknown"


def versions(src):
    v = {}
    for p in ["torch", "transformers", "tokenizers", "sentencepiece", "safetensors", "numpy",
              "gguf", "llama_cpp_python"]:
        try:
            v[p] = md.version(p)
        except md.PackageNotFoundError:
            v[p] = None
    v["llama.cpp"] = lcpp_commit(src)
    v["python"] = sys.version.split()[0]
    return v


# ---------------------------------------------------------------------------------------


def compare(hf_logits, hf_greedy, lc_logits, lc_greedy):
    d = np.abs(hf_logits[POSITIONS].astype(np.float64) - lc_logits[POSITIONS])
    agree = np.argmax(hf_logits, axis=1) == np.argmax(lc_logits, axis=1)
    prefix = 0
    for a, b in zip(hf_greedy, lc_greedy):
        if a != b:
            break
        prefix += 1
    return {"max_abs_dlogit": float(f"{d.max():.4g}"),
            "max_abs_dlogit_per_position": [float(f"{x:.4g}") for x in d.max(axis=1)],
            "mean_abs_dlogit": float(f"{d.mean():.4g}"),
            "top1_agree": float(f"{agree.mean():.4g}"), "top1_agree_count": int(agree.sum()),
            "greedy_match_prefix": prefix}


def margins(logits):
    s = np.sort(logits, axis=1)
    m = s[:, -1] - s[:, -2]
    return {"min": float(f"{m.min():.4g}"), "median": float(f"{np.median(m):.4g}"),
            "logit_std": float(f"{logits.std():.4g}")}


def run_arch(name, spec, args, vers):
    log(f"== {name}")
    work = os.path.join(args.work, name)
    hf_dir = os.path.join(work, "hf")
    if args.force and os.path.isdir(work):
        shutil.rmtree(work)
    if not os.path.isfile(os.path.join(hf_dir, "model.safetensors")):
        build_checkpoint(name, spec, hf_dir)
    ids = token_ids(spec)
    hf_logits, hf_greedy = hf_forward(hf_dir, ids)
    mg = margins(hf_logits)
    log(f"  transformers: top-1 margin min {mg['min']} median {mg['median']}, "
        f"logit std {mg['logit_std']}")
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    ref = {"name": name, "hf_class": cfg["architectures"][0], "config": cfg,
           "seed": spec["seed"], "tokenizer": {"kind": TOKENIZERS[spec["tok"]]["kind"],
                                               "pre": TOKENIZERS[spec["tok"]]["pre"],
                                               "specials": TOKENIZERS[spec["tok"]]["specials"]},
           "vocab_size": VOCAB, "add_bos": bool(spec["add_bos"]),
           "bos": TOKENIZERS[spec["tok"]]["bos"] if spec["add_bos"] else None,
           "tokens": ids, "positions": POSITIONS, "n_prompt": N_PROMPT, "n_greedy": N_GREEDY,
           "transformers": {"logits": [r5(hf_logits[p]) for p in POSITIONS],
                            "argmax": [int(x) for x in np.argmax(hf_logits, axis=1)],
                            "greedy": hf_greedy, "top1_margin": mg},
           "files": {}, "versions": vers}
    files = {}
    for t in ("f32", "f16"):
        p = os.path.join(work, f"{name}-{t}.gguf")
        if not os.path.isfile(p):
            convert(hf_dir, spec, args.lcpp, p, t)
        files[t] = p
    if args.skip_lcpp:
        return ref
    for t, qn in QUANT_NAMES.items():
        p = os.path.join(work, f"{name}-{t}.gguf")
        if not os.path.isfile(p):
            quantize(args.quantize, files["f32"], p, qn, args.threads)
        files[t] = p
    keys, tensors = gguf_summary(files["f16"])
    gguf_arch = keys["general.architecture"]
    add_bos_key = keys.get("tokenizer.ggml.add_bos_token")
    assert add_bos_key is None or bool(add_bos_key) == bool(spec["add_bos"]), (add_bos_key, spec)
    ref["gguf_arch"] = gguf_arch
    ref["gguf_keys"] = keys
    ref["gguf_tensors_f16"] = tensors
    commit_types = args.commit.get(name, args.commit.get("*"))
    for t in ALL_TYPES:
        p = files[t]
        lc_logits, lc_greedy = llamacpp_forward(p, ids, args.threads)
        cmp = compare(hf_logits, hf_greedy, lc_logits, lc_greedy)
        committed = t in commit_types
        entry = {"file": f"{name}-{t}.gguf" if committed else None, "committed": committed,
                 "bytes": os.path.getsize(p), "sha256": sha256(p),
                 "tensor_types": sorted({tt for _, tt, _ in gguf_summary(p)[1]}),
                 "llamacpp": {"argmax": [int(x) for x in np.argmax(lc_logits, axis=1)],
                              "greedy": lc_greedy},
                 "vs_transformers": cmp}
        if committed:  # logit rows only for the files in the repository (size)
            entry["llamacpp"]["logits"] = [r5(lc_logits[q]) for q in POSITIONS]
        ref["files"][t] = entry
        log(f"  {t:7s} {os.path.getsize(p) / 1e6:6.2f} MB  max|dlogit| {cmp['max_abs_dlogit']:<9} "
            f"top-1 {cmp['top1_agree_count']}/{N_TOKENS}  greedy prefix "
            f"{cmp['greedy_match_prefix']}/{N_GREEDY}{'' if committed else '  (not committed)'}")
        if committed:
            shutil.copyfile(p, os.path.join(OUT, f"{name}-{t}.gguf"))
        else:
            stale = os.path.join(OUT, f"{name}-{t}.gguf")
            if os.path.exists(stale):
                os.remove(stale)
    return ref


def parse_commit(s):
    """'*=f16,q4_k_m;llama3=f16,q8_0' -> {'*': [...], 'llama3': [...]}"""
    out = {}
    for part in s.split(";"):
        k, v = part.split("=", 1)
        out[k.strip()] = [x.strip() for x in v.split(",") if x.strip()]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archs", default=",".join(ORDER))
    ap.add_argument("--work", default=os.path.join(CACHE, "archrefs"))
    ap.add_argument("--lcpp", default=os.path.join(DEFAULT_SRC, "vendor", "llama.cpp"))
    ap.add_argument("--quantize", default=os.path.join(DEFAULT_BUILD, "llama-quantize"))
    ap.add_argument("--lib", default=DEFAULT_BUILD,
                    help="directory of libllama.so for llama-cpp-python (LLAMA_CPP_LIB_PATH)")
    ap.add_argument("--commit",
                    default="*=f16;llama3=f16,q8_0,q4_k_m;qwen3=f16,q4_k_m;qwen3moe=q8_0",
                    help="which file types are copied to tests/data/arch, per arch")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-lcpp", action="store_true",
                    help="transformers and conversion only (no quantization, no llama.cpp run)")
    ap.add_argument("--force", action="store_true", help="rebuild checkpoints and GGUFs")
    args = ap.parse_args()
    args.commit = parse_commit(args.commit)
    if args.lib:
        os.environ.setdefault("LLAMA_CPP_LIB_PATH", args.lib)
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    src = os.path.dirname(os.path.dirname(os.path.abspath(args.lcpp)))
    vers = versions(src)
    log("versions: " + json.dumps(vers))
    specs = arch_specs()
    summary_path = os.path.join(OUT, "summary.json")
    summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
    for name in args.archs.split(","):
        try:
            ref = run_arch(name, specs[name], args, vers)
        except Exception as e:  # record and go on with the next architecture
            log(f"  FAILED: {type(e).__name__}: {e}")
            summary[name] = {"failed": f"{type(e).__name__}: {e}"}
            continue
        if args.skip_lcpp:
            continue
        with open(os.path.join(OUT, f"{name}.json"), "w") as f:
            json.dump(ref, f, separators=(",", ":"))
            f.write("\n")
        summary[name] = {
            "gguf_arch": ref["gguf_arch"], "hf_class": ref["hf_class"],
            "add_bos": ref["add_bos"], "pre": ref["gguf_keys"].get("tokenizer.ggml.pre"),
            "tokenizer_model": ref["gguf_keys"].get("tokenizer.ggml.model"),
            "top1_margin": ref["transformers"]["top1_margin"],
            "files": {t: dict(e["vs_transformers"], committed=e["committed"], bytes=e["bytes"],
                              sha256=e["sha256"])
                      for t, e in ref["files"].items()},
        }
        for t in summary[name]["files"].values():
            t.pop("max_abs_dlogit_per_position", None)
        summary["versions"] = vers
        with open(summary_path, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
