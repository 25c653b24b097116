"""Machine-level primitives of the compiled step (kinetic/codegen/cpu/native.py): views that hold
no reference."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from kinetic.codegen.cpu.native import unowned


@intrinsic
def _meminfo(typingctx, arr):
    """The address of an array's meminfo (0: none, so numba counts no references to it)."""
    sig = types.int64(arr)

    def codegen(context, builder, signature, args):
        view = context.make_array(signature.args[0])(context, builder, value=args[0])
        return builder.ptrtoint(view.meminfo, ir.IntType(64))

    return sig, codegen


@njit
def _meminfos(x):
    view = unowned(x)
    return _meminfo(x), _meminfo(view), _meminfo(view[1:3])


@njit
def _write_through(x):
    view = unowned(x)
    view[1:3] = 7.0
    return view[0]


def test_an_unowned_view_counts_no_references_and_is_the_same_memory():
    """unowned(x) and the views made from it carry no meminfo (no reference counting), while x's own
    does; writes through it land in x and reads see x."""
    x = np.arange(6, dtype=np.float32)
    own, view, part = _meminfos(x)
    assert own != 0 and view == 0 and part == 0
    assert _write_through(x) == 0.0
    assert x.tolist() == [0.0, 7.0, 7.0, 3.0, 4.0, 5.0]
