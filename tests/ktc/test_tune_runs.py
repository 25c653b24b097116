"""`kinetic compile --tune`'s time bound (kinetic/ktc/tune_runs.py): the wall-clock estimates, the tg
run cut at the deadline, the calibration's runs counted, and a phase's rounds ending before the
deadline on a scripted clock (no timed assertion: the clock is fake)."""

from __future__ import annotations

import time

import pytest

from kinetic.codegen.cpu.matmul_choice import MatmulChoice
from kinetic.compiler import compile_graph
from kinetic.frontend.gguf_file import open_gguf
from kinetic.ktc import tune, tune_runs
from kinetic.ktc.tune_runs import KERNEL_SECONDS, SLACK, Candidate, Engines, Sizes, Walls
from kinetic.runtime.engine import Engine
from kinetic.runtime.weights import GGUFWeights
from tests.synthetic import synthetic_path


@pytest.fixture(scope="module")
def llama():
    gguf = open_gguf(synthetic_path("llama"))
    graph = compile_graph(gguf)
    return graph, GGUFWeights(gguf), tune.prompt_ids(graph)


def test_walls_scale_by_units_and_threads():
    """A unit's longest wall at t threads bounds a run at c <= t threads by t/c, per unit; counts
    above every one seen take the longest seen."""
    walls = Walls()
    walls.add("pp", 2, 1.0, 128)
    walls.add("pp", 2, 0.5, 128)  # shorter: the longest stays
    assert walls.estimate("pp", 2, 512) == pytest.approx(4.0)
    assert walls.estimate("pp", 1, 512) == pytest.approx(8.0)
    assert walls.estimate("pp", 4, 128) == pytest.approx(1.0)
    walls.add("pp", 1, 1.5, 128)  # measured at 1 thread: its own wall, not 2's scaled
    assert walls.estimate("pp", 1, 128) == pytest.approx(1.5)
    assert walls.estimate("tg", 1, 8) == 0.0


def test_build_estimate_counts_opening_check_and_new_kernels(llama):
    """A built engine costs nothing more; another of known kernels its opening plus its bit check
    (FRESH x a prompt of the check's tokens and a decode step as runs, until a check after the first
    engine's was seen, then that one); a kernel set no engine has adds a compile of each of the
    graph's matmul kernels at no less than KERNEL_SECONDS."""
    graph, weights, prompt = llama
    engines = Engines(graph, weights, "cpu", prompt, n_ctx=tune.N_CTX, check_tokens=tune.FINGERPRINT_TOKENS)
    first = Candidate(1, 32)
    engines(first)
    walls = Walls()
    walls.add("pp", 1, 0.01 * 128, 128)
    walls.add("tg", 1, 0.02, 1)
    check = tune_runs.FRESH * (0.01 * tune.FINGERPRINT_TOKENS + 0.02)
    assert engines.build_estimate(first, walls) == 0.0 and not engines.checks.per_unit
    assert engines.opening > 0 and engines.build_estimate(Candidate(1, 64), walls) == pytest.approx(
        engines.opening + check)
    new = engines.build_estimate(Candidate(1, 32, matmul=MatmulChoice(tile=4)), walls)
    assert engines.kernels >= 1 and engines.compile >= KERNEL_SECONDS
    assert new == pytest.approx(engines.opening + check + engines.kernels * engines.compile)
    engines(Candidate(1, 64))
    seen = engines.checks.estimate("check", 1, 1)
    assert seen > 0 and engines.build_estimate(Candidate(1, 128), walls) == pytest.approx(engines.opening + seen)


def test_a_tg_run_stops_at_the_deadline(llama):
    """A tg run that reaches its deadline before its last step stops there and is not counted (None);
    without one it runs every step; a pp run (one pass) runs whole."""
    graph, weights, prompt = llama
    engine = Engine(graph, weights, n_ctx=tune.N_CTX, batch=32, threads=1)
    sizes = Sizes(pp=32, tg=8, prompt=prompt)
    passed = time.monotonic()
    assert tune_runs.run(engine, "tg", sizes, deadline=passed) is None
    assert tune_runs.run(engine, "tg", sizes) > 0
    assert tune_runs.run(engine, "pp", sizes, deadline=passed) > 0


@pytest.mark.parametrize("took, counted", [(1.0, True), (0.001, False)])
def test_calibration_runs_count_where_the_sizes_stay_the_least(took, counted, monkeypatch):
    """The calibration's two runs (the least sizes) are the default candidate's first where its run
    sizes stay the least (a short limit or a slow machine: its rates are measured however little time
    is left), not where runs are longer; their walls are seen either way."""
    monkeypatch.setattr(tune_runs, "run", lambda engine, kind, sizes, deadline=None: took)
    default, walls = Candidate(1, 32), Walls()
    sizes = tune_runs.calibrate(None, default, walls, 10.0, tuple(range(128)), 32)
    least = sizes.pp == 32 and sizes.tg == tune_runs.MIN_TG
    assert least == counted and len(default.pp) == len(default.tg) == len(default.walls["pp"]) == int(counted)
    assert walls.estimate("pp", 1, 32) > 0 and walls.estimate("tg", 1, 1) > 0


class _Script:
    """A fake clock and engines: each build and run advances the clock by a scripted wall; a run's
    timed part is half its wall (the rest: a new sequence, a tg run's prompt), as a real one's is less."""

    def __init__(self, build: float, runs: dict[int, float], grow: float = 1.0):
        self.time, self.build, self.runs, self.grow = 0.0, build, runs, grow
        self.built: set = set()
        self.started: list[tuple[float, float]] = []  # (start, wall) of each run

    def now(self) -> float:
        return self.time

    def build_estimate(self, c, walls) -> float:
        return 0.0 if c.key in self.built else self.build

    def __call__(self, c):
        if c.key not in self.built:
            self.built.add(c.key)
            self.time += self.build
        return c

    def run(self, c, kind, sizes, deadline):
        wall = self.runs[c.threads] * self.grow ** len(self.started)
        self.started.append((self.time, wall))
        self.time += wall
        return wall / 2


@pytest.mark.parametrize("build, deadline, grow, builds", [(0.4, 5.0, 1.0, True), (0.4, 5.0, 1.05, True),
                                                          (3.0, 3.0, 1.0, False)])
def test_a_phase_ends_before_its_deadline(build, deadline, grow, builds, monkeypatch):
    """On a scripted clock whose runs take twice their timed part and slow down by `grow` a run
    (within SLACK of the last), the phase never runs past its deadline, builds the second engine
    only when its build and run fit, and uses the time: no run that fitted is left out at the end."""
    script = _Script(build=build, runs={1: 0.3, 2: 0.2}, grow=grow)
    monkeypatch.setattr(tune_runs, "run", script.run)
    walls = Walls()
    walls.add("pp", 2, 0.2, 32)  # the calibration's run on the first engine
    candidates = [Candidate(2, 32), Candidate(1, 32)]
    script.built.add(candidates[0].key)
    tune_runs.measure(candidates, ("pp",), script, walls, Sizes(pp=32, tg=4, prompt=()), deadline, lambda _: None,
                      now=script.now)
    assert script.time <= deadline and len(script.started) > 10
    assert bool(candidates[1].pp) == builds
    assert all(deadline - script.time < SLACK * max(c.walls["pp"]) for c in candidates if c.pp)
