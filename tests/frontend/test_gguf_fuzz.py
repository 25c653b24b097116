"""Fuzzing the GGUF parser: any input parses or is a KineticError, in bounded time and memory.

Two sources of cases:
* seeded mutations of the real models' headers (bit flips; counts, lengths, types and offsets
  overwritten with extreme values at the positions where the format keeps them; truncations;
  inserted and deleted bytes), each written with the original file's size so that an unmutated
  header parses; a case that parses is also described by `kinetic info`'s code;
* hypothesis-generated headers, both arbitrary (anything may be wrong) and well-formed (which must
  parse back to exactly what was written).

Every case runs under a wall-clock alarm (a hang fails the test) and a data-segment limit (an
allocation much larger than the file fails it); the hypothesis cases and every 25th mutation also
run under tracemalloc, whose peak must stay below the file's size plus 2 MiB. The default run has
2,000 cases (about 45 s); the tests marked slow run ten times as many, only when asked for with
`pytest -m slow` or KINETIC_SLOW=1. The values a well-formed file holds (hyperparameters, tokenizer
arrays, tensor shapes), loaded and run, are fuzzed in tests/frontend/test_gguf_values_fuzz.py.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import struct
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinetic.errors import KineticError
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.model_info import describe, format_text, to_json

V = GGUFValueType
CASE_SECONDS = 5  # a parse of the real Gemma header takes ~0.05 s
MEMORY_SLACK = 2 * 1024 * 1024  # tracemalloc's bound: the file's size plus this
DATA_SLACK = 64 * 1024 * 1024  # allocator arenas and numpy's scratch on top, for the data limit
MUTATIONS = {"smollm2": 600, "gemma": 200}  # with 1,200 hypothesis cases: 2,000 in the default run
TRACE_EVERY = 25
SLOW_FACTOR = 10

_SCALAR_FMT = {V.UINT8: "B", V.INT8: "b", V.UINT16: "H", V.INT16: "h", V.UINT32: "I", V.INT32: "i",
               V.FLOAT32: "f", V.BOOL: "B", V.UINT64: "Q", V.INT64: "q", V.FLOAT64: "d"}


class Hang(Exception):
    """Raised by the alarm when one case runs past CASE_SECONDS."""


@contextmanager
def alarm(seconds: float):
    def ring(_signum, _frame):
        raise Hang(f"a case ran longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def check_case(path: Path, *, decode_arrays: bool = False, trace: bool = True) -> bool:
    """Open the file: it parses (True) or raises KineticError (False); nothing else, fast, small.

    Every case runs under a data-segment limit of the file's size plus slack above what the process
    uses now, so an oversized allocation fails with MemoryError; `trace` also measures the case's
    peak with tracemalloc (exact, but it slows parsing tenfold, so the mutation runs sample it).
    """
    size = path.stat().st_size
    if trace:
        tracemalloc.start()
    try:
        with alarm(CASE_SECONDS), data_limit(size + MEMORY_SLACK):
            parsed = _parse_and_describe(path, decode_arrays)
        peak = tracemalloc.get_traced_memory()[1] if trace else 0
    finally:
        if trace:
            tracemalloc.stop()
    assert peak < size + MEMORY_SLACK, f"{path.name}: peak {peak} bytes for a file of {size}"
    return parsed


@contextmanager
def data_limit(extra: int):
    """Cap the process's data segment (heap and anonymous maps, not the file's map) at now + extra."""
    if not Path("/proc/self/status").exists():  # RLIMIT_DATA is enforced this way on Linux only
        yield
        return
    used_kib = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("VmData:"))
    old = resource.getrlimit(resource.RLIMIT_DATA)
    limit = used_kib * 1024 + extra + DATA_SLACK
    resource.setrlimit(resource.RLIMIT_DATA, (min(limit, old[1]) if old[1] >= 0 else limit, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, old)


def _parse_and_describe(path: Path, decode_arrays: bool) -> bool:
    try:
        g = open_gguf(path)
        info = describe(g)
        assert format_text(info) and to_json(info)
        if decode_arrays:
            for key in g.metadata:
                g.metadata[key]
    except KineticError as err:
        assert err.message and "\n" not in err.message and err.hint
        return False
    return True


@pytest.fixture
def slow_requested(request):
    """The slow tests run only when asked for (`pytest -m slow` or KINETIC_SLOW=1), not in CI's run."""
    expr = request.config.getoption("markexpr") or ""
    if os.environ.get("KINETIC_SLOW") != "1" and ("slow" not in expr or "not slow" in expr):
        pytest.skip("slow fuzzing: run with -m slow")


