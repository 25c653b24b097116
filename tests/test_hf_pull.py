"""`kinetic pull org/repo[:QUANT]` against a local stand-in for the Hugging Face hub (tests/hub_server.py,
HF_ENDPOINT pointed at it) holding the real SmolLM2 file: fresh, resumed, corrupted, split, the
quantization choice, errors. The models folder is a temporary KINETIC_MODELS.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kinetic import hf_pull, hub
from kinetic.cli.main import main
from kinetic.errors import KineticError
from tests.hub_server import Hub, HubFile, HubServer

REPO = "test-org/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
MiB = 1024**2


@pytest.fixture(scope="module")
def smollm2_bytes(smollm2_path) -> bytes:
    return smollm2_path.read_bytes()


@pytest.fixture
def hub_repos(smollm2_bytes) -> Hub:
    half = len(smollm2_bytes) // 2
    small_q4, small_q8 = b"GGUF" + bytes(2 * MiB), b"GGUF" + bytes(4 * MiB)
    return Hub(repos={
        REPO: {FILE: HubFile(data=smollm2_bytes, sha256=hub.KNOWN_MODELS["smollm2-135m"].sha256),
               "README.md": HubFile(data=b"# SmolLM2\n", lfs=False),
               "mmproj-SmolLM2-f16.gguf": HubFile(data=b"GGUF projector")},
        "test-org/split-GGUF": {"s-Q4_1-00001-of-00002.gguf": HubFile(data=smollm2_bytes[:half]),
                                "s-Q4_1-00002-of-00002.gguf": HubFile(data=smollm2_bytes[half:])},
        "test-org/multi-GGUF": {"m-Q4_K_M.gguf": HubFile(data=small_q4), "m-Q8_0.gguf": HubFile(data=small_q8),
                                "m-F16.gguf": HubFile(data=b"GGUF" + bytes(8 * MiB))},
    })


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "models"
    monkeypatch.setenv("KINETIC_MODELS", str(folder))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    return folder


@pytest.fixture
def server(hub_repos, models, monkeypatch):
    with HubServer(hub_repos) as s:
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        yield s


def pull(name: str, **kw) -> tuple[Path, list[str]]:
    lines: list[str] = []
    return hub.pull(name, out=lines.append, progress=False, **kw), lines


def file_requests(s: HubServer) -> list[dict]:
    return [r for r in s.hub.requests if r["path"].startswith("/cdn/")]


def test_fresh_pull_puts_the_checked_file_in_place(server, models, smollm2_bytes):
    """A fresh pull leaves exactly the published model file under org/repo, and its name runs it."""
    path, lines = pull(REPO)
    assert path == models / REPO / FILE and path.read_bytes() == smollm2_bytes
    assert sorted(p.name for p in (models / REPO).iterdir()) == [FILE]  # no README, no projector
    assert not (models / ".pull").exists()
    assert f"run it with: kinetic run {REPO}:Q4_1" in lines
    assert hub.resolve_model(f"{REPO.lower()}:q4_1") == path
    assert not any("agent-harnesses" in r["path"] for r in server.hub.requests)  # no telemetry


def test_a_second_pull_downloads_nothing(server, models):
    """A model already in place (with the published hash) is not fetched again."""
    pull(REPO)
    fetched = len(file_requests(server))
    path, lines = pull(REPO)
    assert len(file_requests(server)) == fetched and any("already downloaded" in line for line in lines)


def test_a_transfer_cut_off_is_resumed_with_a_range_request(server, smollm2_bytes):
    """When the server drops the connection half way, the rest is asked for with a Range request."""
    server.hub.cut_first = True
    path, _ = pull(REPO)
    ranges = [r["range"] for r in file_requests(server)]
    assert ranges[0] is None and ranges[1] is not None and int(ranges[1][6:-1]) > 0
    assert path.read_bytes() == smollm2_bytes


def test_a_part_left_by_an_earlier_pull_is_continued(server, models, smollm2_bytes):
    """A part file from an interrupted pull is continued from where it ends, not fetched again."""
    staging = models / ".pull" / REPO.replace("/", "--")
    staging.mkdir(parents=True)
    (staging / f"{FILE}.part").write_bytes(smollm2_bytes[: 10 * MiB])
    path, _ = pull(REPO)
    assert [r["range"] for r in file_requests(server)] == [f"bytes={10 * MiB}-"]
    assert path.read_bytes() == smollm2_bytes and not (models / ".pull").exists()


def test_a_corrupted_download_is_refused_and_nothing_is_left(server, models):
    """Bytes that do not match the published SHA-256 are refused; no file, part or folder remains."""
    server.hub.corrupt = True
    with pytest.raises(KineticError, match="does not match the SHA-256"):
        pull(REPO)
    assert not (models / REPO / FILE).exists() and not (models / ".pull").exists()


def test_a_split_model_fetches_every_part(server, models, smollm2_bytes):
    """Every part of a split model arrives, in order; the output says how to join them."""
    first, lines = pull("test-org/split-GGUF")
    second = first.with_name("s-Q4_1-00002-of-00002.gguf")
    assert first.name == "s-Q4_1-00001-of-00002.gguf"
    assert first.read_bytes() + second.read_bytes() == smollm2_bytes
    assert any("llama-gguf-split --merge" in line for line in lines)
    assert hub.resolve_model("test-org/split-GGUF:Q4_1") == first


def test_the_named_quantization_is_taken_whatever_its_case(server, models):
    """`:q8_0` takes the Q8_0 file even though the machine's memory would choose another."""
    path, _ = pull("test-org/multi-GGUF:q8_0", memory=1)
    assert path.name == "m-Q8_0.gguf"


