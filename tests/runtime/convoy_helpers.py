"""Running requests alone and in a Convoy, for the identity gate (convoy = alone)."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from kinetic.runtime.generation import Finished, GenerationRequest, Piece
from kinetic.runtime.scheduler import Failed, Scheduler


@dataclass(frozen=True)
class Answer:
    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    stop_type: str
    passes: int = field(compare=False)  # passes that held its rows (drafting's choices vary them)


def answer_of(events: list) -> Answer:
    """The Answer of one request's events (Piece events, then its Finished)."""
    done = events[-1]
    assert isinstance(done, Finished), f"the answer failed: {done}"
    text = "".join(e.text for e in events if isinstance(e, Piece))
    return Answer(text, tuple(done.tokens), done.finish_reason, done.stop_type, done.passes)


def alone(generator, request: GenerationRequest) -> Answer:
    """The answer with every pass its own (iterating the Generation)."""
    return answer_of(list(generator.generate(request)))


def convoy(generator, requests: list[GenerationRequest], slots: int, together: int = 2,
           timeout: float = 300.0) -> tuple[list[Answer], Scheduler]:
    """The answers of `requests` run by one Scheduler with `slots` slots: the first `together` arrive
    at once, each later one once the request before it has sent its first text (so it arrives
    while others decode). Returns the answers in request order and the (stopped) scheduler."""
    scheduler = Scheduler(generator, slots=slots)
    inbox: queue.Queue = queue.Queue()
    events: list[list] = [[] for _ in requests]
    scheduler.start()
    try:
        for i in range(min(together, len(requests))):
            scheduler.submit(requests[i], lambda e, i=i: inbox.put((i, e)))
        submitted, done = min(together, len(requests)), 0
        while done < len(requests):
            i, event = inbox.get(timeout=timeout)
            assert not isinstance(event, Failed), f"request {i} failed: {event.message}"
            events[i].append(event)
            done += isinstance(event, Finished)
            if submitted < len(requests) and i == submitted - 1 and (isinstance(event, Piece) and event.text
                                                                      or isinstance(event, Finished)):
                scheduler.submit(requests[submitted], lambda e, i=submitted: inbox.put((i, e)))
                submitted += 1
    finally:
        scheduler.stop()
    return [answer_of(e) for e in events], scheduler


def shared_passes(answers: list[Answer], scheduler: Scheduler) -> bool:
    """Whether the scheduler ran fewer passes than its answers had: some passes held several
    answers' rows."""
    return scheduler.counters.n_decode_total < sum(a.passes for a in answers)
