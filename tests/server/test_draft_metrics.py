"""/metrics' per-drafter counters (kinetic:draft_tokens_total, kinetic:draft_tokens_accepted_total) on a
synthetic llama file, whose greedy answers repeat tokens, so the context drafter guesses and is right."""

from __future__ import annotations

import re

import pytest

from tests.synthetic import synthetic_path

REPEATING = [5, 6, 7, 8] * 8  # prompt ids; the synthetic model's greedy answer to it repeats one token


@pytest.fixture(scope="module")
def client():
    from litestar.testing import TestClient

    import kinetic
    from kinetic.server import ServerOptions, create_app

    model = kinetic.Model(synthetic_path("llama"), n_ctx=256, warm_start=False)
    with TestClient(create_app(model, ServerOptions()), base_url="http://127.0.0.1:8080") as c:
        yield c


def draft_counts(text: str) -> dict[str, tuple[int, int]]:
    """source -> (guessed, kept) from the kinetic:draft_* samples of a /metrics text."""
    found: dict[str, list[int]] = {}
    for metric, source, value in re.findall(r'^kinetic:(draft_tokens(?:_accepted)?_total)\{source="(\w+)"\} (\d+)$',
                                            text, re.MULTILINE):
        found.setdefault(source, [0, 0])[metric == "draft_tokens_accepted_total"] = int(value)
    return {source: (guessed, kept) for source, (guessed, kept) in found.items()}


def test_a_drafted_request_adds_its_guesses_per_drafter(client):
    """After a request whose answer repeats, /metrics counts the context drafter's guessed tokens and the
    kept ones (kept <= guessed), and a second such request adds to both."""
    def ask() -> None:
        body = {"prompt": REPEATING, "n_predict": 40, "temperature": 0}
        assert client.post("/completion", json=body).json()["tokens_predicted"] == 40

    ask()
    first = draft_counts(client.get("/metrics").text)
    assert first.get("context", (0, 0))[1] > 0, first
    assert all(0 <= kept <= guessed for guessed, kept in first.values())
    ask()
    second = draft_counts(client.get("/metrics").text)
    assert sum(g for g, _ in second.values()) > sum(g for g, _ in first.values())
    assert all(second[s][1] >= first[s][1] for s in first)


def test_draft_counters_keep_llama_server_names_beside_them(client):
    """The llamacpp:* counters stay as llama-server names them; the drafters' counters are declared as
    counters under kinetic:, not llamacpp:."""
    text = client.get("/metrics").text
    assert "\nllamacpp:tokens_predicted_total " in "\n" + text
    assert "# TYPE kinetic:draft_tokens_total counter" in text
    assert "# TYPE kinetic:draft_tokens_accepted_total counter" in text
    assert "llamacpp:draft" not in text
