#!/usr/bin/env python3
"""Independent reference for kvtrim's GGUF reader and dequantization.

Reads the real models with the `gguf` Python package (GGUFReader, gguf.quants.dequantize;
numpy) and writes tests/data/dequant_refs.json, which tests/gguf/dequant_model_test.cpp
compares kvtrim's GgufFile + dequantize_row against:

  per model
    metadata: every key (GGUF.* pseudo-keys excluded) with its value type; scalars with
              their value (strings as byte length + hex of the first 32 bytes); arrays with
              element type, length and the first 3 elements
    tensors:  every tensor's name, type name and ne (file order)
    refs:     for each tensor type present, 1-2 tensors (the smallest and a median-sized
              one): the first 256 dequantized values of the first and last rows, and the
              float64 sum, sum of squares and sum of absolute values over the whole tensor

Usage: python3 scripts/ref/make_dequant_refs.py [--models-dir models] [--out tests/data/dequant_refs.json]
"""

import argparse
import json
import os
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

MODELS = ["smollm2", "qwen2.5-coder-1.5b", "gemma3-270m"]
N_VALUES = 256  # values kept per reference row

VT_NAMES = {
    GGUFValueType.UINT8: "u8", GGUFValueType.INT8: "i8", GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16", GGUFValueType.UINT32: "u32", GGUFValueType.INT32: "i32",
    GGUFValueType.FLOAT32: "f32", GGUFValueType.BOOL: "bool", GGUFValueType.STRING: "string",
    GGUFValueType.ARRAY: "array", GGUFValueType.UINT64: "u64", GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT64: "f64",
}

# llama.cpp's type names, as kvtrim's ggml_type_name prints them.
TYPE_NAMES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q4_0": "q4_0", "Q4_1": "q4_1",
              "Q5_0": "q5_0", "Q5_1": "q5_1", "Q8_0": "q8_0", "Q2_K": "q2_K", "Q3_K": "q3_K",
              "Q4_K": "q4_K", "Q5_K": "q5_K", "Q6_K": "q6_K", "IQ4_NL": "iq4_nl", "IQ4_XS": "iq4_xs"}


def scalar_json(vt, part):
    """JSON form of one scalar value stored in a numpy part."""
    if vt == GGUFValueType.STRING:
        raw = bytes(part.tobytes())
        return {"len": len(raw), "hex": raw[:32].hex()}
    v = part[0]
    if vt == GGUFValueType.BOOL:
        return bool(v)
    if vt in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        return float(v)
    return int(v)


def field_json(field):
    types = field.types
    out = {"type": VT_NAMES[types[0]]}
    if types[0] == GGUFValueType.ARRAY:
        if len(types) != 2:
            sys.exit(f"nested array in {field.name}: not expected in these models")
        et = types[1]
        out["elem_type"] = VT_NAMES[et]
        out["len"] = len(field.data)
        out["first"] = [scalar_json(et, field.parts[i]) for i in field.data[:3]]
    else:
        out["value"] = scalar_json(types[0], field.parts[field.data[0]])
    return out


def tensor_ref(t):
    x = dequantize(t.data, t.tensor_type).astype(np.float32)
    ne0 = int(t.shape[0])
    rows = x.reshape(-1, ne0)
    x64 = rows.astype(np.float64)
    picked = [0] if rows.shape[0] == 1 else [0, rows.shape[0] - 1]
    return {
        "name": t.name,
        "type": TYPE_NAMES[t.tensor_type.name],
        "rows": [{"row": r, "values": [float(v) for v in rows[r, :N_VALUES]]} for r in picked],
        "sum": float(x64.sum()),
        "sumsq": float((x64 * x64).sum()),
        "sumabs": float(np.abs(x64).sum()),
    }


def pick_tensors(reader):
    """The smallest and a median-sized tensor of each type (by element count, then name)."""
    by_type = {}
    for t in reader.tensors:
        by_type.setdefault(t.tensor_type.name, []).append(t)
    picked = []
    for type_name in sorted(by_type):
        ts = sorted(by_type[type_name], key=lambda t: (int(t.n_elements), t.name))
        chosen = [ts[0]]
        if len(ts) > 1 and ts[len(ts) // 2].name != ts[0].name:
            chosen.append(ts[len(ts) // 2])
        picked.extend(chosen)
    return picked


def model_json(path):
    r = GGUFReader(path)
    meta = {k: field_json(f) for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = [[t.name, TYPE_NAMES.get(t.tensor_type.name, t.tensor_type.name.lower()),
                [int(d) for d in t.shape]] for t in r.tensors]
    refs = [tensor_ref(t) for t in pick_tensors(r)]
    return {"alignment": int(r.alignment), "metadata": meta, "tensors": tensors, "refs": refs}


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", default=os.path.join(root, "models"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "dequant_refs.json"))
    args = ap.parse_args()
    out = {"generator": "scripts/ref/make_dequant_refs.py (gguf-py GGUFReader + gguf.quants.dequantize)",
           "n_values": N_VALUES, "models": {}}
    for m in MODELS:
        path = os.path.join(args.models_dir, m + ".gguf")
        print(f"{m}: reading {path}", file=sys.stderr)
        out["models"][m] = model_json(path)
        for ref in out["models"][m]["refs"]:
            print(f"  {ref['type']:5s} {ref['name']}", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
