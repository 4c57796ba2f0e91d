"""Presses as Python objects.

Every press kvtrim registers is a class here, named after it (``SnapKV``, ``Knorm``,
``ExpectedAttention``, ...), with the press's options as keyword arguments and its description,
paper and options as the docstring; the first positional argument sets the first option (usually
``ratio``, the fraction of tokens removed, as kvpress's ``compression_ratio``)::

    kvtrim.presses.SnapKV(ratio=0.5, window=64)
    kvtrim.presses.AdaKV(kvtrim.presses.SnapKV(0.5), alpha_safeguard=0.2)
    kvtrim.presses.StreamingLLM(0.25) + kvtrim.presses.Think(0.5)   # applied in sequence

A press string (``"snapkv:ratio=0.5,window=64"``, as the command line takes) is accepted
wherever a press is. ``str(press)`` is the press's canonical string.

Custom presses: subclass :class:`ScorerPress` and implement ``score``.
"""
import re

import numpy as np

from . import _kvtrim

__all__ = ["Press", "ScorerPress", "Composed", "press_names", "from_string"]


class Press:
    """A KV-cache compression policy. Compose with ``+`` (applied in sequence, each press on
    what the previous one left)."""

    def _parts(self):
        raise NotImplementedError

    def __add__(self, other):
        return Composed(self, _as_press(other))

    def __radd__(self, other):
        return Composed(_as_press(other), self)

    @property
    def spec(self):
        """The canonical press string (validated by kvtrim)."""
        return _kvtrim.check_press(self)

    def __str__(self):
        return self.spec

    def __repr__(self):
        return f"<kvtrim press {self.spec}>"


class Composed(Press):
    """Presses applied in sequence (``a + b``): each scores what the previous one left, so the
    savings multiply."""

    def __init__(self, *presses):
        if len(presses) == 1 and isinstance(presses[0], (list, tuple)):
            presses = tuple(presses[0])
        if not presses:
            raise ValueError("Composed: no press given")
        self.presses = [_as_press(p) for p in presses]
        _kvtrim.check_press(self)

    def _parts(self):
        return [part for p in self.presses for part in p._parts()]


class _StringPress(Press):
    def __init__(self, spec):
        self._string = spec
        _kvtrim.check_press(spec)

    def _parts(self):
        return [self._string]


def _as_press(p):
    if isinstance(p, Press):
        return p
    if isinstance(p, str):
        return _StringPress(p)
    raise TypeError(f"not a press: {p!r} (a press object or a press string)")


def from_string(spec):
    """A press object from a press string (``"snapkv:0.5+think:0.25"``)."""
    return _as_press(spec)


