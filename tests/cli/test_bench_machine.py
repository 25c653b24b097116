"""What `kinetic bench` says about the machine and the file: the read bandwidth's pinned readers,
passes and spread (kinetic.bench_bandwidth), and the file type llama.cpp names (kinetic.bench_file_type)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from gguf import GGMLQuantizationType as Q

from kinetic import bench, bench_bandwidth, bench_card, bench_llama
from kinetic.bench_bandwidth import BandwidthShare, ReadBandwidth
from kinetic.bench_file_type import file_type_name


@pytest.fixture
def small_buffer(monkeypatch):
    """A 4 MiB buffer and no minimum time, so a measurement takes MIN_PASSES passes in milliseconds."""
    monkeypatch.setattr(bench_bandwidth, "buffer_bytes", lambda: 2**22)
    monkeypatch.setattr(bench_bandwidth, "MIN_SECONDS", 0.0)
    bench_bandwidth.read_bandwidth.cache_clear()
    yield
    bench_bandwidth.read_bandwidth.cache_clear()


def recording_sum(monkeypatch, sleep: float = 0.0, sleeper: str = "") -> list[tuple[int, frozenset[int]]]:
    """Replaces the summing kernel by one that records (thread id, its CPUs) and, on threads whose
    name ends with `sleeper`, sleeps `sleep` seconds."""
    seen: list[tuple[int, frozenset[int]]] = []
    real = bench_bandwidth._sum_words

    def summed(words):
        seen.append((threading.get_ident(), frozenset(os.sched_getaffinity(0))))
        if threading.current_thread().name.endswith(sleeper):
            time.sleep(sleep)
        return real(words)

    monkeypatch.setattr(bench_bandwidth, "_sum_words", summed)
    return seen


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning two readers needs two CPUs")
def test_readers_pinned_each_to_its_own_cpu(monkeypatch, small_buffer):
    """With two readers, each sums on one thread pinned to one CPU of its own, the ones reported."""
    seen = recording_sum(monkeypatch)
    measured = bench_bandwidth.read_bandwidth(2)
    first_two = tuple(sorted(os.sched_getaffinity(0))[:2])
    assert measured.cpus == first_two
    by_thread = dict(seen)
    assert len(by_thread) == 2 and sorted(by_thread.values(), key=min) == [frozenset({c}) for c in first_two]
    assert threading.main_thread().ident not in by_thread


def test_more_threads_than_cpus_are_not_pinned():
    """A thread count above the CPUs the process may use pins nothing."""
    assert bench_bandwidth.reader_cpus(len(os.sched_getaffinity(0)) + 1) == ()
    assert bench_bandwidth.reader_cpus(1) == (min(os.sched_getaffinity(0)),)


def test_pass_time_spans_the_slowest_reader(monkeypatch, small_buffer):
    """A pass lasts until its last reader is done: no rate is above the buffer over the second
    reader's sleep (the first does not sleep)."""
    recording_sum(monkeypatch, sleep=0.02, sleeper="-1")
    measured = bench_bandwidth.read_bandwidth(2)
    assert measured.best <= 2**22 / 0.02
    assert len(measured.rates) == bench_bandwidth.MIN_PASSES


def test_passes_go_on_for_the_minimum_time(monkeypatch, small_buffer):
    """Passes continue until MIN_SECONDS have passed, and stop at MAX_PASSES."""
    monkeypatch.setattr(bench_bandwidth, "MIN_SECONDS", 0.2)
    recording_sum(monkeypatch, sleep=0.01)
    measured = bench_bandwidth.read_bandwidth(1)
    assert measured.seconds >= 0.2 and len(measured.rates) > bench_bandwidth.MIN_PASSES
    bench_bandwidth.read_bandwidth.cache_clear()
    monkeypatch.setattr(bench_bandwidth, "MAX_PASSES", 7)
    assert len(bench_bandwidth.read_bandwidth(1).rates) == 7


def test_spread_in_the_line_and_json():
    """The bandwidth line and JSON give the best pass and, beside it, the passes' median and slowest."""
    passes = ReadBandwidth((10e9, 40e9, 30e9, 20e9), 1.04, (0, 1))
    assert (passes.best, passes.median, passes.slowest) == (40e9, 25e9, 10e9)
    share = BandwidthShare(1e8, 100.0, passes.best, passes)
    assert share.line() == ("decode reads 100.0 MB a token: 10.0 GB/s, 25 % of the 40.0 GB/s this machine reads "
                            "(best of 4 passes in 1.0 s, pinned; median 25.0, slowest 10.0 GB/s)")
    assert share.to_json() == {
        "decode_bytes_per_token": 100000000, "decode_gb_per_s": 10.0, "machine_read_gb_per_s": 40.0,
        "bandwidth_share": 0.25, "machine_read_passes": 4, "machine_read_median_gb_per_s": 25.0,
        "machine_read_slowest_gb_per_s": 10.0, "machine_read_pinned": True}
    assert "not pinned" in ReadBandwidth((1e9,), 0.1, ()).note()


def tensors(**nbytes: int) -> dict:
    return {name: SimpleNamespace(type=Q[name], nbytes=n) for name, n in nbytes.items()}


def test_file_type_is_general_file_type():
    """The file type is llama.cpp's name for general.file_type, not the type with most bytes (Gemma 3
    270M Q4_K_M's embedding table is Q8_0); without the key it is that type, marked guessed."""
    most_q8 = tensors(Q8_0=170_000_000, Q4_K=60_000_000)
    assert file_type_name({"general.file_type": 15}, most_q8) == "Q4_K - Medium"
    assert file_type_name({"general.file_type": 3}, most_q8) == "Q4_1"
    assert file_type_name({"general.file_type": 1}, most_q8) == "F16"
    assert file_type_name({"general.file_type": 0}, most_q8) == "all F32"
    assert file_type_name({"general.file_type": 30}, most_q8) == "IQ4_XS - 4.25 bpw"
    assert file_type_name({}, most_q8) == "Q8_0 (guessed)"
    assert file_type_name({"general.file_type": 999}, most_q8) == "Q8_0 (guessed)"


def test_card_names_the_file_type():
    """The card's file line names the file type the result carries."""
    r = bench.BenchResult(Path("gemma.gguf"), "cpu", 2, 1, [], 0.1, 2**28, 10, "Q4_K - Medium", 0)
    r.tests = [bench.TestResult("tg8", 8, [0.1])]
    ll = bench_llama.LlamaBenchResult(1, "abc", {"tg8": 50.0}, {"tg8": 50.0}, {"tg8": [50.0]})
    assert "Same file (0.25 GiB, Q4_K - Medium), on the CPU" in bench_card.card(r, ll)
