#!/usr/bin/env python3
"""Random-weight GGUF files with the real layer shapes of the models people run, for timing
kvtrim next to llama.cpp per architecture (docs/results/models/speed.md).

The tiny reference files of tests/data/arch (make_arch_refs.py) check the arithmetic; they are
too small to time. Here each architecture gets a checkpoint built from its transformers config
class with the dimensions of a real model (hidden size, heads, head_dim, FFN, experts,
vocabulary: the values of the model's published config.json), random weights (bf16, fixed
seed), converted to f16 GGUF by llama.cpp's own converter and quantized to Q4_K_M by its
llama-quantize. Models of 2B+ parameters keep fewer layers than the real one (`layers` below;
every layer is real-size, and a per-file ratio of two engines does not depend on the count).
Nothing is written into the repository; the files go to --work (default
~/.cache/kvtrim/speedfiles/<name>-q4_k_m.gguf).

Random weights make the files useless for quality and the tokenizer is a tiny trained one
padded to the real vocabulary size (the converter pads with unused tokens): the files are for
timing, where only shapes and types matter.

The two MoE files share everything but the expert count (128 as Qwen3-30B-A3B, and 32), with
the same 8 routed experts per token: decode time that follows active parameters is the same
on both, decode time that follows total parameters is not.

usage: make_speed_files.py [--names a,b] [--work DIR] [--type Q4_K_M] [--threads N] [--force]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_arch_refs as refs  # noqa: E402  (tokenizers, converter and quantizer helpers)

# Real dimensions (from each model's published config.json); `layers` < the real count where
# the model is large, marked in `of`.
SPECS = {
    "llama3.2-1b": dict(
        cls="LlamaConfig", tok="bpe-llama3", add_bos=True, seed=2001, layers=16, of=16,
        cfg=dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                 tie_word_embeddings=True, rms_norm_eps=1e-5, max_position_embeddings=131072,
                 rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0,
                                      low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_max_position_embeddings=8192))),
    "qwen3-0.6b": dict(
        cls="Qwen3Config", tok="bpe-qwen", add_bos=False, seed=2002, layers=28, of=28,
        cfg=dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 tie_word_embeddings=True, rms_norm_eps=1e-6, max_position_embeddings=40960,
                 attention_bias=False,
                 rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    "mistral-7b": dict(
        cls="MistralConfig", tok="spm", add_bos=True, seed=2003, layers=4, of=32,
        cfg=dict(vocab_size=32768, hidden_size=4096, intermediate_size=14336,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                 tie_word_embeddings=False, rms_norm_eps=1e-5, max_position_embeddings=32768,
                 sliding_window=None,
                 rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    "gemma2-2b": dict(
        cls="Gemma2Config", tok="spm", add_bos=True, seed=2004, layers=8, of=26,
        cfg=dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                 query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                 final_logit_softcapping=30.0, sliding_window=4096, rms_norm_eps=1e-6,
                 hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    "phi3-mini": dict(
        cls="Phi3Config", tok="spm", add_bos=False, seed=2005, layers=8, of=32,
        cfg=dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                 num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=False,
                 rms_norm_eps=1e-5, max_position_embeddings=4096,
                 original_max_position_embeddings=4096, sliding_window=None,
                 rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    "qwen3moe-30b-a3b": dict(
        cls="Qwen3MoeConfig", tok="bpe-qwen", add_bos=False, seed=2006, layers=4, of=48,
        cfg=dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                 num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                 num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                 tie_word_embeddings=False, rms_norm_eps=1e-6, max_position_embeddings=40960,
                 rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
}
# The same MoE with a quarter of the experts (same 8 routed per token).
SPECS["qwen3moe-32e"] = dict(SPECS["qwen3moe-30b-a3b"], seed=2007,
                             cfg=dict(SPECS["qwen3moe-30b-a3b"]["cfg"], num_experts=32))
ORDER = list(SPECS)


def build_checkpoint(name, spec, d):
    import torch
    import transformers

    tk = refs.TOKENIZERS[spec["tok"]]
    os.makedirs(d, exist_ok=True)
    ids = dict(bos_token_id=tk["bos"], eos_token_id=tk["eos"], pad_token_id=None)
    cfg = getattr(transformers, spec["cls"])(num_hidden_layers=spec["layers"], initializer_range=0.02,
                                             **spec["cfg"], **ids)
    torch.manual_seed(spec["seed"])
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(d, safe_serialization=True)
    tc = refs.write_bpe_tokenizer(d, tk) if tk["kind"] == "bpe" else refs.write_spm_tokenizer(d, tk)
    tc["add_bos_token"] = bool(spec["add_bos"])
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=1)
    n = sum(p.numel() for p in model.parameters())
    refs.log(f"  {spec['cls']}: {n / 1e9:.2f} B parameters, {spec['layers']} of {spec['of']} layers")
    return n


def make(name, a):
    spec = SPECS[name]
    work = os.path.join(a.work, name)
    out = os.path.join(a.work, f"{name}-{a.type.lower()}.gguf")
    if os.path.isfile(out) and not a.force:
        refs.log(f"{name}: {out} exists")
        return out
    hf = os.path.join(work, "hf")
    f16 = os.path.join(work, f"{name}-f16.gguf")
    refs.log(f"{name}: checkpoint")
    build_checkpoint(name, spec, hf)
    refs.log(f"{name}: convert to f16")
    refs.convert(hf, spec, a.lcpp, f16, "f16")
    subprocess.run(["rm", "-rf", hf], check=True)  # GBs of bf16 safetensors
    refs.log(f"{name}: quantize to {a.type}")
    refs.quantize(a.quantize, f16, out + ".part", a.type, a.threads)
    os.replace(out + ".part", out)
    os.remove(f16)
    refs.log(f"{name}: {out} ({os.path.getsize(out) / 2**20:.0f} MiB)")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--names", default=",".join(ORDER))
    ap.add_argument("--work", default=os.path.join(refs.CACHE, "speedfiles"))
    ap.add_argument("--lcpp", default=os.path.join(refs.DEFAULT_SRC, "vendor", "llama.cpp"))
    ap.add_argument("--quantize", default=os.path.join(refs.CACHE, "llamacpp", "build", "bin",
                                                       "llama-quantize"))
    ap.add_argument("--type", default="Q4_K_M")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    names = [n for n in a.names.split(",") if n]
    for n in names:
        if n not in SPECS:
            sys.exit(f"make_speed_files: unknown name '{n}' (known: {', '.join(ORDER)})")
    os.makedirs(a.work, exist_ok=True)
    for i, n in enumerate(names):
        refs.log(f"[{i + 1}/{len(names)}] {n}")
        make(n, a)


if __name__ == "__main__":
    main()