# -- mutations of the real headers -------------------------------------------------------------------


def structural_fields(header: bytes) -> list[tuple[int, int]]:
    """(position, width) of every count, length, type and offset in a valid header."""
    def u32(p: int) -> int:
        return struct.unpack_from("<I", header, p)[0]

    def u64(p: int) -> int:
        return struct.unpack_from("<Q", header, p)[0]

    fields = [(4, 4), (8, 8), (16, 8)]
    n_tensors, n_kv, pos = u64(8), u64(16), 24
    for _ in range(n_kv):
        fields += [(pos, 8), (pos + 8 + u64(pos), 4)]
        pos += 8 + u64(pos)
        vtype, pos = u32(pos), pos + 4
        pos = _skip_value(header, vtype, pos, fields)
    for _ in range(n_tensors):
        fields.append((pos, 8))
        pos += 8 + u64(pos)
        n_dims = u32(pos)
        fields += [(pos, 4)] + [(pos + 4 + 8 * i, 8) for i in range(n_dims)]
        pos += 4 + 8 * n_dims
        fields += [(pos, 4), (pos + 4, 8)]
        pos += 12
    return fields


def _skip_value(header: bytes, vtype: int, pos: int, fields: list) -> int:
    if vtype == V.STRING:
        fields.append((pos, 8))
        return pos + 8 + struct.unpack_from("<Q", header, pos)[0]
    if vtype != V.ARRAY:
        return pos + struct.calcsize("<" + _SCALAR_FMT[V(vtype)])
    item, count = struct.unpack_from("<IQ", header, pos)
    fields += [(pos, 4), (pos + 4, 8)]
    pos += 12
    if item != V.STRING:
        return pos + count * struct.calcsize("<" + _SCALAR_FMT[V(item)])
    for i in range(count):  # record a sample of the string lengths: first, last, every 997th
        if i < 16 or i == count - 1 or i % 997 == 0:
            fields.append((pos, 8))
        pos += 8 + struct.unpack_from("<Q", header, pos)[0]
    return pos


