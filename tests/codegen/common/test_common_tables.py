"""The host-side tables every device uploads (kinetic/codegen/common): the compiled map of the C
library's float functions, the rotary tables and the pass masks give the reference's values."""

from __future__ import annotations

import numpy as np
import pytest

from kinetic.codegen.common.libm import FUNCTIONS, libm_map
from kinetic.codegen.common.tables import RopeTables, pass_mask
from kinetic.ir import numerics
from kinetic.ir.ops import RopeAttrs
from kinetic.ir.rows import PassRows, visibility
from tests.rotary_cases import SCALINGS, scaled


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("name", FUNCTIONS)
def test_the_compiled_map_is_the_c_librarys_function(name):
    """libm_map(name, x) is numerics.libm_f32's value (the C library called once per value) bit for
    bit, on ordinary values, huge ones, zeros, infinities and NaN, in any shape."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(4000) * 3, rng.standard_normal(1000) * 1e5,
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 88.7, -104.0]]).astype(np.float32)
    assert same_bits(libm_map(name, x), numerics.libm_f32(name, x))
    grid = x[:600].reshape(20, 30)
    assert same_bits(libm_map(name, grid), numerics.libm_f32(name, grid))


@pytest.mark.parametrize("scaling", SCALINGS)
def test_rotary_tables_are_the_reference_values(scaling):
    """The cos/sin per position (a block of positions at a time, through the compiled map of the C
    library's cosf/sinf, times YaRN's magnitude) are numerics.rope_cos_sin's bits, for one row and
    for many, across blocks, for both of Gemma 3's bases, with each rotary scaling."""
    for n_rot, theta in ((64, 100000.0), (256, 10000.0), (256, 1000000.0)):
        rotary = scaled(RopeAttrs(n_head=1, head_dim=n_rot, n_rot=n_rot, theta=theta, neox=True), scaling).rotary
        tables = RopeTables(rotary)
        for positions in ([7], [255, 256, 257], [0, 1000, 5000, 300]):
            positions = np.asarray(positions)
            got = tables.rows(positions)
            want = numerics.rope_cos_sin(positions, rotary)
            for g, w in zip(got, want, strict=True):
                assert same_bits(g, w)


@pytest.mark.parametrize("window", [0, 3])
def test_a_pass_mask_is_the_visibility_of_its_rows(window):
    """pass_mask is visibility() for a pass whose rows are all one sequence's: a chain after five
    committed entries, and a draft tree, with and without a sliding window."""
    committed = np.arange(5, dtype=np.int32)
    chain = PassRows.chain([1, 2, 3], 5)
    tree = PassRows(tokens=np.array([1, 2, 3, 4], np.int32), positions=np.array([5, 6, 6, 7], np.int32),
                    seqs=np.zeros(4, np.int32), parents=np.array([-1, 0, 0, 2], np.int32),
                    output_rows=np.arange(4, dtype=np.int32))
    for rows in (chain, tree):
        mask = pass_mask(rows, committed, window)
        assert mask.shape == (len(rows.tokens), 5 + len(rows.tokens))
        assert np.array_equal(mask, visibility(rows, np.arange(len(rows.tokens)), committed, window))
    assert pass_mask(tree, committed, 0)[3].tolist() == [True] * 5 + [True, False, True, True]
