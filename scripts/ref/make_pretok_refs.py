#!/usr/bin/env python3
"""Reference splits for kvtrim's BPE pre-tokenizers (tests/tokenizer/pretok_test.cpp).

    make_pretok_refs.py [--out tests/data/pretok_refs.json]

Each family's pre-tokenizer is written here as the public Hugging Face tokenizer.json
patterns (the `pre_tokenizer` of the models that use it; llama.cpp's src/llama-vocab.cpp lists
the same patterns per `tokenizer.ggml.pre`). A family is a sequence of patterns, each applied
as a Hugging Face `Split` with behavior "Isolated": every piece so far is cut into the
pattern's matches and the text between them (Digits(individual_digits=true) is `\\p{N}`,
Digits(false) is `\\p{N}+`, Punctuation(contiguous) is `[\\p{P}...]+`, ByteLevel(use_regex) is
the GPT-2 pattern). The splitting is done by Python's third-party `regex` module (not by
kvtrim's code), over a multilingual text set, and written to tests/data/pretok_refs.json; the
C++ test compares kvtrim's hand-written splitters with it piece for piece.

kvtrim's code-point classes come from Python's unicodedata (tokenizer_unicode_data.h); the
`regex` module has its own, newer Unicode tables. The script checks that both agree on every
code point of the texts for every property the patterns use, so the reference is well-defined.

Requires: regex (pip install regex into ~/.cache/kvtrim/refenv).
"""
import argparse
import json
import os
import sys
import unicodedata

import regex

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# ----------------------------------------------------------------------------- patterns

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
          r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Mistral's tekken (Mistral-Nemo, Mistral Small 3, Ministral, Pixtral's text part).
_UP = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LO = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UP}*{_LO}+|[^\r\n\p{{L}}\p{{N}}]?{_UP}+{_LO}*|\p{{N}}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# OpenAI o200k (GPT-4o; Llama 4 and others reuse it).
_CONTR = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UP}*{_LO}+{_CONTR}|[^\r\n\p{{L}}\p{{N}}]?{_UP}+{_LO}*{_CONTR}"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Seed-Coder: Qwen2 without [\r\n]* after punctuation (and no \r\n inside it).
SEED_CODER = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}"
              r"| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+")
