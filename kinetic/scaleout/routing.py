"""Prefix-affinity routing: which replica answers a request, as plain code (no Ray here).

Owns: the consistent-hashing ring (HashRing) that maps an affinity key to a replica, and the pick
(`Router.pick`) that takes the ring's replica unless it is overloaded or down, then the least-loaded
one. Does not own what the key of a request is (affinity.py), the replicas' processes, or HTTP
(kinetic/scaleout/ray_serve.py).

Why a ring: each replica owns VNODES points on a circle of 64-bit hashes and a key goes to the first
point at or after its own hash. Adding a replica takes over only the arcs in front of its points,
about 1/(N+1) of the keys; every other conversation keeps its replica, and with it the prompt state
Warm Start holds there. A modulo hash would move nearly all of them.

Hand-written rather than a library: the ring is ~30 lines over hashlib and bisect, and the
libraries on PyPI (uhashring, hash_ring) add nothing we use.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, field

VNODES = 160  # points per replica: the share each replica owns stays within a few % of 1/N
DEFAULT_OVERLOAD = 4  # requests in flight on a replica from which a less loaded one is preferred


def hash64(data: bytes) -> int:
    """A stable 64-bit hash (the same in every process and on every machine, unlike hash())."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@dataclass
class HashRing:
    """Replica names on a consistent-hashing ring."""

    vnodes: int = VNODES
    _points: list[int] = field(default_factory=list)
    _owners: list[str] = field(default_factory=list)

    def add(self, name: str) -> None:
        for i in range(self.vnodes):
            point = hash64(f"{name}#{i}".encode())
            at = bisect.bisect_left(self._points, point)
            self._points.insert(at, point)
            self._owners.insert(at, name)

    def remove(self, name: str) -> None:
        kept = [(p, o) for p, o in zip(self._points, self._owners, strict=True) if o != name]
        self._points = [p for p, _ in kept]
        self._owners = [o for _, o in kept]

    @property
    def names(self) -> list[str]:
        return sorted(set(self._owners))

    def owners(self, key: bytes) -> list[str]:
        """Every replica, in the order the ring offers them to `key`: its owner first."""
        if not self._points:
            return []
        start = bisect.bisect_left(self._points, hash64(key)) % len(self._points)
        order: list[str] = []
        for i in range(len(self._points)):
            owner = self._owners[(start + i) % len(self._points)]
            if owner not in order:
                order.append(owner)
                if len(order) == len(set(self._owners)):
                    break
        return order


@dataclass
class Router:
    """The ring plus what the ingress knows of each replica: requests in flight and whether it is up."""

    ring: HashRing = field(default_factory=HashRing)
    overload: int = DEFAULT_OVERLOAD
    in_flight: dict[str, int] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)

    def add(self, name: str) -> None:
        self.ring.add(name)
        self.in_flight.setdefault(name, 0)

    def pick(self, key: bytes | None, exclude: frozenset[str] = frozenset()) -> str | None:
        """The replica for a request whose affinity key is `key` (None: no affinity, least loaded).

        The ring's first live replica, unless it has `overload` requests in flight and another has
        fewer: then the least-loaded live one (ties go to ring order). None when no replica is live."""
        live = [n for n in (self.ring.owners(key) if key is not None else self.ring.names)
                if n not in self.down and n not in exclude]
        if not live:
            return None
        least = min(live, key=lambda n: self.in_flight.get(n, 0))  # min keeps the first of equals
        if key is None:
            return least
        owner = live[0]
        if self.in_flight.get(owner, 0) >= self.overload and self.in_flight.get(least, 0) < self.in_flight[owner]:
            return least
        return owner

    def started(self, name: str) -> None:
        self.in_flight[name] = self.in_flight.get(name, 0) + 1

    def finished(self, name: str) -> None:
        self.in_flight[name] = max(0, self.in_flight.get(name, 0) - 1)