def test_the_automatic_choice_follows_memory(server, models):
    """Without a quantization: the largest of the ladder that fits the memory given (F16 is not in it)."""
    small, _ = pull("test-org/multi-GGUF", memory=3 * MiB)
    assert small.name == "m-Q4_K_M.gguf"
    large, lines = pull("test-org/multi-GGUF", memory=100 * MiB)
    assert large.name == "m-Q8_0.gguf" and "the largest of" in lines[0]


def test_a_quantization_the_repository_lacks_lists_what_it_has(server):
    """A quantization that is not there is refused, listing the ones that are."""
    with pytest.raises(KineticError, match="has no IQ2_XS model; it has: .*Q4_K_M.*Q8_0"):
        pull("test-org/multi-GGUF:IQ2_XS")


def test_an_unknown_repository_is_a_clear_error(server):
    """A repository the hub does not have is named in the error, with a hint about the name and HF_TOKEN."""
    with pytest.raises(KineticError, match="no repository test-org/nope on http://127.0.0.1") as err:
        pull("test-org/nope")
    assert "HF_TOKEN" in err.value.hint


def test_hf_token_is_sent(server, monkeypatch):
    """HF_TOKEN goes to the hub as a bearer token, on the file list and on the download."""
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    pull(REPO)
    seen = {r["path"].split("/")[1]: r["authorization"] for r in server.hub.requests}
    assert seen["api"] == "Bearer hf_test_token" and seen["test-org"] == "Bearer hf_test_token"


