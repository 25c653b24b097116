"""Flywheel's placement logic (kinetic/codegen/common/flywheel.py) against a simulated device: given GPU
memory, expert sizes and costs, the decisions it must make."""

from __future__ import annotations

import numpy as np

from kinetic.codegen.common.flywheel import Budget, Costs, Flywheel, Rate, Where

MB = 1 << 20
EXPERT = 4 * MB  # one expert's gate + up + down


def _costs(*, cpu_gbps: float = 20.0, copy_gbps: float = 25.0, gpu_gbps: float = 1000.0) -> Costs:
    """Costs from bandwidths in GB/s: the CPU and GPU read an expert once per row, a copy moves it once."""
    return Costs(cpu=Rate(1 / (cpu_gbps * 1e9)), copy=Rate(1 / (copy_gbps * 1e9)), gpu=Rate(1 / (gpu_gbps * 1e9)))


def _flywheel(*, cache_experts: float, n_layer: int = 4, n_expert: int = 16, costs: Costs | None = None) -> Flywheel:
    budget = Budget(gpu_total=int(cache_experts * EXPERT) + 100 * MB + 50 * MB, fixed=100 * MB, reserve=50 * MB)
    return Flywheel(budget, {il: EXPERT for il in range(n_layer)}, n_expert, costs or _costs())


def _simulate(fw: Flywheel, trace: list[list[list[int]]], costs: Costs) -> tuple[float, dict[Where, int]]:
    """Runs a routing trace (token -> layer -> chosen experts) through the placement, charging the
    simulated device's true costs; returns the seconds spent and the count of each decision."""
    seconds, counts = 0.0, dict.fromkeys(Where, 0)
    for token in trace:
        for layer, experts in enumerate(token):
            for where in fw.place(layer, dict.fromkeys(experts, 1)).values():
                counts[where] += 1
                seconds += {Where.GPU: EXPERT * costs.gpu.seconds_per_unit, Where.CPU: costs.run_cpu(EXPERT, 1),
                            Where.COPY: costs.run_copied(EXPERT, 1)}[where]
            assert fw.cache.used <= fw.budget.expert_cache
    return seconds, counts