def _extreme(rng: random.Random, old: int, width: int, header_len: int, file_size: int) -> int:
    top = 2 ** (8 * width) - 1
    picks = [0, 1, 2, 5, 13, 99, 2**31, 2**32 - 1, old + 1, old - 1, old * 2, rng.randrange(top + 1)]
    if width == 8:
        picks += [2**32, 2**62, 2**63 - 1, 2**63, top, header_len, file_size, file_size // 8]
    return rng.choice(picks) & top


def mutate(rng: random.Random, header: bytes, fields, file_size: int) -> tuple[bytes, bool]:
    """One mutated header and whether the file should keep the original size after it."""
    data = bytearray(header)
    kind = rng.choice(("flip", "field", "field", "truncate", "insert", "delete", "splice"))
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "field":
        for _ in range(rng.randint(1, 3)):
            pos, width = rng.choice(fields)
            old = int.from_bytes(data[pos : pos + width], "little")
            new = _extreme(rng, old, width, len(header), file_size)
            data[pos : pos + width] = new.to_bytes(width, "little")
    elif kind == "truncate":
        cut = rng.choice(fields)[0] + rng.randint(0, 8) if rng.random() < 0.5 else rng.randrange(len(data))
        return bytes(data[:cut]), False
    elif kind == "insert":
        pos = rng.choice(fields)[0]
        data[pos:pos] = rng.randbytes(rng.choice((1, 4, 8)))
    elif kind == "delete":
        pos = rng.choice(fields)[0]
        del data[pos : pos + rng.choice((1, 4, 8))]
    else:
        pos, n = rng.randrange(len(data)), rng.randint(1, 64)
        data[pos : pos + n] = rng.randbytes(n)
    return bytes(data), True


def write_case(path: Path, header: bytes, size: int | None) -> None:
    """The header, then (sparse) zeros up to `size` so the tensors' extents still fit."""
    with open(path, "wb") as f:
        f.write(header)
        if size is not None and size > len(header):
            f.truncate(size)


def run_mutations(model_path: Path, tmp_path: Path, n_cases: int, seed: int) -> dict[str, int]:
    g = open_gguf(model_path)
    with open(model_path, "rb") as f:
        header = f.read(g.data_offset)
    size, fields = g.file_size, structural_fields(header)
    write_case(tmp_path / "base.gguf", header, size)
    assert check_case(tmp_path / "base.gguf"), "the unmutated header must parse"
    rng = random.Random(seed)
    counts = {"parsed": 0, "refused": 0}
    for i in range(n_cases):
        mutated, keep_size = mutate(rng, header, fields, size)
        path = tmp_path / f"case{i % 2}.gguf"
        write_case(path, mutated, size if keep_size else None)
        parsed = check_case(path, decode_arrays=i % TRACE_EVERY == 0 and len(header) < 4_000_000,
                            trace=i % TRACE_EVERY == 0)
        counts["parsed" if parsed else "refused"] += 1
    return counts


@pytest.mark.parametrize("model", sorted(MUTATIONS))
def test_mutated_real_headers_parse_or_refuse(model, smollm2_path, gemma_path, tmp_path):
    """Seeded mutations of a real header: each parses or raises KineticError, fast and small."""
    path = smollm2_path if model == "smollm2" else gemma_path
    counts = run_mutations(path, tmp_path, MUTATIONS[model], seed=2)
    assert counts["refused"] > 0 and counts["parsed"] > 0, counts  # both outcomes were exercised


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(MUTATIONS))
def test_mutated_real_headers_many_seeds(model, smollm2_path, gemma_path, tmp_path, slow_requested):
    """The same property over ten times as many cases, with other seeds."""
    path = smollm2_path if model == "smollm2" else gemma_path
    for seed in range(100, 100 + SLOW_FACTOR):
        run_mutations(path, tmp_path, MUTATIONS[model], seed=seed)


# -- hypothesis-generated headers --------------------------------------------------------------------

U64 = st.one_of(st.integers(0, 64), st.sampled_from([2**31, 2**32 - 1, 2**63, 2**64 - 1]),
                st.integers(0, 2**64 - 1))
VALUE_TYPES = st.one_of(st.sampled_from(list(V)), st.integers(0, 2**32 - 1))
TENSOR_TYPES = st.one_of(st.sampled_from(sorted(GGML_QUANT_SIZES)), st.integers(0, 2**32 - 1))
NAMES = st.one_of(st.text(max_size=12).map(str.encode), st.binary(max_size=12))


def _u64(n: int) -> bytes:
    return struct.pack("<Q", n)


@st.composite
def any_value(draw) -> bytes:
    """A value type code and bytes for it, which may or may not match the type."""
    vtype = draw(VALUE_TYPES)
    if draw(st.booleans()):
        return struct.pack("<I", vtype) + draw(st.binary(max_size=40))
    if vtype == V.ARRAY:
        item = draw(VALUE_TYPES)
        items = draw(st.lists(st.binary(max_size=10).map(lambda b: _u64(len(b)) + b), max_size=4))
        count = draw(st.one_of(st.just(len(items)), U64))
        return struct.pack("<IIQ", vtype, item, count) + b"".join(items)
    length = draw(U64)
    return struct.pack("<I", vtype) + _u64(length) + draw(st.binary(max_size=16))


@st.composite
def any_tensor(draw) -> bytes:
    name = draw(NAMES)
    ne = draw(st.lists(st.one_of(st.sampled_from([1, 32, 256]), U64), min_size=0, max_size=5))
    n_dims = draw(st.one_of(st.just(len(ne)), st.integers(0, 2**32 - 1)))
    body = struct.pack(f"<I{len(ne)}Q", n_dims, *ne)
    return _u64(len(name)) + name + body + struct.pack("<IQ", draw(TENSOR_TYPES), draw(U64))


