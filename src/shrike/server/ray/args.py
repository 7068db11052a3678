"""`shrike serve --ray` flags: where the cluster is, and how many replicas of what size."""
from __future__ import annotations

import argparse
import os

from shrike.errors import ConfigError
from shrike.server.args import _int_at_least, _positive_float

RAY_FLAGS = ("ray_address", "num_replicas", "min_replicas", "max_replicas", "target_ongoing_requests",
             "cpus_per_replica", "request_router")


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Ray cluster", "Serve on a Ray cluster through Ray Serve (pip install 'shrike[ray]'); see docs/cluster.md.")
    group.add_argument("--ray", action="store_true",
                       help="run replicas of the engine on a Ray cluster behind one HTTP port, with prefix-aware "
                            "routing; every other flag keeps its meaning, per replica")
    group.add_argument("--ray-address", default=None, metavar="ADDRESS",
                       help="cluster to join, e.g. 10.0.0.1:6379 (default: $RAY_ADDRESS, else a local cluster "
                            "started and stopped with this command)")
    group.add_argument("--num-replicas", type=_int_at_least(1), default=None,
                       help="engine replicas (default: 1; or autoscale with --min-replicas/--max-replicas)")
    group.add_argument("--min-replicas", type=_int_at_least(0), default=None, help="autoscaling: fewest replicas")
    group.add_argument("--max-replicas", type=_int_at_least(1), default=None, help="autoscaling: most replicas")
    group.add_argument("--target-ongoing-requests", type=_positive_float, default=None, metavar="N",
                       help="autoscaling: requests per replica to aim for (default: half of --max-num-seqs)")
    group.add_argument("--cpus-per-replica", type=_int_at_least(1), default=None, metavar="C",
                       help="cores each replica reserves from Ray and computes on (default: 1)")
    group.add_argument("--request-router", default=None, choices=["prefix-affinity", "power-of-two"],
                       help="prefix-affinity (default): a shared prompt prefix goes to the replica that has it "
                            "cached unless that one is much busier; power-of-two: Ray's default, load only")


def check_ray_arguments(args: argparse.Namespace) -> None:
    """One-line errors for combinations that cannot mean anything."""
    given = [f"--{name.replace('_', '-')}" for name in RAY_FLAGS if getattr(args, name) is not None]
    if not args.ray:
        if given:
            raise ConfigError(f"{given[0]} needs --ray")
        return
    if args.cpu_bind is not None:
        raise ConfigError("--cpu-bind does not apply with --ray: each replica computes on the cores Ray gives it; "
                          "size them with --cpus-per-replica")
    from shrike.server import connection  # here: uvicorn is no import of every other command
    for name, default in (("header_timeout", connection.DEFAULT_HEADER_TIMEOUT_SECONDS),
                          ("body_timeout", connection.DEFAULT_BODY_TIMEOUT_SECONDS),
                          ("max_headers", connection.DEFAULT_MAX_HEADERS),
                          ("max_header_bytes", connection.DEFAULT_MAX_HEADER_BYTES)):
        if getattr(args, name, default) != default:
            raise ConfigError(f"--{name.replace('_', '-')} does not apply with --ray: Ray Serve's HTTP proxy takes "
                              "the connections (put a reverse proxy in front of it for such limits)")
    autoscaling = args.min_replicas is not None or args.max_replicas is not None
    if autoscaling and args.num_replicas is not None:
        raise ConfigError("give either --num-replicas or --min-replicas/--max-replicas (autoscaling), not both")
    if args.target_ongoing_requests is not None and not autoscaling:
        raise ConfigError("--target-ongoing-requests needs --min-replicas and/or --max-replicas")
    if args.min_replicas is not None and args.max_replicas is not None and args.min_replicas > args.max_replicas:
        raise ConfigError(f"--min-replicas {args.min_replicas} is above --max-replicas {args.max_replicas}")
    cpus = args.cpus_per_replica or 1
    if args.cpu_threads is not None and not 1 <= args.cpu_threads <= cpus:
        raise ConfigError(f"--cpu-threads {args.cpu_threads} must be between 1 and --cpus-per-replica {cpus}")


def ray_address(args: argparse.Namespace) -> str | None:
    return args.ray_address or os.environ.get("RAY_ADDRESS") or None