def _skewed_trace(n_tokens: int, *, n_layer: int = 4, n_expert: int = 16, k: int = 2, seed: int = 0) -> list:
    """Routing where a few experts per layer are popular (Zipf-like), as trained routers are."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n_expert + 1) ** 1.5
    p /= p.sum()
    return [[rng.choice(n_expert, size=k, replace=False, p=p).tolist() for _ in range(n_layer)]
            for _ in range(n_tokens)]


def test_the_expert_cache_is_the_memory_left_minus_the_reserve():
    """The cache gets the GPU memory minus the fixed part and the reserve, and never holds more."""
    fw = _flywheel(cache_experts=16)  # a quarter of 4 layers x 16 experts
    assert fw.budget.expert_cache == 16 * EXPERT
    assert not fw.all_fit
    _simulate(fw, _skewed_trace(200), _costs())
    assert fw.cache.used <= 16 * EXPERT and len(fw.cache.resident) <= 16


def test_when_every_expert_fits_everything_runs_on_the_gpu():
    """With room for every expert, each is resident from the start: no copies, no CPU work."""
    fw = _flywheel(cache_experts=64)
    assert fw.all_fit and "all 64 on the GPU" in fw.status()
    _, counts = _simulate(fw, _skewed_trace(50), _costs())
    assert counts[Where.CPU] == 0 and counts[Where.COPY] == 0


def test_a_miss_is_copied_when_copying_is_cheaper_else_run_on_the_cpu():
    """A resident expert runs on the GPU; a missing one is copied when the link beats the CPU (then it is
    resident), and runs on the CPU when the CPU is faster than the copy."""
    fast_link = _flywheel(cache_experts=8, costs=_costs(cpu_gbps=10, copy_gbps=25))
    assert fast_link.place(0, {3: 1}) == {3: Where.COPY}
    assert fast_link.place(0, {3: 1}) == {3: Where.GPU}
    slow_link = _flywheel(cache_experts=8, costs=_costs(cpu_gbps=30, copy_gbps=5))
    assert slow_link.place(0, {3: 1}) == {3: Where.CPU}
    assert (0, 3) not in slow_link.cache.resident


def test_many_rows_on_one_expert_make_copying_pay():
    """The CPU's cost grows with the rows routed to an expert, a copy's does not: a prompt's 64 rows on one
    expert copy it even where one decode row runs on the CPU."""
    fw = _flywheel(cache_experts=8, costs=_costs(cpu_gbps=30, copy_gbps=5))
    assert fw.place(0, {1: 1}) == {1: Where.CPU}
    assert fw.place(0, {2: 64}) == {2: Where.COPY}


def test_a_slowed_cpu_shifts_misses_to_copies():
    """The measured CPU cost follows new measurements: when other programs slow the CPU 4x, misses that
    ran on the CPU are copied instead."""
    costs = _costs(cpu_gbps=30, copy_gbps=20)
    fw = _flywheel(cache_experts=8, costs=costs)
    assert fw.place(0, {5: 1}) == {5: Where.CPU}
    for _ in range(20):
        costs.cpu.observe(seconds=EXPERT / 7.5e9, units=EXPERT)  # now 7.5 GB/s
    assert fw.place(0, {6: 1}) == {6: Where.COPY}


def test_popular_experts_survive_a_stream_of_one_off_experts():
    """Eviction follows use frequency: an expert used every other token stays resident while 40 experts
    used once each pass through a cache of 3 (plain LRU would evict it)."""
    fw = _flywheel(cache_experts=3, n_layer=1, n_expert=64, costs=_costs(cpu_gbps=5, copy_gbps=25))
    for i in range(40):
        if i % 2 == 0:
            fw.place(0, {0: 1})
        fw.place(0, {1 + i: 1})
        fw.place(0, {50: 1})  # a second popular one
    assert (0, 0) in fw.cache.resident and (0, 50) in fw.cache.resident


def test_a_layer_never_evicts_an_expert_it_uses():
    """The experts chosen in one layer are pinned: copying one of them never evicts another of them."""
    fw = _flywheel(cache_experts=2, n_layer=1, n_expert=8, costs=_costs(cpu_gbps=5, copy_gbps=25))
    placed = fw.place(0, {0: 3, 1: 2, 2: 1})
    assert placed[0] == Where.COPY and placed[1] == Where.COPY and placed[2] == Where.CPU
    assert set(fw.cache.resident) == {(0, 0), (0, 1)}


def test_likely_experts_are_prefetched_and_then_hit():
    """A layer's most used experts that are not resident are prefetched before it runs, and the next
    token's routing to them runs on the GPU without a copy."""
    fw = _flywheel(cache_experts=4, n_layer=2, n_expert=16, costs=_costs(cpu_gbps=30, copy_gbps=5))
    for _ in range(5):
        assert fw.place(1, {7: 1, 9: 1}) == {7: Where.CPU, 9: Where.CPU}  # the CPU beats a copy
    assert sorted(fw.prefetch(1)) == [7, 9]
    assert fw.place(1, {7: 1, 9: 1}) == {7: Where.GPU, 9: Where.GPU}


def _always_copy_lru(trace: list, capacity: int, costs: Costs) -> float:
    """The simulated time of the naive policy: every miss is copied up, the least recently used expert
    evicted (an offload cache without costs or frequencies)."""
    from collections import OrderedDict

    cache: OrderedDict = OrderedDict()
    seconds = 0.0
    for token in trace:
        for layer, experts in enumerate(token):
            for expert in experts:
                key = (layer, expert)
                if key in cache:
                    cache.move_to_end(key)
                    seconds += EXPERT * costs.gpu.seconds_per_unit
                    continue
                if len(cache) >= capacity:
                    cache.popitem(last=False)
                cache[key] = True
                seconds += costs.run_copied(EXPERT, 1)
    return seconds


def test_flywheel_beats_all_cpu_and_always_copy_on_a_skewed_trace():
    """On the simulated device (a quarter of the experts fit), Flywheel's total time is below running
    every expert on the CPU and below copying every miss into an LRU cache, on popular-expert routing."""
    costs = _costs(cpu_gbps=20, copy_gbps=25)
    trace = _skewed_trace(300, seed=3)
    flywheel, counts = _simulate(_flywheel(cache_experts=16, costs=costs), trace, costs)
    n_routed = sum(len(experts) for token in trace for experts in token)
    assert counts[Where.GPU] > n_routed // 2  # the popular experts stay resident
    assert flywheel < n_routed * costs.run_cpu(EXPERT, 1)
    assert flywheel < _always_copy_lru(trace, 16, costs)