@st.composite
def any_header(draw) -> bytes:
    kvs = draw(st.lists(st.tuples(NAMES, any_value()), max_size=6))
    tensors = draw(st.lists(any_tensor(), max_size=4))
    version = draw(st.one_of(st.just(3), st.integers(0, 2**32 - 1)))
    n_tensors = draw(st.one_of(st.just(len(tensors)), U64))
    n_kv = draw(st.one_of(st.just(len(kvs)), U64))
    body = b"".join(_u64(len(k)) + k + v for k, v in kvs) + b"".join(tensors)
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + body
    return head + bytes(draw(st.integers(0, 2048)))


@st.composite
def well_formed(draw) -> tuple[bytes, dict, dict]:
    """A valid file and what it holds: {key: value} and {tensor name: (type, ne)}."""
    keys = draw(st.lists(st.text(min_size=1, max_size=10), unique=True, max_size=5))
    meta, kvs = {}, b""
    for key in keys:
        value = draw(st.one_of(st.integers(0, 2**32 - 1), st.text(max_size=20), st.booleans()))
        meta[key] = value
        kvs += _u64(len(key.encode())) + key.encode() + _encode_scalar(value)
    names = draw(st.lists(st.text(min_size=1, max_size=10), unique=True, max_size=4))
    tensors, infos, offset = {}, b"", 0
    for name in names:
        qtype = draw(st.sampled_from([GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0,
                                      GGMLQuantizationType.Q4_K, GGMLQuantizationType.IQ2_XXS]))
        block, type_size = GGML_QUANT_SIZES[qtype]
        ne = (block * draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        tensors[name] = (qtype, ne)
        infos += _u64(len(name.encode())) + name.encode() + struct.pack("<I2QIQ", 2, *ne, qtype, offset)
        offset += -(-(ne[0] // block * type_size * ne[1]) // 32) * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(names), len(keys)) + kvs + infos
    return head + bytes(-len(head) % 32 + offset), meta, tensors


def _encode_scalar(value) -> bytes:
    if isinstance(value, bool):
        return struct.pack("<IB", V.BOOL, value)
    if isinstance(value, int):
        return struct.pack("<II", V.UINT32, value)
    raw = value.encode()
    return struct.pack("<I", V.STRING) + _u64(len(raw)) + raw


_HYPOTHESIS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow],
                   database=None)


@pytest.fixture(scope="module")
def case_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(max_examples=900, **_HYPOTHESIS)
@given(content=any_header(), cut=st.one_of(st.none(), st.integers(0, 4096)))
def test_generated_headers_parse_or_refuse(case_dir, content, cut):
    """Arbitrary generated headers (and cuts of them): each parses or raises KineticError."""
    path = case_dir / "generated.gguf"
    path.write_bytes(content if cut is None else content[:cut])
    check_case(path, decode_arrays=True)


@settings(max_examples=300, **_HYPOTHESIS)
@given(case=well_formed())
def test_well_formed_headers_read_back(case_dir, case):
    """A valid generated file parses, and its metadata and tensor table are what was written."""
    content, meta, tensors = case
    path = case_dir / "well_formed.gguf"
    path.write_bytes(content)
    assert check_case(path, decode_arrays=True)
    g = open_gguf(path)
    assert dict(g.metadata) == meta
    assert {name: (t.type, t.ne) for name, t in g.tensors.items()} == tensors


@pytest.mark.slow
@settings(max_examples=10_000, **{**_HYPOTHESIS, "derandomize": False, "suppress_health_check": [
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture]})
@given(content=any_header(), cut=st.one_of(st.none(), st.integers(0, 4096)))
def test_generated_headers_many(case_dir, slow_requested, content, cut):
    """The arbitrary-header property over ten thousand random cases."""
    path = case_dir / "generated_slow.gguf"
    path.write_bytes(content if cut is None else content[:cut])
    check_case(path, decode_arrays=True)


def test_the_alarm_catches_a_hang():
    """The per-case guard works: a loop that outlives it fails with Hang."""
    start = time.monotonic()
    with pytest.raises(Hang), alarm(0.05):
        while True:
            pass
    assert time.monotonic() - start < 1
