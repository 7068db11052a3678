"""Shrike on a Ray cluster: engine replicas behind one ingress, routed by prompt prefix (docs/cluster.md).

Only launch.py's caller may import this package without Ray installed: args.py needs no Ray.
"""
