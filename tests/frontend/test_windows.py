"""Which layers slide, by llama.cpp's load_swa_pattern rule: the file's per-layer booleans, else its
period, else the family's default period; anything else is refused by name."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kinetic.errors import ModelFileError
from kinetic.frontend.windows import describe, sliding_layers


def _file(pattern=None):
    """The little of a GGUFFile the rule reads: architecture, metadata, path."""
    meta = {} if pattern is None else {"olmo2.attention.sliding_window_pattern": pattern}
    return SimpleNamespace(architecture="olmo2", metadata=meta, path=Path("m.gguf"))


def test_without_the_key_every_default_period_th_layer_is_global():
    """No pattern key: layer il is global exactly when il % period == period - 1."""
    assert sliding_layers(_file(), n_layer=8, default_period=4) == (True, True, True, False) * 2


def test_a_period_in_the_file_replaces_the_default():
    """An integer pattern is the period (0: every layer slides), as set_swa_pattern reads it."""
    assert sliding_layers(_file(3), n_layer=6, default_period=4) == (True, True, False) * 2
    assert sliding_layers(_file(0), n_layer=3, default_period=4) == (True, True, True)


def test_per_layer_booleans_are_taken_as_given():
    """An array of booleans (what the converters write) says each layer's kind, whatever the period."""
    flags = np.array([False, True, True, False, True])
    assert sliding_layers(_file(flags), n_layer=5, default_period=4) == tuple(flags.tolist())


@pytest.mark.parametrize("pattern, n_layer, message", [
    (np.array([True, False]), 3, r"one value, or an array of one per layer \(3\)"),
    (np.array([1, 0, 1], np.int32), 3, r"sliding_window_pattern\[0\] is 1; expected true or false"),
    (-2, 3, r"sliding_window_pattern is -2; expected one boolean per layer, or a period"),
])
def test_a_pattern_that_does_not_fit_is_refused(pattern, n_layer, message):
    """A wrong-length array, non-boolean items or a negative period fail loading, naming the key."""
    with pytest.raises(ModelFileError, match=message):
        sliding_layers(_file(pattern), n_layer=n_layer, default_period=4)


def test_describe_names_the_window_and_the_global_layers():
    """kinetic info's line: the window, how many layers slide, which are global."""
    assert describe((True, False, True), 512) == "512 positions on 2 of 3 layers; global layers: 1"
    assert describe((False, False), 512) == "none"


def _decoder(n_layer: int):
    from kinetic.frontend.hparams import Decoder

    return Decoder(n_layer=n_layer, n_embd=64, n_head=1, n_kv_head=1, head_dim=64, eps=1e-5)


def test_exaone4_slides_only_in_a_64_layer_file():
    """exaone4 (llama.cpp's rule): a window key in a file of another depth is ignored; a 64-layer
    file slides over the file's window, 4096 when it gives none, with every 4th layer global."""
    from kinetic.frontend.families import exaone4

    def file(**meta):
        return SimpleNamespace(architecture="exaone4", path=Path("m.gguf"),
                               metadata={f"exaone4.{k}": v for k, v in meta.items()})

    assert exaone4._sliding(file(**{"attention.sliding_window": 8}), _decoder(30)) == (0, (False,) * 30)
    window, sliding = exaone4._sliding(file(), _decoder(64))
    assert window == 4096 and sliding == (True, True, True, False) * 16
    assert exaone4._sliding(file(**{"attention.sliding_window": 8}), _decoder(64))[0] == 8


def test_olmo2_slides_only_when_the_file_gives_a_window():
    """olmo2: no window key (OLMo 2) or a zero window means no sliding layer; a window without a
    pattern slides on every layer but each 4th."""
    from kinetic.frontend.families import olmo2

    def file(window):
        meta = {} if window is None else {"olmo2.attention.sliding_window": window}
        return SimpleNamespace(architecture="olmo2", path=Path("m.gguf"), metadata=meta)

    assert olmo2._sliding(file(None), _decoder(4)) == (0, (False,) * 4)
    assert olmo2._sliding(file(0), _decoder(4)) == (0, (False,) * 4)
    assert olmo2._sliding(file(5), _decoder(8)) == (5, (True, True, True, False) * 2)
