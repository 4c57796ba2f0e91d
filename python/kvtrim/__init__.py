"""kvtrim: long-context LLM inference with a KV cache that compresses for real.

    import kvtrim
    model = kvtrim.Model("smollm2", threads=2)
    print(model.generate(context=document, question="Who wrote it?", press="snapkv:0.5", chat=True))

- :class:`Model`: a GGUF model (an installed name such as ``smollm2`` or a path), its
  tokenizer, chat template and ``generate``;
- :class:`Session`: one context step by step: prefill, decode, compress, the cache's keys /
  values / positions as numpy arrays, ``kv_bytes()`` (the exact bytes held, by part);
- :mod:`kvtrim.presses`: every press as a class (``SnapKV(ratio=0.5)``), ``+`` to compose,
  :class:`ScorerPress` for presses written in Python;
- :mod:`kvtrim.kvpress`: kvpress's press names and pipeline;
- :mod:`kvtrim.eval`: the evaluation harness (ruler / mc / ppl) returning rows.

docs/python.md is the guide.
"""
from ._kvtrim import Model, Session, known_models
from . import presses
from .presses import Press, ScorerPress, Composed
from .kvpress import KVPressTextGenerationPipeline
from . import eval

__version__ = "0.1.0"


def pipeline(model, **kwargs):
    """kvpress's question-answering pipeline: ``kvtrim.pipeline(model)(context, question=...,
    press=...)`` returns ``{"answer": ...}`` (``questions=[...]``: ``{"answers": [...]}``)."""
    return KVPressTextGenerationPipeline(model, **kwargs)


__all__ = ["Model", "Session", "Press", "ScorerPress", "Composed", "presses", "pipeline", "eval", "known_models"]
