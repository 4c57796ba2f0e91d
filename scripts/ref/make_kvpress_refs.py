#!/usr/bin/env python3
"""Reference selections of NVIDIA kvpress's token-eviction presses on SmolLM2 (issue 13).

Writes tests/data/kvpress_refs.json with, for 3 fixed contexts (token ids stored, so kvtrim
runs the identical ids; 384 / 480 / 560 tokens from WikiText-2 test and data/books at fixed
offsets, tokenized by transformers from the GGUF, no BOS, no chat template):
  - for each kvpress press at compression_ratio 0.5 with kvpress's defaults (SnapKV, PyramidKV,
    StreamingLLM, TOVA, Knorm, ExpectedAttention, ObservedAttention, KVCompose, KVzip,
    AdaKV(SnapKV)): the context tokens each (layer, kv head) KEEPS after the prefill, as a hex
    bitmask per head (hex digit i holds tokens 4i..4i+3, bit j = token 4i+j); for ThinK
    (key_channel_compression_ratio 0.5) the key CHANNELS each (layer, kv head) keeps, as a
    bitmask over head_dim, in transformers' rotate-half channel order (GGUF llama files store
    q/k rows interleaved: HF channel i < d/2 is kvtrim's 2i, channel i + d/2 is kvtrim's 2i+1);
  - KVCompose task-aware ("kvcompose_aware"): kvpress 0.5.5's KVComposePress feeds every
    registered prompt after the context with the cache and aggregates each prompt token's
    attention to the context (so the prompt's own keys are in each softmax's denominator); its
    pipeline never registers one, so the script sets QUESTION's ids (stored as question_ids)
    right after the press registers the context;
  - each press's options (dataclass fields), so the C++ test sets kvtrim's to match, or the
    error string when the press failed to run. KVzip: its pipeline expects the chat template's
    user prefix before the context and reconstructs only what follows; here the context's first
    n_sink (4) tokens take that place (sinks, never reconstructed, as kvtrim's kvzip), and the
    reconstruction prompt's ids (repeat_prefix_ids: instruction + the template's assistant
    opening) are stored;
  - the float32 logits (top-20 ids and values) at the last position of each context, no press;
  - the kvpress / transformers / torch versions and this script's command line.
The kept sets are captured, not re-derived: ScorerPress subclasses through their own score()
and the top-k their compress() takes (checked against the keys compress() actually gathered),
AdaKV and KVzip through module.masked_key_indices, KVCompose through its per-head masks,
ThinK from the channels compress() zeroed (checked against its own score).
tests/press/kvpress_ref_model_test.cpp compares kvtrim's plans with these.

Needs (never a dependency of the build or CI; CPU torch is enough, ~3 min):
  python3 -m venv /opt/kvpress-venv && /opt/kvpress-venv/bin/pip install kvpress==0.5.5 gguf
  models/smollm2.gguf (python3 scripts/install_models.py smollm2), ../shared/data/wikitext-2.
usage: /opt/kvpress-venv/bin/python scripts/ref/make_kvpress_refs.py [--out tests/data/kvpress_refs.json]
       [--only NAME,...]  (re-run only these presses, keeping the rest of --out as it is)
       [--gguf FILE --presses NAME,... --context-names A,B --ctx-tokens T]  (another model, some
       presses, the named contexts cut to T tokens: the Qwen / Gemma references of issue 43:
       --gguf qwen2.5-coder-1.5b.gguf --context-names wikitext2_test --ctx-tokens 1152
         --out tests/data/kvpress_refs_qwen.json
       --gguf gemma3-270m.gguf --context-names wikitext2_test,pg_worked,pg_popular --ctx-tokens 500
         --out tests/data/kvpress_refs_gemma3.json)
"""
import argparse
import dataclasses
import importlib.metadata as md
import json
import os
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RATIO = 0.5
# The task of the task-aware KVCompose reference (appended to each context, no BOS).
QUESTION = "\n\nQuestion: What is the passage above about, and who is in it? Answer:"
TOP_LOGITS = 20
# (name, file relative to the repo, character offset, tokens): fixed and deterministic. The
# text from the offset's next line start is tokenized and cut to `tokens` ids.
CONTEXTS = [
    ("wikitext2_test", "../shared/data/wikitext-2/test.txt", 200000, 384),
    ("moby_dick", "data/books/moby_dick.txt", 300000, 480),
    ("sherlock_holmes", "data/books/sherlock_holmes.txt", 150000, 560),
    # Paul Graham's essays (../shared/data/haystack): the other models' references (--context-names).
    ("pg_worked", "../shared/data/haystack/paul_graham/worked.txt", 20000, 560),
    ("pg_popular", "../shared/data/haystack/paul_graham/popular.txt", 10000, 560),
]


