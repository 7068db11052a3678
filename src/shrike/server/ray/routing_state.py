"""What the router in this process knows that the ingress needs: live replicas, routing counts.

It lives apart from router.py because Ray ships the router class by value (cloudpickle), which
makes that module's globals private copies; this module is imported by reference everywhere.
"""
from __future__ import annotations

# Replica ids (unique_id) of each engine deployment, as the router last saw them.
live_replicas: dict[str, list[str]] = {}

# How the prefix-affinity router decided, summed over its deployments: exported on /metrics.
decisions: dict[str, int] = {"prefix": 0, "prefix_overridden_by_load": 0, "least_loaded": 0}


def count_decision(kind: str) -> None:
    decisions[kind] += 1


def render_decisions() -> str:
    name = "shrike:ray_routing_decisions_total"
    return "\n".join([f"# HELP {name} Requests routed by the prefix-affinity router, by how it decided.",
                      f"# TYPE {name} counter",
                      *(f'{name}{{decision="{kind}"}} {count}' for kind, count in decisions.items())]) + "\n"