def test_an_unreachable_endpoint_says_so(models, monkeypatch):
    """No server at HF_ENDPOINT: an error naming the endpoint and what to check."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(KineticError, match="cannot download from http://127.0.0.1:9") as err:
        pull(REPO)
    assert "HF_ENDPOINT" in err.value.hint


def test_an_existing_different_file_is_never_replaced(server, models):
    """A file already at the target path with other bytes is refused, and stays as it was."""
    target = models / REPO / FILE
    target.parent.mkdir(parents=True)
    target.write_bytes(b"mine")
    with pytest.raises(KineticError, match="exists but is not"):
        pull(REPO)
    assert target.read_bytes() == b"mine"


def test_pull_command_line(server, models, capsys):
    """`kinetic pull org/repo --memory GIB` exits 0 and prints the name to run the model by."""
    assert main(["pull", "test-org/multi-GGUF", "--memory", "0.003"]) == 0
    assert "kinetic run test-org/multi-GGUF:Q4_K_M" in capsys.readouterr().out


# -- the choice rule alone -------------------------------------------------------------------------------

def candidate(quant: str, size: int) -> hf_pull.Candidate:
    return hf_pull.Candidate(f"m-{quant}", quant, (hf_pull.RepoFile(f"m-{quant}.gguf", size, "0" * 64, None),))


@pytest.mark.parametrize(("memory", "expected"), [
    (10_000, "Q8_0"), (700, "Q6_K"), (130, "Q4_K_M"), (10, "Q4_K_M"),  # none fits: Q4_K_M at least
])
def test_choose_takes_the_largest_of_the_ladder_that_fits(memory, expected):
    """Q4_K_M < Q5_K_M < Q6_K < Q8_0: the largest whose size plus a fifth fits; Q4_K_M when none does."""
    models = [candidate(q, s) for q, s in (("Q4_K_M", 100), ("Q5_K_M", 400), ("Q6_K", 500), ("Q8_0", 800),
                                          ("F16", 1600))]
    assert hf_pull.choose(models, quant=None, budget=lambda: (memory, "test"))[0].quant == expected


def test_choose_without_the_ladder_takes_the_largest_that_fits_else_the_smallest():
    """A repository with none of the four: the largest model that fits, else the smallest."""
    models = [candidate(q, s) for q, s in (("IQ2_XS", 100), ("IQ3_M", 200), ("BF16", 900))]
    assert hf_pull.choose(models, quant=None, budget=lambda: (300, "t"))[0].quant == "IQ3_M"
    assert hf_pull.choose(models, quant=None, budget=lambda: (50, "t"))[0].quant == "IQ2_XS"


def test_matches_checks_the_git_blob_id_of_a_small_file(tmp_path):
    """A file outside LFS is checked against its git blob id, so one changed byte is caught."""
    data = b"# readme\n"
    blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
    f = tmp_path / "README.md"
    f.write_bytes(data)
    assert hf_pull.matches(f, hf_pull.RepoFile("README.md", len(data), None, blob))
    f.write_bytes(b"# reaDme\n")
    assert not hf_pull.matches(f, hf_pull.RepoFile("README.md", len(data), None, blob))


def test_file_and_dir_options(server, models, tmp_path, capsys):
    """`--file` takes the model holding that file; `--dir` puts it there (not in the models folder) and
    prints its path to run it by."""
    elsewhere = tmp_path / "elsewhere"
    assert main(["pull", "test-org/multi-GGUF", "--file", "m-F16.gguf", "--dir", str(elsewhere), "--no-mmproj"]) == 0
    target = elsewhere / "test-org" / "multi-GGUF" / "m-F16.gguf"
    assert target.is_file() and not (models / "test-org").exists()
    assert f"kinetic run {target}" in capsys.readouterr().out


def test_a_file_the_repository_lacks_is_refused(server):
    """--file naming no model of the repository is refused, listing its models."""
    with pytest.raises(KineticError, match="no GGUF model file mmproj-SmolLM2-f16.gguf"):
        pull(REPO, file="mmproj-SmolLM2-f16.gguf")


def test_one_pull_of_a_repository_at_a_time(server, models):
    """While another pull of the repository holds its staging lock, a second is refused at once and
    touches nothing."""
    from filelock import FileLock

    staging = models / ".pull" / REPO.replace("/", "--")
    staging.mkdir(parents=True)
    with FileLock(staging / ".lock"):
        with pytest.raises(KineticError, match="another `kinetic pull` of .* is running"):
            pull(REPO)
    assert file_requests(server) == [] and not (models / REPO / FILE).exists()
