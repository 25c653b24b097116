"""The prefix-affinity router without Ray: the ring, the overload fallback, down replicas, keys."""

from __future__ import annotations

import json

from kinetic.scaleout.affinity import affinity_key
from kinetic.scaleout.routing import HashRing, Router

KEYS = [f"conversation {i}".encode() for i in range(4000)]


def ring_of(n: int) -> HashRing:
    ring = HashRing()
    for i in range(n):
        ring.add(f"replica-{i}")
    return ring


def test_adding_a_replica_moves_about_one_key_in_n_plus_one():
    """Adding a 5th replica moves at most ~1/5 of the keys (plus slack), and only onto the new one."""
    before, after = ring_of(4), ring_of(5)
    moved = [k for k in KEYS if before.owners(k)[0] != after.owners(k)[0]]
    assert len(moved) <= 1.3 * len(KEYS) / 5
    assert len(moved) >= 0.5 * len(KEYS) / 5  # the new replica does take its share
    assert all(after.owners(k)[0] == "replica-4" for k in moved)


def test_removing_a_replica_moves_only_its_keys():
    """Removing a replica reassigns exactly the keys it owned."""
    ring = ring_of(4)
    owned_before = {k: ring.owners(k)[0] for k in KEYS}
    ring.remove("replica-2")
    for key, owner in owned_before.items():
        if owner != "replica-2":
            assert ring.owners(key)[0] == owner


def test_each_replica_owns_a_fair_share():
    """With 3 replicas each owns between 20 % and 47 % of the keys."""
    ring = ring_of(3)
    counts = {name: 0 for name in ring.names}
    for key in KEYS:
        counts[ring.owners(key)[0]] += 1
    assert all(0.20 * len(KEYS) < c < 0.47 * len(KEYS) for c in counts.values()), counts


def test_owners_lists_every_replica_once_owner_first():
    """owners() offers each replica exactly once, the key's owner first, the same order every time."""
    ring = ring_of(3)
    for key in KEYS[:50]:
        order = ring.owners(key)
        assert sorted(order) == ring.names and order == ring.owners(key)


def router_of(n: int, overload: int = 2) -> Router:
    router = Router(overload=overload)
    for i in range(n):
        router.add(f"replica-{i}")
    return router


def test_the_owner_answers_until_it_is_overloaded():
    """A key goes to its ring owner below the overload mark, to the least-loaded replica at it."""
    router = router_of(3, overload=2)
    key = KEYS[7]
    owner = router.ring.owners(key)[0]
    assert router.pick(key) == owner
    router.started(owner)
    assert router.pick(key) == owner
    router.started(owner)
    fallback = router.pick(key)
    assert fallback != owner and router.in_flight[fallback] == 0
    router.finished(owner)
    assert router.pick(key) == owner


def test_overloaded_everywhere_stays_with_the_owner():
    """When every replica is as loaded as the owner, the owner keeps the key (no pointless move)."""
    router = router_of(2, overload=1)
    for name in router.ring.names:
        router.started(name)
    key = KEYS[3]
    assert router.pick(key) == router.ring.owners(key)[0]


def test_a_down_replica_is_skipped_and_none_when_all_are_down():
    """A down or excluded replica never gets a request; with none live pick() says None."""
    router = router_of(2)
    key = KEYS[11]
    owner, other = router.ring.owners(key)
    router.down = {owner}
    assert router.pick(key) == other
    assert router.pick(key, exclude=frozenset({other})) is None


def test_no_key_goes_to_the_least_loaded():
    """A request without an affinity key goes to the replica with the fewest requests in flight."""
    router = router_of(3)
    router.started("replica-0")
    router.started("replica-1")
    assert router.pick(None) == "replica-2"


def chat(*messages, **extra) -> bytes:
    return json.dumps({"model": "m", "messages": list(messages), **extra}).encode()


def test_turns_of_one_conversation_share_a_key():
    """Turns 2 and 3 of a chat resend its opening, so they have turn 1's key; another opening differs."""
    system = {"role": "system", "content": "Be brief."}
    turn1 = [system, {"role": "user", "content": "Name a colour."}]
    turn2 = [*turn1, {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"}]
    assert affinity_key(chat(*turn1)) == affinity_key(chat(*turn2, temperature=0.5))
    assert affinity_key(chat(*turn1)) != affinity_key(chat(system, {"role": "user", "content": "Name a city."}))


def test_prompt_keys_and_bodies_without_one():
    """Completions key on their prompt's first bytes; token ids, non-JSON and empty bodies have no key."""
    def key(prompt):
        return affinity_key(json.dumps({"prompt": prompt}).encode())

    long = "x" * 5000
    assert key(long + "a") == key(long) and key("a") != key("b")
    assert key([1, 2, 3]) is None
    assert affinity_key(b"not json") is None and affinity_key(b"") is None and affinity_key(b"[1]") is None