def bitmask_hex(kept, n):
    """Hex string: digit i = tokens 4i..4i+3, bit j of the digit = token 4i+j."""
    bits = [0] * ((n + 3) // 4)
    for t in kept:
        bits[t // 4] |= 1 << (t % 4)
    return "".join("0123456789abcdef"[b] for b in bits)


def jsonable(v):
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        d = {"class": type(v).__name__}
        for f in dataclasses.fields(v):
            d[f.name] = jsonable(getattr(v, f.name))
        return d
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return repr(v)


def load_contexts(tok, names, ctx_tokens=None):
    out = []
    for name, rel, offset, n_tok in [c for c in CONTEXTS if c[0] in names]:
        n_tok = ctx_tokens or n_tok
        path = os.path.normpath(os.path.join(REPO, rel))
        with open(path, encoding="utf-8") as f:
            text = f.read()
        start = text.index("\n", offset) + 1
        ids = tok.encode(text[start:start + 8 * n_tok], add_special_tokens=False)
        if len(ids) < n_tok:
            raise SystemExit(f"{path}: fewer than {n_tok} tokens after offset {offset}")
        out.append({"name": name, "source": rel, "char_offset": start, "ids": ids[:n_tok]})
    return out


class Capture:
    """Per-layer kept sets recorded while a press runs."""

    def __init__(self, n_layer):
        self.kept = [None] * n_layer  # [layer] -> [kv head] -> sorted kept indices
        self.checked = 0


def wrap_scorer(press, cap, kvp):
    """Records the top-k of a ScorerPress exactly as its compress() takes it."""
    import torch

    inner_compress = press.compress
    inner_score = press.score

    def compress(module, hidden_states, keys, values, attentions, kwargs):
        stash = {}

        def score(*a, **k):
            s = inner_score(*a, **k)
            stash["s"] = s.detach().clone()
            return s

        press.score = score
        try:
            keys_in = keys.clone()
            out_k, out_v = inner_compress(module, hidden_states, keys, values, attentions, kwargs)
        finally:
            press.score = inner_score
        k_len = keys_in.shape[2]
        if isinstance(press, kvp.PyramidKVPress):
            n_kept = press.get_layer_budget(module, k_len)
        else:
            n_kept = kvp.utils.compute_n_kept(k_len, press.compression_ratio)
        idx = stash["s"].topk(n_kept, dim=-1).indices  # as ScorerPress.compress
        gathered = keys_in.gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, keys_in.shape[-1]))
        if not torch.equal(gathered, out_k):
            raise RuntimeError(f"layer {module.layer_idx}: recomputed top-k differs from compress()'s gather")
        cap.checked += 1
        cap.kept[int(module.layer_idx)] = [sorted(idx[0, h].tolist()) for h in range(idx.shape[1])]
        return out_k, out_v

    press.compress = compress
    return lambda: setattr(press, "compress", inner_compress)


