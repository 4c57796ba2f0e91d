#!/usr/bin/env python3
"""Reference renders of chat templates for kvtrim's Jinja interpreter (tests/jinja/).

Renders every template in tests/data/chat_templates/ (the published templates of Llama 3.1 /
3.2, Qwen2.5, Qwen3, Gemma 2 / 3, Phi-3.5, Mistral, Mistral-Nemo, Mistral-Small-3.2, Ministral-3-Reasoning, SmolLM2 / 3, DeepSeek-R1 and
kvtrim's own features.jinja) over a set of conversations with transformers' own renderer
(transformers.utils.chat_template_utils.render_jinja_template, i.e. what apply_chat_template
runs: jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols and
transformers' tojson / raise_exception / strftime_now), and writes
tests/data/chat_template_refs.json: per case the template, messages, add_generation_prompt,
the extra variables (bos_token, eos_token, tools, enable_thinking, ...) and either the rendered
text or the error raised.

strftime_now() is pinned to 2026-07-26 12:00 UTC (the test passes the same time to kvtrim).
The templates of SmolLM2 and Qwen2.5-Coder are read from the GGUF files in models/ with the
`gguf` package (--models-dir; skipped with a note when the files are absent).

Usage: ~/.cache/kvtrim/refenv/bin/python scripts/ref/make_chat_template_refs.py
Requires: transformers (>= 4.43), jinja2 >= 3.1.6, gguf. Not a build or CI dependency.
"""
import argparse
import datetime as _dt
import json
import os
import sys

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TEMPLATES = os.path.join(ROOT, "tests", "data", "chat_templates")
FIXED_NOW = _dt.datetime(2026, 7, 26, 12, 0, 0)
FIXED_EPOCH = 1785067200  # 2026-07-26 12:00:00 UTC

# template name -> (bos_token, eos_token) as the model's tokenizer_config passes them
# (None: the tokenizer has no such token, the variable is not passed).
SPECIAL = {
    "llama3.1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5": (None, "<|im_end|>"),
    "qwen2.5-coder": (None, "<|im_end|>"),
    "qwen3": (None, "<|im_end|>"),
    "gemma2": ("<bos>", "<eos>"),
    "gemma3": ("<bos>", "<eos>"),
    "phi3.5": ("<s>", "<|endoftext|>"),
    "mistral-instruct": ("<s>", "</s>"),
    "mistral-nemo": ("<s>", "</s>"),
    "mistral-small-3.2": ("<s>", "</s>"),
    "ministral-3-reasoning": ("<s>", "</s>"),
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "smollm3": (None, "<|im_end|>"),
    "deepseek-r1-qwen": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "features": ("<BOS>", "<EOS>"),
}

GGUF_TEMPLATES = {"smollm2": "smollm2", "qwen2.5-coder": "qwen2.5-coder-1.5b"}

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"},
                           "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}

U = {"role": "user", "content": "Hi! What is the capital of France?"}
A = {"role": "assistant", "content": "The capital of France is Paris."}
U2 = {"role": "user", "content": "  And of Germany?\nAnswer briefly.  "}
S = {"role": "system", "content": "You are a terse assistant."}
UNI = {"role": "user", "content": "Grüße — 你好, мир! 😀 Ünïcödé \"quotes\" and 'apostrophes' \\ backslash\ttab"}


def conversations(name):
    """(label, messages, add_generation_prompt, extra kwargs) for a template."""
    cases = [
        ("user", [U], True, {}),
        ("user_nogen", [U], False, {}),
        ("system_user", [S, U], True, {}),
        ("multi_turn", [U, A, U2], True, {}),
        ("system_multi_turn_nogen", [S, U, A, U2, A], False, {}),
        ("unicode", [UNI], True, {}),
        ("empty", [], True, {}),
        ("assistant_first", [A, U], True, {}),
        ("user_user", [U, U2], True, {}),
    ]
    if name in ("llama3.1", "llama3.2", "qwen2.5", "qwen3", "mistral-nemo", "smollm3", "qwen2.5-coder"):
        cases.append(("tools", [S, U], True, {"tools": [TOOL]}))
    if name in ("qwen3", "smollm3"):
        cases.append(("no_thinking", [U], True, {"enable_thinking": False}))
        cases.append(("thinking", [S, U, A, U2], True, {"enable_thinking": True}))
    if name in ("llama3.1", "llama3.2"):
        cases.append(("date_string", [U], True, {"date_string": "01 Jan 2025"}))
    if name in ("qwen2.5", "qwen3", "qwen2.5-coder"):
        cases.append(("tool_messages", [U, {"role": "assistant", "content": "Checking."},
                                        {"role": "tool", "content": "{\"temp\": 21}"},
                                        {"role": "tool", "content": "{\"temp\": 22}"}], True, {}))
    return cases


def load_templates(models_dir):
    out = {}
    for fn in sorted(os.listdir(TEMPLATES)):
        if fn.endswith(".jinja"):
            with open(os.path.join(TEMPLATES, fn), encoding="utf-8", newline="") as f:
                out[fn[: -len(".jinja")]] = f.read()
    try:
        from gguf import GGUFReader
    except ImportError:
        GGUFReader = None
    for name, model in GGUF_TEMPLATES.items():
        path = os.path.join(models_dir, model + ".gguf")
        if GGUFReader is None or not os.path.exists(path):
            print(f"note: {path} (or the gguf package) missing: keeping tests/data/chat_templates/{name}.jinja",
                  file=sys.stderr)
            continue
        field = GGUFReader(path).fields["tokenizer.chat_template"]
        text = bytes(field.parts[field.data[0]]).decode("utf-8")
        with open(os.path.join(TEMPLATES, name + ".jinja"), "w", encoding="utf-8", newline="") as f:
            f.write(text)
        out[name] = text
    return out


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", default=os.path.join(ROOT, "models"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "chat_template_refs.json"))
    args = ap.parse_args()
    ctu.datetime = _FixedDatetime  # strftime_now() reads datetime.now()
    ctu._compile_jinja_template.cache_clear()
    templates = load_templates(args.models_dir)
    cases = []
    for name, text in templates.items():
        bos, eos = SPECIAL[name]
        for label, msgs, agp, extra in conversations(name):
            kwargs = dict(extra)
            if bos is not None:
                kwargs["bos_token"] = bos
            if eos is not None:
                kwargs["eos_token"] = eos
            tools = kwargs.pop("tools", None)
            case = {"template": name, "case": label, "messages": msgs, "add_generation_prompt": agp,
                    "tools": tools, "vars": kwargs}
            try:
                rendered, _ = ctu.render_jinja_template(
                    conversations=[msgs], tools=tools, chat_template=text, add_generation_prompt=agp, **kwargs)
                case["rendered"] = rendered[0]
            except jinja2.exceptions.TemplateError as e:
                # raise_exception(msg) raises TemplateError(msg); other jinja errors subclass it
                case["error"] = str(e)
                case["raised"] = type(e) is jinja2.exceptions.TemplateError
            except Exception as e:  # noqa: BLE001 - a Python error inside the template (e.g. TypeError)
                case["error"] = f"{type(e).__name__}: {e}"
                case["raised"] = False
            cases.append(case)
    doc = {
        "generator": "scripts/ref/make_chat_template_refs.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "strftime_now_epoch": FIXED_EPOCH,
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in c for c in cases)
    print(f"wrote {args.out}: {len(cases)} cases over {len(templates)} templates ({n_err} expected errors)")


if __name__ == "__main__":
    main()
