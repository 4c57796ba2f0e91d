"""Sessions, Python presses and generation on SmolLM2."""
import os
import signal
import subprocess

import numpy as np
import pytest

import kvtrim

TEXT = ("The lighthouse keeper counted the ships every night. In the spring of 1921 he counted "
        "forty-two of them, and wrote each name in a green ledger that still exists. ") * 6


class PyKnorm(kvtrim.ScorerPress):  # Knorm in three lines (kvpress: -keys.norm(dim=-1))
    def score(self, layer, keys, values, queries, positions):
        return -np.linalg.norm(keys.astype(np.float64), axis=-1)


def kept_positions(s, model):
    return [[s.positions(il, ih).tolist() for ih in range(model.n_head_kv)] for il in range(model.n_layer)]


def test_a_python_knorm_keeps_the_tokens_of_the_builtin_knorm(model):
    ids = model.tokenize(TEXT)
    kept = []
    for press in (kvtrim.presses.Knorm(0.5), PyKnorm(ratio=0.5)):
        s = kvtrim.Session(model)
        s.prefill(ids)
        st = s.compress(press)
        assert st["tokens_after"] < st["tokens_before"]
        kept.append(kept_positions(s, model))
    assert kept[0] == kept[1]


def test_a_python_press_composes_with_builtin_ones(model):
    ids = model.tokenize(TEXT)
    s = kvtrim.Session(model)
    s.prefill(ids)
    n = len(ids)
    st = s.compress(kvtrim.presses.StreamingLLM(0.5) + PyKnorm(ratio=0.5))
    assert s.n_tokens(0, 0) == int(int(n * 0.5) * 0.5)
    assert st["bytes_after"] < st["bytes_before"] / 3


def test_the_score_sees_the_window_queries(model):
    seen = {}

    class Probe(kvtrim.ScorerPress):
        def score(self, layer, keys, values, queries, positions):
            seen[layer] = (keys.shape, values.shape, queries.shape, positions.shape)
            return np.zeros(keys.shape[:2])

    ids = model.tokenize(TEXT)
    s = kvtrim.Session(model)
    s.prefill(ids)
    s.compress(Probe(ratio=0.5, window=16))
    n = len(ids)
    assert seen[0] == ((model.n_head_kv, n, model.head_dim), (model.n_head_kv, n, model.head_dim),
                       (model.n_head, 16, model.head_dim), (model.n_head_kv, n))
    assert len(seen) == model.n_layer


@pytest.mark.parametrize("bad,match", [
    (lambda k: np.zeros(k.shape[1]), r"expected scores of shape \(3, \d+\)"),
    (lambda k: np.full(k.shape[:2], np.nan), "NaN"),
    (lambda k: 1 / 0, "division by zero"),
])
def test_a_failing_score_raises_and_leaves_the_cache_unchanged(model, bad, match):
    class Bad(kvtrim.ScorerPress):
        def score(self, layer, keys, values, queries, positions):
            return bad(keys)

    s = kvtrim.Session(model)
    s.prefill(model.tokenize(TEXT))
    before = (s.kv_bytes(), kept_positions(s, model))
    with pytest.raises((ValueError, ZeroDivisionError), match=match):
        s.compress(Bad(ratio=0.5))
    assert (s.kv_bytes(), kept_positions(s, model)) == before


def test_cache_arrays_and_bytes(model):
    s = kvtrim.Session(model)
    ids = model.tokenize(TEXT)
    s.prefill(ids)
    n = len(ids)
    k, v = s.keys(2, 1), s.values(2, 1)
    assert k.shape == (n, model.head_dim) and k.dtype == np.float32
    raw = s.values(2, 1, raw=True)
    assert raw.dtype == np.float16 and not raw.flags.writeable
    np.testing.assert_array_equal(raw.astype(np.float32), v)
    assert s.positions(2, 1).tolist() == list(range(n))
    b = s.kv_bytes()
    assert b["total"] == sum(b[p] for p in ("keys", "values", "positions", "scales", "bases", "indices",
                                            "bitmasks", "fills", "other"))
    assert b["keys"] == model.n_layer * model.n_head_kv * n * model.head_dim * 2 or b["keys"] > 0
    # a raw view pins the cache: changing it raises instead of leaving the view dangling
    with pytest.raises(BufferError, match="raw view"):
        s.decode(ids[0])
    del raw
    s.decode(ids[0])
    assert s.n_past == n + 1
    with pytest.raises(IndexError):
        s.keys(model.n_layer, 0)


def test_generate_from_python_matches_the_cli(model, kvtrim_bin):
    prompt = "The three primary colours are"
    text = model.generate(prompt, max_tokens=16)
    cli = subprocess.run([kvtrim_bin, "run", "-m", model.path, "-p", prompt, "-n", "16", "--temp", "0", "-t", "2"],
                         capture_output=True, text=True, check=True).stdout
    assert cli == text + "\n"


def test_one_context_many_questions(model):
    context = "Alice keeps a red kite. Bob keeps a blue boat. Carol keeps a green lamp."
    qs = ["What does Bob keep?", "What colour is the lamp?"]
    answers = model.generate(context=context, question=qs, press=kvtrim.presses.SnapKV(0.3), chat=True,
                             max_tokens=8, press_min_tokens=8, details=True)
    assert len(answers) == 2
    for a in answers:
        assert a["compression"]["ran"]
        assert a["compression"]["tokens_after"] < a["compression"]["tokens_before"]
        assert a["n_question"] > 0 and a["text"]
    single = model.generate(context=context, question=qs[1], press="snapkv:0.3", chat=True, max_tokens=8,
                            press_min_tokens=8)
    assert single == answers[1]["text"]


def test_bad_generate_arguments(model):
    with pytest.raises(ValueError, match="not both"):
        model.generate("a", question="b")
    with pytest.raises(ValueError, match="press_max_loss"):
        model.generate("a", press="knorm:0.5", press_max_loss=2)
    with pytest.raises(ValueError, match="exceeds the context limit"):
        model.generate("word " * 300, n_ctx=64)
    with pytest.raises(ValueError, match="does not exist"):
        kvtrim.Model("/nonexistent/model.gguf")


def test_a_callback_can_stop_and_ctrl_c_interrupts(model):
    pieces = []

    def stop_after_three(piece):
        pieces.append(piece)
        return len(pieces) < 3

    out = model.generate("Once upon a time", max_tokens=32, on_token=stop_after_three)
    assert len(pieces) == 3 and out == "".join(pieces)

    def ctrl_c(piece):
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        model.generate("Once upon a time", max_tokens=32, on_token=ctrl_c)
    # the model is fine afterwards
    assert model.generate("Once upon a time", max_tokens=4)


def test_the_quality_guard_takes_a_python_press(model):
    a = model.generate(context=TEXT, question="How many ships?", press=PyKnorm(ratio=0.5), chat=True, max_tokens=4,
                       press_max_loss=0.0, details=True)
    c = a["compression"]
    assert not c["ran"] and "no ratio to halve" in c["note"]
    assert a["kv_bytes"]["total"] >= a["kv_bytes"]["dense_f16"] * 0.99  # left uncompressed
