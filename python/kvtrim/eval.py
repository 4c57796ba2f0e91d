"""The evaluation harness from Python: ``kvtrim eval ruler / mc / ppl`` run in this process,
their results returned as a list of dicts (one per row of the results JSONL, as the command
writes them; no pandas needed).

    rows = kvtrim.eval.ruler(model="smollm2", press="snapkv:0.5", tasks="niah_single_1",
                             samples=2, ctx_len=1024)

Keyword arguments are the command's options with ``_`` for ``-`` (``ctx_len=1024`` is
``--ctx-len 1024``; True is a flag; a list repeats the option). ``model`` may be a kvtrim.Model
(its file is used: the command maps the file again), ``press`` a press object. ``out``: the
results file (kept; an interrupted run resumes from it, as the command's ``--out``); without
it a temporary file is used and removed. A bad option raises ValueError with the command's
message.
"""
import json
import os
import tempfile

from . import _kvtrim
from ._kvtrim import Model
from .presses import Press

__all__ = ["ruler", "mc", "ppl", "run"]


def _args(kwargs):
    args = []
    for k, v in kwargs.items():
        if v is None or v is False:
            continue
        flag = "--" + k.replace("_", "-")
        if isinstance(v, Model):
            v = v.path
        if isinstance(v, Press):
            v = v.spec
        if v is True:
            args.append(flag)
        elif isinstance(v, (list, tuple)):
            for x in v:
                args += [flag, str(x)]
        else:
            args += [flag, str(v)]
    return args


def run(command, out=None, **options):
    """``kvtrim eval <command>`` with options; returns the rows of its results file."""
    tmp = None
    if out is None:
        fd, tmp = tempfile.mkstemp(suffix=".jsonl", prefix="kvtrim-eval-")
        os.close(fd)
        os.unlink(tmp)  # the command creates it (an existing file would be resumed)
        out = tmp
    try:
        _kvtrim._cli(["eval", command, "--out", str(out)] + _args(options))
        rows = []
        if os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                rows = [json.loads(line) for line in f if line.strip()]
        return rows
    finally:
        if tmp is not None:
            for path in (tmp, tmp + ".summary.json"):
                if os.path.exists(path):
                    os.unlink(path)


def ruler(out=None, **options):
    """RULER-style long-context tasks (``kvtrim eval ruler``): one row per question."""
    return run("ruler", out=out, **options)


def mc(out=None, **options):
    """Multiple choice (``kvtrim eval mc``: HellaSwag, PIQA, MMLU): one row per item."""
    return run("mc", out=out, **options)


def ppl(out=None, **options):
    """Perplexity (``kvtrim eval ppl``): its rows."""
    return run("ppl", out=out, **options)
