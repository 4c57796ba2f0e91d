"""kvpress's names and arguments on kvtrim's presses, and its pipeline.

A kvpress script ports by changing its imports::

    from kvtrim.kvpress import pipeline, ExpectedAttentionPress   # was: kvpress + transformers

    pipe = pipeline("kv-press-text-generation", model="smollm2")    # a GGUF name or path
    press = ExpectedAttentionPress(compression_ratio=0.5)
    answer = pipe(context, question=question, press=press)["answer"]

Each class takes kvpress's arguments with kvpress's defaults (``SnapKVPress``: window_size=64,
average pooling, as kvpress; kvtrim's own ``snapkv`` defaults to the SnapKV authors' window 32
and max pooling) and is a kvtrim press underneath (``str(press)`` shows which). What differs
from kvpress (docs/python.md has the list): the model is a GGUF file run by kvtrim on the CPU
(``device``, ``torch_dtype`` and ``model_kwargs`` are accepted and ignored); the cache really
holds fewer bytes (kvpress masks); the question follows the context after a blank line in the
user turn; presses kvtrim does not have raise ``NotImplementedError`` naming the closest one.
"""
import warnings

from . import presses as _p
from ._kvtrim import Model

__all__ = ["pipeline", "KnormPress", "SnapKVPress", "StreamingLLMPress", "TOVAPress", "ObservedAttentionPress",
           "ExpectedAttentionPress", "RandomPress", "PyramidKVPress", "ThinKPress", "AdaKVPress", "KVzipPress",
           "ComposedPress", "ScorerPress", "KVPressTextGenerationPipeline"]


def _ratio(x):
    return float(x)


def KnormPress(compression_ratio=0.0):
    return _p.Knorm(ratio=_ratio(compression_ratio))


def SnapKVPress(compression_ratio=0.0, window_size=64, kernel_size=5):
    return _p.SnapKV(ratio=_ratio(compression_ratio), window=int(window_size), kernel=int(kernel_size), pool="avg")


def PyramidKVPress(compression_ratio=0.0, window_size=64, kernel_size=5):
    return _p.PyramidKV(ratio=_ratio(compression_ratio), window=int(window_size), kernel=int(kernel_size), pool="avg")


def StreamingLLMPress(compression_ratio=0.0, n_sink=4):
    return _p.StreamingLLM(ratio=_ratio(compression_ratio), sinks=int(n_sink))


def TOVAPress(compression_ratio=0.0):
    return _p.TOVA(ratio=_ratio(compression_ratio))


def ObservedAttentionPress(compression_ratio=0.0):
    return _p.H2O(ratio=_ratio(compression_ratio))


def ExpectedAttentionPress(compression_ratio=0.0, n_future_positions=512, n_sink=4, use_covariance=True,
                           use_vnorm=True, epsilon=0.0):
    return _p.ExpectedAttention(ratio=_ratio(compression_ratio), n_future=int(n_future_positions), sinks=int(n_sink),
                                cov=bool(use_covariance), vnorm=bool(use_vnorm), epsilon=float(epsilon))


def RandomPress(compression_ratio=0.0, seed=None):
    return _p.Random(ratio=_ratio(compression_ratio), seed=0 if seed is None else int(seed))


def ThinKPress(key_channel_compression_ratio=0.0, inner_press=None, window_size=32):
    think = _p.ThinK(ratio=_ratio(key_channel_compression_ratio), window=int(window_size))
    return think if inner_press is None else inner_press + think


def AdaKVPress(press, alpha_safeguard=0.20):
    return _p.AdaKV(press, alpha_safeguard=float(alpha_safeguard))


def KVzipPress(compression_ratio=0.0, layerwise=False, n_sink=4):
    return _p.KVzip(ratio=_ratio(compression_ratio), layerwise=1 if layerwise else 0, sinks=int(n_sink))


def ComposedPress(presses):
    return _p.Composed(list(presses))


ScorerPress = _p.ScorerPress


class KVPressTextGenerationPipeline:
    """kvpress's "kv-press-text-generation" pipeline on kvtrim: the context is prefilled and
    compressed once, then each question is answered from the compressed context (its own
    tokens are not compressed)."""

    def __init__(self, model, threads=0, n_ctx=0, chat=None):
        self.model = model if isinstance(model, Model) else Model(model, threads=threads, n_ctx=n_ctx)
        self.chat = self.model.has_chat_template if chat is None else bool(chat)

    def __call__(self, context, question="", questions=None, press=None, max_new_tokens=50, answer_prefix="",
                 max_context_length=None, cache=None, **generate_kwargs):
        if questions is not None and question:
            raise ValueError("give question or questions, not both")
        if cache is not None:
            raise ValueError("cache: kvtrim keeps its own compressed cache; pass cache=None")
        qs = list(questions) if questions is not None else [question]
        if answer_prefix:
            raise NotImplementedError("answer_prefix is not supported yet: put it at the end of the question")
        if max_context_length is not None:
            ids = self.model.tokenize(context)
            if len(ids) > max_context_length:
                context = self.model.detokenize(ids[:max_context_length])
        answers = self.model.generate(context=context, question=qs, press=press, max_tokens=int(max_new_tokens),
                                      chat=self.chat, **generate_kwargs)
        if questions is not None:
            return {"answers": answers}
        return {"answer": answers[0]}


def pipeline(task="kv-press-text-generation", model=None, device=None, torch_dtype=None, model_kwargs=None,
             **kwargs):
    """``transformers.pipeline("kv-press-text-generation", model=...)`` as kvpress registers it:
    ``model`` is a kvtrim.Model or a GGUF name / path; device, torch_dtype and model_kwargs
    are ignored (kvtrim runs on the CPU from the GGUF file's own weights)."""
    if task != "kv-press-text-generation":
        raise ValueError(f"task '{task}': only 'kv-press-text-generation' is provided")
    if model is None:
        raise ValueError("pipeline: give model= (a kvtrim.Model, an installed model name or a .gguf path)")
    ignored = [n for n, v in (("device", device), ("torch_dtype", torch_dtype), ("model_kwargs", model_kwargs)) if v]
    if ignored:
        warnings.warn(f"kvtrim ignores {', '.join(ignored)}: it runs the GGUF file on the CPU", stacklevel=2)
    return KVPressTextGenerationPipeline(model, **kwargs)


def __getattr__(name):
    if name.endswith("Press"):
        raise AttributeError(f"kvtrim.kvpress has no {name}: kvtrim does not implement that kvpress press "
                             f"(these are here: {', '.join(n for n in __all__ if n.endswith('Press'))}; "
                             "kvtrim's own presses are in kvtrim.presses)")
    raise AttributeError(f"module 'kvtrim.kvpress' has no attribute '{name}'")