# (non-ASCII class members written as escapes: an editor's Unicode normalisation would
# silently turn e.g. U+212A KELVIN SIGN into "K")
DEEPSEEK_LLM = [
    r"[\r\n]",
    r"\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    r"\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    r"\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    r"\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    r"\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    r"\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102"
    r"\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    r"\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    r"\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    r"\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    r"\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    r"\U0001e900-\U0001e943]+",
    r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}+",
]
DEEPSEEK_CODER = [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"]
DEEPSEEK_V3 = [
    r"\p{N}{1,3}",
    r"[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
# Falcon: Punctuation(contiguous) (Rust's is_ascii_punctuation or \p{P}), ByteLevel(use_regex),
# then 3-digit groups. (Its tokenizer.json also has Digits(individual_digits=false) after
# ByteLevel, which only separates a space from the digits after it; check_llamacpp_vocabs.py
# finds no merge of the space character with a digit in Falcon's vocabulary, so it does not
# change the tokens, and llama.cpp leaves it out too.)
FALCON = [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"]

# kvtrim family name -> the patterns, in order. The names are tokenizer.ggml.pre values; the
# C++ test maps each through the same name table as the tokenizer.
FAMILIES = {
    "gpt-2": [GPT2],
    "smollm": [r"\p{N}", GPT2],  # also starcoder, refact, command-r, ...
    "qwen2": [QWEN2],
    "llama-bpe": [LLAMA3],
    "qwen35": [QWEN35],
    "tekken": [TEKKEN],
    "gpt-4o": [GPT4O],
    "seed-coder": [SEED_CODER],
    "deepseek-llm": DEEPSEEK_LLM,
    "deepseek-coder": DEEPSEEK_CODER,
    "deepseek-v3": DEEPSEEK_V3,
    "falcon": FALCON,
    "gemma4": [r"[^\n]+|[\n]+"],  # llama.cpp's split for Gemma 4 (spaces escaped to U+2581 first)
}

# ----------------------------------------------------------------------------- texts

TEXTS = [
    ("english", "Hello world! The quick brown fox jumps over the lazy dog; it's 5 o'clock."),
    ("contractions", "It's don't we're they've I'm we'll he'd IT'S DON'T You'Re WE'LL o'Neil rock'n'roll ''s' 'x"),
    ("german", "Größenwahn: Die Straße führt über Äcker; ÖL & Übermut. Fußgängerübergänge!"),
    ("french", "Élève à l'école, où naïve Chloé a mangé des crêpes — « c'est ça » ; Œuvre ÉTÉ."),
    ("chinese", "你好，世界！今天天气很好。我们在2024年学习了“大模型”与人工智能（AI）。"),
    ("japanese", "こんにちは、世界。カタカナとひらがな、漢字を混ぜた文章です！ｶﾀｶﾅ（半角）"),
    ("korean", "안녕하세요 세계! 한국어 문장입니다. ㄱㄴㄷ 자모도 있어요."),
    ("arabic", "مرحبا بالعالم! هذه جملة عربية مع أرقام ٣٤٥ و١٢٣٤٥٦٧. السَّلَامُ عَلَيْكُمْ"),
    ("hindi", "नमस्ते दुनिया! यह हिन्दी वाक्य है। संख्या ९८७६ और क्षत्रिय।"),
    ("russian", "Привет, мир! Съешь же ещё этих мягких французских булок. МОСКВА-2024"),
    ("greek_misc", "Ελληνικά ΑΘΗΝΑ ǅemal ǈ ʰʲ ﬁ ℕℝ Ⅻ ½ ² ǲ Ǆ ꙮ"),
    ("code_py", "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\nclass A_b(object):\n\tpass\n"),
    ("code_c", "int main() {\n\tfor (int i = 0; i < 10; ++i) {\n\t\tprintf(\"%d\\n\", i);\n\t}\n\treturn 0;\n}\n// a/b/c ./path/to/file.txt\r\n"),
    ("code_json", '{"key": [1, 2.5, -3e10], "nested": {"a": null, "b": true}, "url": "https://x.org/a?b=c&d=e#f"}'),
    ("numbers", "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890 3.14159 -0.001 1e-9 6.022e23 $1,234.56 50% 1/3 007"),
    ("emoji", "I love 🦙 llamas 🚀🔥 and 👍🏽 thumbs, 👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, ❤️ heart ☺ ✓"),
    ("whitespace", "a b  c   d    e     f\t\tg \t h\n\ni\r\n\r\nj \n k\u00a0l\u3000m\u2009n\u000bo\u000cp   "),
    ("newlines", "line1\nline2\n\nline3\n\n\nline4\r\nline5\r\n\r\n  indented\n\t\ttabbed\n   \n"),
    ("punct", "Wait... what?! (yes) [no] {maybe} <tag/> @user #hash $$ %% ^^ && ** -- __ == ++ ~~ `code` \"q\" 'q' ¿¡ «»"),
    ("symbols", "→ ← ∀ ∃ ∑ √ ∞ ≠ ≤ © ® ™ € £ ¥ § ¶ • … “quotes” ‘single’ 「括弧」 『二重』 、。・"),
    ("slashes", "and/or a//b /// x/\ny !/\r\n?/ ./"),
    ("marks", "e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937 x\u0300\u0301 \u0301start A\u030a"),
    ("cased_runs", "HTTPServer XMLHttpRequest iPhone McDonald's CamelCaseWord ALLCAPS lowercase MiXeD ÉCOLEélève ΣΊΣΥΦΟΣ"),
    ("only_ws", "   \n\t  \n "),
    ("trailing", "end with spaces   "),
    ("leading", "   leading spaces"),
    ("mixed", "Tokenizers (BPE) split 'text' in 3 steps: 1) regex; 2) bytes → ids; 3) merges. Ça marche? 是的！ 네. да. نعم."),
]


def combined_text():
    return "\n".join(t for _, t in TEXTS)


# ----------------------------------------------------------------------------- splitting

def split_isolated(pieces, pattern):
    rx = regex.compile(pattern)
    out = []
    for p in pieces:
        at = 0
        for m in rx.finditer(p):
            if m.end() == m.start():
                continue
            if m.start() > at:
                out.append(p[at:m.start()])
            out.append(m.group(0))
            at = m.end()
        if at < len(p):
            out.append(p[at:])
    return out


def split(text, patterns):
    pieces = [text] if text else []
    for pat in patterns:
        pieces = split_isolated(pieces, pat)
    assert "".join(pieces) == text
    return pieces


# ----------------------------------------------------------------------------- unicode check

PROPS = {
    "L": lambda c: unicodedata.category(c)[0] == "L",
    "N": lambda c: unicodedata.category(c)[0] == "N",
    "M": lambda c: unicodedata.category(c)[0] == "M",
    "P": lambda c: unicodedata.category(c)[0] == "P",
    "S": lambda c: unicodedata.category(c)[0] == "S",
    "Lu": lambda c: unicodedata.category(c) == "Lu",
    "Ll": lambda c: unicodedata.category(c) == "Ll",
    "Lt": lambda c: unicodedata.category(c) == "Lt",
    "Lm": lambda c: unicodedata.category(c) == "Lm",
    "Lo": lambda c: unicodedata.category(c) == "Lo",
}


def check_unicode(texts):
    bad = []
    for c in sorted(set("".join(texts))):
        for name, fn in PROPS.items():
            if bool(regex.fullmatch(r"\p{%s}" % name, c)) != fn(c):
                bad.append(f"U+{ord(c):04X} {name}")
    if bad:
        sys.exit("regex and unicodedata disagree on: " + ", ".join(bad))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "pretok_refs.json"))
    args = ap.parse_args()
    texts = TEXTS + [("combined", combined_text())]
    check_unicode([t for _, t in texts])
    families = []
    for name, patterns in FAMILIES.items():
        families.append({"name": name, "patterns": patterns,
                         "splits": [split(t, patterns) for _, t in texts]})
    dumps = lambda x: json.dumps(x, ensure_ascii=False, separators=(",", ":"))
    lines = ["{",
             f' "generator": {dumps("scripts/ref/make_pretok_refs.py")},',
             f' "reference": {dumps(f"Python regex {regex.__version__}; unicodedata {unicodedata.unidata_version}")},',
             ' "texts": [']
    lines += ["  " + dumps({"name": n, "text": t}) + ("," if i + 1 < len(texts) else "")
              for i, (n, t) in enumerate(texts)]
    lines += [" ],", ' "families": [']
    for fi, f in enumerate(families):
        lines.append("  {" + f'"name":{dumps(f["name"])},"patterns":{dumps(f["patterns"])},"splits":[')
        lines += ["   " + dumps(s) + ("," if i + 1 < len(f["splits"]) else "") for i, s in enumerate(f["splits"])]
        lines.append("  ]}" + ("," if fi + 1 < len(families) else ""))
    lines += [" ]", "}", ""]
    with open(args.out, "w", encoding="utf-8") as fo:
        fo.write("\n".join(lines))
    print(f"wrote {args.out}: {len(families)} families x {len(texts)} texts")


if __name__ == "__main__":
    main()
