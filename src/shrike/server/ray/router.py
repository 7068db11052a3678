"""Ray Serve request router: a shared prompt prefix goes back to the replica that has it cached.

The ingress passes each request's prefix as cumulative block hashes (see prefix.py): hash i
stands for the whole prompt text up to the end of block i, so two prompts agree on hash i
exactly when they share their first i+1 blocks. The router remembers which replica last
received each hash and sends a request to the replica holding its longest known prefix,
unless that replica has `imbalance_threshold` more requests in flight than the least loaded
one; everything else goes to the least loaded replicas (Ray then probes their queues).

Loads are counted here, from when a request is routed until Ray reports it completed, so they
cost no round trip. With several ingress replicas each counts only its own traffic, which is a
fair sample of it.

Both routers here also publish the replica set (for the ingress's /metrics) and honour calls
addressed to one replica (`replica=` keyword): `PowerOfTwoRouter` is Ray's default policy with
just that added, for comparison.
"""
from __future__ import annotations

import random
from collections import OrderedDict
from typing import Optional

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from shrike.server.ray import routing_state

# Prefix hashes remembered per router (oldest forgotten first): ~100 bytes each.
MAX_REMEMBERED_BLOCKS = 200_000
DEFAULT_IMBALANCE_THRESHOLD = 4


class _ShrikeRouting:
    """What the ingress needs from any router: the live replicas, and calls aimed at one of them."""

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._publish()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._publish()

    def _publish(self) -> None:
        routing_state.live_replicas[self._deployment_id.name] = sorted(r.unique_id for r in self.curr_replicas)

    @staticmethod
    def _addressed(candidates: list[RunningReplica], pending_request: Optional[PendingRequest]
                   ) -> list[list[RunningReplica]] | None:
        target = pending_request.kwargs.get("replica") if pending_request is not None else None
        if target is None:
            return None
        return [[r for r in candidates if r.replica_id.unique_id == target]]


class PowerOfTwoRouter(_ShrikeRouting, PowerOfTwoChoicesRequestRouter):
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> list[list[RunningReplica]]:
        addressed = self._addressed(candidate_replicas, pending_request)
        if addressed is not None:
            return addressed
        return await super().choose_replicas(candidate_replicas, pending_request)


class PrefixAffinityRouter(_ShrikeRouting, RequestRouter):
    def initialize_state(self, imbalance_threshold: int = DEFAULT_IMBALANCE_THRESHOLD,
                         max_remembered_blocks: int = MAX_REMEMBERED_BLOCKS) -> None:
        self.imbalance_threshold = imbalance_threshold
        self.max_remembered_blocks = max_remembered_blocks
        self.owner_of_block: OrderedDict[int, ReplicaID] = OrderedDict()
        self.in_flight: dict[ReplicaID, int] = {}
        self.replica_of_request: dict[str, ReplicaID] = {}
        self.watched_futures: set = set()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.in_flight.pop(replica_id, None)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is None:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        addressed = self._addressed(candidate_replicas, pending_request)
        if addressed is not None:  # a call meant for one replica (its /metrics)
            return addressed
        kwargs = pending_request.kwargs
        self._watch(pending_request)
        by_load = sorted(candidate_replicas, key=lambda r: (self.in_flight.get(r.replica_id, 0), random.random()))
        least_load = self.in_flight.get(by_load[0].replica_id, 0)
        owner = self._owner(kwargs.get("prefix") or (), {r.replica_id: r for r in candidate_replicas})
        if owner is not None:
            if self.in_flight.get(owner.replica_id, 0) - least_load < self.imbalance_threshold:
                routing_state.count_decision("prefix")
                # Should the owner turn out full, Ray falls back to the next rank.
                rest = [r for r in by_load[:2] if r is not owner]
                return [[owner], rest] if rest else [[owner]]
            routing_state.count_decision("prefix_overridden_by_load")
        else:
            routing_state.count_decision("least_loaded")
        return [by_load[:2]]

    def _owner(self, prefix: tuple[int, ...], candidates: dict[ReplicaID, RunningReplica]) -> RunningReplica | None:
        for block_hash in reversed(prefix):
            owner = candidates.get(self.owner_of_block.get(block_hash))
            if owner is not None:
                return owner
        return None

    def _watch(self, pending_request: PendingRequest) -> None:
        """Count the request and record its prefix once Ray has settled on a replica for it.

        Ray tells routers the outcome through the request's future (on_request_routed is only
        called under strict max_ongoing_requests), and may ask for choices more than once.
        """
        future = pending_request.future
        if future in self.watched_futures:
            return
        self.watched_futures.add(future)

        def routed(done) -> None:
            self.watched_futures.discard(done)
            if done.cancelled() or done.exception() is not None:
                return
            replica_id = done.result().replica_id
            self.in_flight[replica_id] = self.in_flight.get(replica_id, 0) + 1
            self.replica_of_request[pending_request.metadata.internal_request_id] = replica_id
            for block_hash in pending_request.kwargs.get("prefix") or ():
                self.owner_of_block[block_hash] = replica_id
                self.owner_of_block.move_to_end(block_hash)
            while len(self.owner_of_block) > self.max_remembered_blocks:
                self.owner_of_block.popitem(last=False)

        future.add_done_callback(routed)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        if self.replica_of_request.pop(internal_request_id, None) is not None and replica_id in self.in_flight:
            self.in_flight[replica_id] = max(0, self.in_flight[replica_id] - 1)