def wrap_think(press, cap):
    """Kept key channels of ThinK: the complement of what compress() zeroes, checked against
    the score compress() computes (its own code, re-run on a copy of the inputs)."""
    import torch

    inner_compress = press.compress

    def compress(module, hidden_states, keys, values, attentions, kwargs):
        keys_in = keys.clone()
        out_k, out_v = inner_compress(module, hidden_states, keys, values, attentions, kwargs)
        bsz, nkv, k_len, d = keys_in.shape
        g = module.config.num_attention_heads // nkv
        q = press.compute_window_queries(module, kwargs["hidden_states"], kwargs["position_embeddings"])
        qn = torch.pow(q, 2).mean(dim=2).view(bsz, nkv, g, d).mean(2)
        ks = qn * torch.pow(keys_in, 2).mean(dim=2)
        n_pruned = int(d * press.key_channel_compression_ratio)
        pruned = ks.topk(n_pruned, dim=-1, largest=False).indices
        kept = []
        for h in range(nkv):
            p = set(pruned[0, h].tolist())
            zero = {c for c in range(d) if bool((out_k[0, h, :, c] == 0).all())}
            if p != zero:
                raise RuntimeError(f"think layer {module.layer_idx} head {h}: zeroed channels != recomputed")
            kept.append([c for c in range(d) if c not in p])
        cap.checked += 1
        cap.kept[int(module.layer_idx)] = kept
        return out_k, out_v

    press.compress = compress
    return lambda: setattr(press, "compress", inner_compress)


def kept_from_masked(model, n_ctx, n_kv):
    """Complement of module.masked_key_indices (AdaKV, KVzip: batch 1)."""
    out = []
    for layer in model.model.layers:
        mk = getattr(layer.self_attn, "masked_key_indices", None)
        if mk is None:
            raise RuntimeError(f"layer {layer.self_attn.layer_idx}: no masked_key_indices")
        _, heads, seqs = mk
        masked = [set() for _ in range(n_kv)]
        for h, t in zip(heads.tolist(), seqs.tolist()):
            masked[h].add(t)
        out.append([[t for t in range(n_ctx) if t not in masked[h]] for h in range(n_kv)])
    return out


def clear_masks(model):
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None


