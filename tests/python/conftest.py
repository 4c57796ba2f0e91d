"""Fixtures of the Python package's tests (scripts/test_python.sh runs them after `pip install .`).

The model tests use the installed SmolLM2 (scripts/install_models.py smollm2; KVTRIM_MODELS_DIR
or ./models), the CLI comparisons the `kvtrim` program of the same checkout (KVTRIM_BIN,
default build/ci/kvtrim)."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def kvtrim_bin():
    path = pathlib.Path(os.environ.get("KVTRIM_BIN", ROOT / "build" / "ci" / "kvtrim"))
    if not path.exists():
        pytest.fail(f"no kvtrim program at {path}: build it (scripts/build.sh ci) or set KVTRIM_BIN")
    return str(path)


@pytest.fixture(scope="session")
def model():
    import kvtrim
    os.environ.setdefault("KVTRIM_MODELS_DIR", str(ROOT / "models"))
    return kvtrim.Model("smollm2", threads=2)
