"""Which cores a replica computes on.

Ray reserves CPUs for an actor only in its bookkeeping: it sets no CPU affinity (a replica's
mask is the whole machine). Two replicas of one CPU each would then both spread their threads
over every core and slow each other down, so Shrike pins them itself: the replica that Ray
ranks k-th on its node takes the k-th group of `cpus` cores out of the node's default cores.
"""
from __future__ import annotations

import logging

from shrike.platform.topology import read_topology

logger = logging.getLogger(__name__)


def replica_cores(local_rank: int, cpus: int) -> list[int]:
    cores = sorted(read_topology().default_cores)  # the fastest class of usable cores
    groups = len(cores) // cpus
    if groups == 0:
        logger.warning("this node has %d usable cores, fewer than --cpus-per-replica %d: using all of them",
                       len(cores), cpus)
        return cores
    if local_rank >= groups:
        logger.warning("replica %d on this node shares cores with replica %d: the node has %d groups of %d cores; "
                       "give Ray fewer CPUs (ray start --num-cpus) or lower --num-replicas",
                       local_rank, local_rank % groups, groups, cpus)
    group = local_rank % groups
    return cores[group * cpus:(group + 1) * cpus]
