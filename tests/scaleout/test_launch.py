"""`kinetic serve --replicas` and kinetic.deploy:app: what they refuse before Ray starts."""

from __future__ import annotations

import pytest

from kinetic.errors import KineticError
from kinetic.scaleout.launch import replica_threads


def test_threads_split_the_cores_between_replicas():
    """Without -t each replica gets cores // replicas threads (at least 1); -t is taken as given."""
    assert replica_threads(2, None, cores=16) == 8
    assert replica_threads(3, None, cores=2) == 1
    assert replica_threads(2, 5, cores=2) == 5


@pytest.mark.parametrize("replicas, threads", [(0, None), (-1, None), (2, 0)])
def test_bad_counts_are_refused(replicas, threads):
    """--replicas and -t must be positive: a KineticError says so."""
    with pytest.raises(KineticError):
        replica_threads(replicas, threads, cores=4)


def test_deploy_refuses_unknown_arguments_and_a_missing_model():
    """serve run kinetic.deploy:app with a misspelt or missing argument gets a clear KineticError."""
    from kinetic.deploy import app

    with pytest.raises(KineticError, match="replica"):
        app({"model": "m", "replica": "2"})
    with pytest.raises(KineticError, match="model= is missing"):
        app({"replicas": "2"})
    with pytest.raises(KineticError, match="whole number"):
        app({"model": "m", "replicas": "two"})


def test_serve_parses_replicas():
    """`kinetic serve MODEL --replicas 2 -t 1` reaches serve's run with replicas=2 and threads=1."""
    from kinetic.cli.main import build_parser

    args = build_parser().parse_args(["serve", "model.gguf", "--replicas", "2", "-t", "1"])
    assert (args.replicas, args.threads) == (2, 1)


def test_deploy_builds_one_ingress_over_the_replicas():
    """kinetic.deploy:app with replicas=3 threads=2 binds 3 EngineReplicas of 2 CPUs under the Ingress."""
    pytest.importorskip("ray")
    from ray.serve import Application

    from kinetic.deploy import app

    application = app({"model": "model.gguf", "replicas": "3", "threads": "2", "flags": "-c 512"})
    assert isinstance(application, Application)
    engines = application._bound_deployment.init_args[0]
    assert [e._bound_deployment.name for e in engines] == ["replica-0", "replica-1", "replica-2"]
    assert all(e._bound_deployment.ray_actor_options["num_cpus"] == 2 for e in engines)
    assert engines[0]._bound_deployment.init_args[0].ctx_size == 512
