"""Scale-out: many Kinetic engines behind one endpoint on Ray Serve (docs/scale-out.md).

    routing.py    the consistent-hashing ring and the pick (affinity, overload, down replicas); no Ray
    affinity.py   a request body's affinity key (a conversation's opening, a prompt's first bytes)
    metrics.py    the replicas' /metrics texts merged into the cluster's
    ray_serve.py  the Ray Serve deployments: EngineReplica (kinetic serve's app) and the Ingress
    launch.py     `kinetic serve MODEL --replicas N`
kinetic/deploy.py is the application `serve run kinetic.deploy:app` deploys on a running cluster.
Only ray_serve.py, launch.py and deploy.py import Ray (the `scale` extra).
"""