def run_press(name, make, model, ids, kvp, tok, question_ids=None):
    import torch
    from transformers import DynamicCache

    cfg = model.config
    n_layer, n_kv = cfg.num_hidden_layers, cfg.num_key_value_heads
    n = ids.shape[1]
    press = make()
    cap = Capture(n_layer)
    info = {"options": jsonable(press)}
    clear_masks(model)
    restore = None
    extra = {}
    attn_before = cfg._attn_implementation
    restore_kz = None
    try:
        if isinstance(press, kvp.ThinKPress):
            restore = wrap_think(press, cap)
        elif isinstance(press, kvp.ScorerPress):
            restore = wrap_scorer(press, cap, kvp)
        if isinstance(press, kvp.ObservedAttentionPress):
            model.set_attn_implementation("eager")  # it scores from the returned attention weights
            extra["attn_implementation"] = "eager"
        if isinstance(press, kvp.KVComposePress):
            inner = press.compress_cache

            def compress_cache(m):
                for il in range(n_layer):
                    cap.kept[il] = [torch.nonzero(press.important_mask_per_kv_head[il][h]).flatten().tolist()
                                    for h in range(n_kv)]
                return inner(m)

            press.compress_cache = compress_cache
            if question_ids is not None:
                inner_register = press.register_context_ids

                def register_context_ids(context_ids):
                    inner_register(context_ids)
                    press.register_prompt_ids([torch.tensor([question_ids], dtype=torch.long)])

                press.register_context_ids = register_context_ids
                extra["question_ids"] = list(question_ids)
        if isinstance(press, kvp.KVzipPress):
            # It loads the tokenizer (for the chat template) by model.config.name_or_path, a
            # GGUF directory here: hand it the GGUF's own tokenizer instead.
            import kvpress.presses.kvzip_press as kz

            class _Tok:
                @staticmethod
                def from_pretrained(*a, **k):
                    return tok

            kz_auto = kz.AutoTokenizer
            kz.AutoTokenizer = _Tok
            restore_kz = lambda: setattr(kz, "AutoTokenizer", kz_auto)  # noqa: E731
            inner_prepare = press.prepare

            def prepare(m, t, *a, **k):
                pairs = inner_prepare(m, t, *a, **k)
                extra["repeat_prefix_ids"] = pairs[0][1][0, : pairs[0][1].shape[1] - pairs[0][0].shape[1]].tolist()
                extra["chunks"] = len(pairs)
                return pairs

            press.prepare = prepare
        cache = DynamicCache()
        with torch.no_grad(), press(model):
            if isinstance(press, kvp.KVzipPress):
                # kvpress assumes the context starts with the chat template's user prefix (its
                # pipeline adds it) and reconstructs only what follows it, the prefix's first
                # n_sink tokens serving as sinks. Our contexts are plain text: their first
                # n_sink tokens play the prefix's part (sinks, scored max + 1, not
                # reconstructed), as kvtrim's kvzip does (src/engine/refeed.h).
                extra["prefix_length_default"] = press.prefix_length
                press.prefix_length = press.n_sink
                extra["prefix_length"] = press.prefix_length
            model.model(input_ids=ids, past_key_values=cache)
        if isinstance(press, (kvp.AdaKVPress, kvp.KVzipPress)):
            cap.kept = kept_from_masked(model, n, n_kv)
        if any(k is None for k in cap.kept):
            raise RuntimeError("no selection captured for layers %s" % [i for i, k in enumerate(cap.kept) if k is None])
    except Exception as e:  # recorded, not dropped
        info["error"] = f"{type(e).__name__}: {e}"
        info["traceback"] = traceback.format_exc(limit=4)
        return info
    finally:
        if restore:
            restore()
        if cfg._attn_implementation != attn_before:
            model.set_attn_implementation(attn_before)
        if restore_kz:
            restore_kz()
        clear_masks(model)
    info.update(extra)
    if isinstance(press, kvp.ThinKPress):
        d = model.config.head_dim if getattr(model.config, "head_dim", None) else cfg.hidden_size // cfg.num_attention_heads
        info["head_dim"] = d
        info["channel_layout"] = "hf_rotate_half"
        info["kept_channels"] = [[bitmask_hex(h, d) for h in layer] for layer in cap.kept]
        info["n_kept"] = [[len(h) for h in layer] for layer in cap.kept]
    else:
        info["kept"] = [[bitmask_hex(h, n) for h in layer] for layer in cap.kept]
        info["n_kept"] = [[len(h) for h in layer] for layer in cap.kept]
    info["verified_layers"] = cap.checked
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default=os.path.join(REPO, "models"))
    ap.add_argument("--gguf", default="smollm2.gguf")
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "kvpress_refs.json"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated press names: re-run these, keep the others from --out")
    ap.add_argument("--presses", default="", help="comma-separated press names: a new --out with only these")
    ap.add_argument("--context-names", default="wikitext2_test,moby_dick,sherlock_holmes",
                    help="comma-separated names of CONTEXTS (default: the SmolLM2 reference's three)")
    ap.add_argument("--ctx-tokens", type=int, default=None,
                    help="every context cut to this many tokens (default: 384 / 480 / 560)")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    import kvpress as kvp
    import kvpress.utils  # noqa: F401  (kvp.utils.compute_n_kept)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(args.model_dir, gguf_file=args.gguf)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, gguf_file=args.gguf, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    contexts = None  # read after the press list: --only takes them (their ids) from --out

    presses = [
        ("snapkv", lambda: kvp.SnapKVPress(compression_ratio=RATIO)),
        ("pyramidkv", lambda: kvp.PyramidKVPress(compression_ratio=RATIO)),
        ("streamingllm", lambda: kvp.StreamingLLMPress(compression_ratio=RATIO)),
        ("tova", lambda: kvp.TOVAPress(compression_ratio=RATIO)),
        ("knorm", lambda: kvp.KnormPress(compression_ratio=RATIO)),
        ("expected_attention", lambda: kvp.ExpectedAttentionPress(compression_ratio=RATIO)),
        ("observed_attention", lambda: kvp.ObservedAttentionPress(compression_ratio=RATIO)),
        ("kvcompose", lambda: kvp.KVComposePress(compression_ratio=RATIO)),
        ("kvzip", lambda: kvp.KVzipPress(compression_ratio=RATIO)),
        ("adakv_snapkv", lambda: kvp.AdaKVPress(kvp.SnapKVPress(compression_ratio=RATIO))),
        ("think", lambda: kvp.ThinKPress(key_channel_compression_ratio=RATIO)),
        ("kvcompose_aware", lambda: kvp.KVComposePress(compression_ratio=RATIO)),
    ]
    only = [x for x in args.only.split(",") if x]
    subset = [x for x in args.presses.split(",") if x]
    known = [n for n, _ in presses]
    for flag, names in (("--only", only), ("--presses", subset)):
        for x in names:
            if x not in known:
                sys.exit(f"{flag}: unknown press '{x}' (known: {', '.join(known)})")
    names = [x for x in args.context_names.split(",") if x]
    for x in names:
        if x not in [c[0] for c in CONTEXTS]:
            sys.exit(f"--context-names: unknown context '{x}' (known: {', '.join(c[0] for c in CONTEXTS)})")
    if only and (subset or args.ctx_tokens or args.context_names != ap.get_default("context_names")):
        sys.exit("--only re-runs presses over --out's own contexts: it takes no --presses / --context-names / --ctx-tokens")
    if subset:
        presses = [(n, m) for n, m in presses if n in subset]
    old = None
    if only:
        with open(args.out) as f:
            old = json.load(f)
        if old.get("versions") != {p: md.version(p) for p in ("kvpress", "transformers", "torch", "gguf")}:
            sys.exit(f"--only: {args.out} was made with {old.get('versions')}; re-run every press instead")
        presses = [(n, m) for n, m in presses if n in only]
        contexts = [{k: v for k, v in c.items() if k in ("name", "source", "char_offset", "ids")} for c in old["contexts"]]
    else:
        contexts = load_contexts(tok, names, args.ctx_tokens)

    out = {
        "about": "kvpress reference selections for tests/press/kvpress_ref_model_test.cpp; made by "
                 "scripts/ref/make_kvpress_refs.py (see its docstring for the formats)",
        "command": " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]),
        "versions": {p: md.version(p) for p in ("kvpress", "transformers", "torch", "gguf")},
        "python": sys.version.split()[0],
        "model": args.gguf,
        "dtype": "float32 (transformers dequantizes the GGUF weights)",
        "attn_implementation": "sdpa (eager where a press needs the attention weights)",
        "compression_ratio": RATIO,
        "bitmask": "hex digit i = tokens (or channels) 4i..4i+3, bit j of the digit = index 4i+j",
        "contexts": [],
    }
    question_ids = tok(QUESTION, add_special_tokens=False)["input_ids"]
    for ci, c in enumerate(contexts):
        ids = torch.tensor([c["ids"]], dtype=torch.long)
        if old is not None:  # only some presses: the rest of the entry as it was
            assert old["contexts"][ci]["ids"] == c["ids"], "the contexts changed: re-run every press"
            entry = old["contexts"][ci]
            for name, make in presses:
                t = time.time()
                entry["presses"][name] = run_press(name, make, model, ids, kvp, tok,
                                                   question_ids if name == "kvcompose_aware" else None)
                entry["presses"][name]["seconds"] = round(time.time() - t, 2)
                print(f"{c['name']:16s} {name:20s} {time.time() - t:6.2f} s", file=sys.stderr, flush=True)
            out["contexts"].append(entry)
            continue
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1].float()
        top = logits.topk(TOP_LOGITS)
        entry = dict(c)
        entry["n"] = len(c["ids"])
        entry["top_ids"] = top.indices.tolist()
        entry["top_logits"] = [round(float(x), 5) for x in top.values]
        entry["presses"] = {}
        for name, make in presses:
            t = time.time()
            entry["presses"][name] = run_press(name, make, model, ids, kvp, tok,
                                               question_ids if name == "kvcompose_aware" else None)
            entry["presses"][name]["seconds"] = round(time.time() - t, 2)
            err = entry["presses"][name].get("error")
            print(f"{c['name']:16s} {name:20s} {time.time() - t:6.2f} s" + (f"  ERROR {err}" if err else ""),
                  file=sys.stderr, flush=True)
        out["contexts"].append(entry)
    if old is not None:
        out["seconds"] = old.get("seconds")
        out["command"] = old.get("command", "") + " ; " + out["command"]
    else:
        out["seconds"] = round(time.time() - t0, 1)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes) in {out['seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
