#!/usr/bin/env python3
"""Independent reference for kvtrim's dequantization of Q2_K, Q3_K, IQ4_NL and IQ4_XS.

No model file has these types, so the blocks are made here: random bytes (every bit pattern of
the codes, scales and high bits) with the fp16 factors (d, and dmin for Q2_K) replaced by sane
values — N(0, 0.05), a few blocks with d = 0, a subnormal d or a negative dmin — from a fixed
seed. They are dequantized by the `gguf` Python package (gguf.quants.dequantize, numpy), and
tests/data/dequant_lowbit_refs.json holds, per type:

  block_size, type_size, n_blocks
  blocks_hex      the blocks' bytes, back to back, as hex
  fnv1a64         per block, the 64-bit FNV-1a hash of its dequantized values as little-endian
                  float32 bytes (a bit-for-bit fingerprint of every value)
  full_bits       the first N_FULL blocks' values as float32 bit patterns (readable diagnostics)

tests/gguf/dequant_lowbit_test.cpp dequantizes the same blocks with dequantize_row and compares
bit for bit. The data is committed; this script only regenerates it (needs gguf + numpy, e.g.
~/.cache/kvtrim/refenv/bin/python). It is not a build or CI dependency.

Usage: python3 scripts/ref/make_dequant_lowbit_refs.py [--out tests/data/dequant_lowbit_refs.json]
"""

import argparse
import json
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

SEED = 41
N_FULL = 8  # blocks per type whose values are stored in full

# kvtrim's type name -> (gguf type, block elements, block bytes, byte offsets of fp16 factors,
# number of blocks)
TYPES = {
    "q2_K": (T.Q2_K, 256, 84, [80, 82], 300),
    "q3_K": (T.Q3_K, 256, 110, [108], 300),
    "iq4_nl": (T.IQ4_NL, 32, 18, [0], 600),
    "iq4_xs": (T.IQ4_XS, 256, 136, [0], 300),
}


def fnv1a64(data: bytes) -> int:
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def make_blocks(rng, type_size, f16_offsets, n_blocks):
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in f16_offsets:
        f = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        f[0] = np.float16(0.0)                    # a zero factor
        f[1] = np.float16(3.0e-6)                 # a subnormal fp16
        f[2] = -abs(f[2]) if f[2] != 0 else np.float16(-0.01)  # a negative one
        blocks[:, off:off + 2] = f.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def type_json(rng, gtype, block_size, type_size, f16_offsets, n_blocks):
    blocks = make_blocks(rng, type_size, f16_offsets, n_blocks)
    values = dequantize(blocks.reshape(-1), gtype).astype(np.float32).reshape(n_blocks, block_size)
    if not np.all(np.isfinite(values)):
        sys.exit("non-finite dequantized value: check the fp16 factors")
    le = values.astype("<f4")
    return {
        "block_size": block_size,
        "type_size": type_size,
        "n_blocks": n_blocks,
        "blocks_hex": blocks.tobytes().hex(),
        "fnv1a64": [format(fnv1a64(le[i].tobytes()), "016x") for i in range(n_blocks)],
        "full_bits": [[int(v) for v in le[i].view("<u4")] for i in range(N_FULL)],
    }


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "dequant_lowbit_refs.json"))
    args = ap.parse_args()
    from importlib.metadata import version
    rng = np.random.default_rng(SEED)
    out = {"generator": "scripts/ref/make_dequant_lowbit_refs.py (gguf.quants.dequantize, gguf "
                        f"{version('gguf')}, numpy {np.__version__})",
           "seed": SEED, "types": {}}
    for name, (gtype, bs, ts, offs, nb) in TYPES.items():
        out["types"][name] = type_json(rng, gtype, bs, ts, offs, nb)
        print(f"{name}: {nb} blocks", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
