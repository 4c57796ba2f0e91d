#!/usr/bin/env python3
"""Runs llama.cpp's own convert_hf_to_gguf.py on a tiny Hugging Face checkpoint, with the
BPE pre-tokenizer name forced.

The converter names a byte-level BPE tokenizer's pre-tokenizer by hashing how it tokenizes a
fixed text; the tiny tokenizers that make_arch_refs.py trains have no known hash, so the
converter would refuse them. This wrapper replaces that one lookup (in memory, for this process
only: the converter's files are not edited) by the name given with --pre, then runs the
converter's main() with the remaining arguments.

usage: hf_to_gguf.py --lcpp DIR [--pre NAME] -- <convert_hf_to_gguf.py arguments>
"""
import os
import runpy
import sys


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit(__doc__)
    ours, theirs = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    lcpp, pre = None, None
    i = 0
    while i < len(ours):
        if ours[i] == "--lcpp":
            lcpp = ours[i + 1]
            i += 2
        elif ours[i] == "--pre":
            pre = ours[i + 1]
            i += 2
        else:
            sys.exit(f"hf_to_gguf.py: unknown option {ours[i]}")
    if lcpp is None:
        sys.exit("hf_to_gguf.py: --lcpp DIR (vendor/llama.cpp) is required")
    sys.path.insert(0, lcpp)
    sys.path.insert(1, os.path.join(lcpp, "gguf-py"))
    import conversion.base as base  # the converter's own module, imported once for both of us

    if pre is not None:
        def forced_pre(self, tokenizer):  # noqa: ARG001 (signature of the converter's method)
            return pre
        base.TextModel.get_vocab_base_pre = forced_pre
    script = os.path.join(lcpp, "convert_hf_to_gguf.py")
    sys.argv = [script] + theirs
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
