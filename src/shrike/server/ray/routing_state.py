"""What the router in this process knows that the ingress needs: the live replicas, to scrape.

It lives apart from router.py because Ray ships the router class by value (cloudpickle), which
makes that module's globals private copies; this module is imported by reference everywhere.
"""
from __future__ import annotations

# Replica ids (unique_id) of each engine deployment, as the router last saw them.
live_replicas: dict[str, list[str]] = {}
