"""Shortlist's numba functions are never loaded stale from numba's cache after an edit of a module
whose code or constants they compile in."""

from __future__ import annotations

import hashlib
from pathlib import Path

from kinetic.codegen.cpu import shortlist_rows, shortlist_scan

HERE = Path(shortlist_rows.__file__).parent


def digest(*names: str) -> str:
    h = hashlib.sha256()
    for name in names:
        h.update((HERE / name).read_bytes())
    return h.hexdigest()[:16]


def test_shortlist_numba_cache_keys_track_the_modules_compiled_in():
    """numba reuses a cached function while its own file is unchanged, even if a module it compiles
    in changed (checked: a cached caller kept an edited callee's old constant); each such shortlist
    file carries a hash of those modules, so editing one changes the file and numba recompiles."""
    # _block_bound_keeps compiles in shortlist_copy.SLACK and native.prefetch
    assert shortlist_rows.SOURCES_HASH == digest("shortlist_copy.py", "native.py"), (
        "update SOURCES_HASH in shortlist_rows.py")
    # _take_chunks compiles in shortlist_rows.summarize and native's intrinsics, _lane_inputs
    # shortlist_kernel_ir.BLOCK; shortlist_rows.py changes with its own hash, so this covers SLACK too
    assert shortlist_scan.SOURCES_HASH == digest("shortlist_rows.py", "native.py", "shortlist_kernel_ir.py"), (
        "update SOURCES_HASH in shortlist_scan.py")
