"""Press objects: the registry's classes, composition, kvpress's names, bad options."""
import pytest

import kvtrim
from kvtrim import presses
from kvtrim import kvpress


def test_every_registered_press_is_a_class_with_its_docs():
    names = presses.press_names()
    assert "snapkv" in names and "swan" in names and "adakv" in names
    assert len(names) >= 20
    assert "SnapKV" in presses.__doc__ or hasattr(presses, "SnapKV")
    assert "Li et al. 2024" in presses.SnapKV.__doc__
    assert "window" in presses.SnapKV.__doc__


def test_options_become_the_press_string():
    assert presses.SnapKV(0.5, window=16).spec == "snapkv:ratio=0.5,window=16"
    p = presses.StreamingLLM(ratio=0.25) + presses.ThinK(0.5)
    assert str(p) == "streamingllm:ratio=0.25+think:ratio=0.5"
    assert str(presses.AdaKV(presses.SnapKV(0.5), alpha_safeguard=0.1)) == "adakv(snapkv:ratio=0.5):alpha_safeguard=0.1"
    assert str(presses.Knorm(0.5) + "tova:0.25") == "knorm:ratio=0.5+tova:ratio=0.25"


def test_bad_options_are_value_errors_naming_them():
    with pytest.raises(ValueError, match="unknown option 'windw'"):
        presses.SnapKV(windw=3)
    with pytest.raises(ValueError, match="ratio"):
        presses.SnapKV(ratio=1.5)
    with pytest.raises(ValueError, match="window"):
        presses.SnapKV(window="x")
    with pytest.raises(ValueError, match="unknown press"):
        kvtrim.presses.from_string("snapkvv:0.5")
    with pytest.raises(ValueError):
        presses.AdaKV()  # a wrapper without its press


def test_kvpress_names_take_kvpress_arguments():
    assert str(kvpress.SnapKVPress(compression_ratio=0.5)) == "snapkv:ratio=0.5,window=64,kernel=5,pool=avg"
    assert str(kvpress.KnormPress(0.3)) == "knorm:ratio=0.3"
    assert str(kvpress.ObservedAttentionPress(0.5)).startswith("h2o:")
    e = kvpress.ExpectedAttentionPress(compression_ratio=0.4, n_sink=2, use_covariance=False)
    assert "cov=false" in str(e) and "sinks=2" in str(e)
    ada = kvpress.AdaKVPress(kvpress.SnapKVPress(0.5), alpha_safeguard=0.2)
    assert str(ada).startswith("adakv(snapkv:")
    both = kvpress.ThinKPress(key_channel_compression_ratio=0.5, inner_press=kvpress.KnormPress(0.25))
    assert str(both).startswith("knorm:ratio=0.25+think:")
    with pytest.raises(TypeError):
        kvpress.SnapKVPress(compresion_ratio=0.5)