def _fmt(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


class RegistryPress(Press):
    """A press of kvtrim's registry (the classes below are made from it)."""

    _name = None
    _options = ()   # (name, default, help)
    _wrapper = False

    def __init__(self, *args, **kwargs):
        names = [o[0] for o in self._options]
        inner = None
        if self._wrapper:
            if not args and "press" not in kwargs:
                raise ValueError(f"press '{self._name}' wraps another press: {type(self).__name__}(press, ...)")
            inner = _as_press(kwargs.pop("press") if "press" in kwargs else args[0])
            args = args[1:]
        if len(args) > 1:
            raise ValueError(f"press '{self._name}': one positional argument at most (it sets '{names[0]}'); "
                             "give the others by name")
        if args:
            if not names:
                raise ValueError(f"press '{self._name}' has no options")
            if names[0] in kwargs:
                raise ValueError(f"press '{self._name}': '{names[0]}' given twice")
            kwargs[names[0]] = args[0]
        for k in kwargs:
            if k not in names:
                raise ValueError(f"press '{self._name}': unknown option '{k}' (options: {', '.join(names) or 'none'})")
        self.options = dict(kwargs)
        self.inner = inner
        _kvtrim.check_press(self)  # values checked by kvtrim: ValueError naming the option

    def _string(self):
        s = self._name
        if self.inner is not None:
            inner = self.inner._parts()
            if not all(isinstance(x, str) for x in inner):
                raise ValueError(f"press '{self._name}' wraps only built-in presses, not a Python ScorerPress")
            s += "(" + "+".join(inner) + ")"
        if self.options:
            s += ":" + ",".join(f"{k}={_fmt(v)}" for k, v in self.options.items())
        return s

    def _parts(self):
        return [self._string()]


def _class_name(name):
    special = {"snapkv": "SnapKV", "pyramidkv": "PyramidKV", "streamingllm": "StreamingLLM", "tova": "TOVA",
               "h2o": "H2O", "adakv": "AdaKV", "kvcompose": "KVCompose", "kvzip": "KVzip", "ksvd": "KSVD",
               "kqsvd": "KQSVD", "staticpca": "StaticPCA", "ojakv": "OjaKV", "eigenattention": "EigenAttention",
               "stiefattention": "StiefAttention", "think": "ThinK", "spark": "SPARK", "swan": "SWAN"}
    if name in special:
        return special[name]
    return "".join(w.capitalize() for w in re.split(r"[_\-]", name))


def _doc(info):
    lines = [info["description"].rstrip(".") + "."]
    if info["paper"]:
        lines += ["", "Paper: " + info["paper"]]
    if info["wrapper"]:
        lines += ["", "Wraps another press: the first argument."]
    if info["options"]:
        lines += ["", "Options (keyword arguments; the first one may be given by position):"]
        for n, d, h in info["options"]:
            default = d if d else "empty"
            lines.append(f"    {n} (default {default}): {h}")
    lines += ["", f"Press string: {info['name']}" + ("(PRESS)" if info["wrapper"] else "") + ":opt=value,..."]
    return "\n".join(lines)


def _make_classes():
    made = {}
    for info in _kvtrim.press_registry():
        cls = type(_class_name(info["name"]), (RegistryPress,), {
            "_name": info["name"], "_options": tuple(info["options"]), "_wrapper": info["wrapper"],
            "__doc__": _doc(info), "__module__": __name__})
        made[cls.__name__] = cls
    return made


_classes = _make_classes()
globals().update(_classes)
__all__ += sorted(_classes)


def press_names():
    """The registry's press names (as in press strings)."""
    return [c._name for c in _classes.values()]


class ScorerPress(Press):
    """A press written in Python: score every token, kvtrim keeps the top ones.

    Subclass it and implement ``score(layer, keys, values, queries, positions)``, which returns
    one score per (kv head, token), higher = keep (as kvpress's ``ScorerPress.score``):

      - keys: float32 [n_kv_heads, n_tokens, head_dim] (RoPE applied, as stored), values the
        same with the value head dim, positions int32 [n_kv_heads, n_tokens];
      - queries: float32 [n_heads, W, head_dim], the context's last W queries (post-RoPE) of
        this layer, W <= ``window`` (empty when the session captured none);
      - when the heads hold different token counts (after an earlier press of a composition)
        keys, values and positions are lists of per-head arrays and the result is a list too.

    ``ratio`` is the fraction of tokens removed (``budget`` > 0: tokens kept per kv head
    instead). Each head keeps its top ``int(n * (1 - ratio))`` tokens (ties: the earlier one).
    A score of +inf always keeps a token. Wrong shapes or NaN raise ValueError and leave the
    cache unchanged.

        class MyKnorm(kvtrim.ScorerPress):
            def score(self, layer, keys, values, queries, positions):
                return -np.linalg.norm(keys, axis=-1)
    """

    def __init__(self, ratio=0.5, budget=0, window=64):
        if not 0 <= ratio < 1:
            raise ValueError(f"{type(self).__name__}: ratio must be in [0, 1) (got {ratio})")
        if budget < 0:
            raise ValueError(f"{type(self).__name__}: budget must be >= 0 (got {budget})")
        if window < 0:
            raise ValueError(f"{type(self).__name__}: window must be >= 0 (got {window})")
        self.ratio = float(ratio)
        self.budget = int(budget)
        self.window = int(window)

    def score(self, layer, keys, values, queries, positions):
        raise NotImplementedError(f"{type(self).__name__} must implement score(layer, keys, values, queries, positions)")

    def _spec(self):
        b = f"budget={self.budget}" if self.budget > 0 else f"ratio={self.ratio!r}"
        return f"python:{type(self).__name__}:{b},window={self.window}"

    def _parts(self):
        return [self]

    def _score_layer(self, layer, keys, values, queries, positions):
        out = self.score(layer, keys, values, queries, positions)
        name = type(self).__name__
        if isinstance(keys, list):
            if not isinstance(out, (list, tuple)) or len(out) != len(keys):
                raise ValueError(f"{name}.score: the heads hold different token counts here; expected a list of "
                                 f"{len(keys)} arrays of shapes {[k.shape[0] for k in keys]}")
            res = []
            for ih, (o, k) in enumerate(zip(out, keys)):
                a = np.ascontiguousarray(o, dtype=np.float32)
                if a.shape != (k.shape[0],):
                    raise ValueError(f"{name}.score: head {ih}: expected shape ({k.shape[0]},), got {a.shape}")
                _check_finite(name, layer, a)
                res.append(a)
            return res
        expected = keys.shape[:2]
        a = np.ascontiguousarray(out, dtype=np.float32)
        if a.shape != expected:
            raise ValueError(f"{name}.score: layer {layer}: expected scores of shape {expected} "
                             f"(kv heads, tokens), got {a.shape}")
        _check_finite(name, layer, a)
        return a


def _check_finite(name, layer, a):
    if np.isnan(a).any():
        raise ValueError(f"{name}.score: layer {layer}: the scores hold NaN")
