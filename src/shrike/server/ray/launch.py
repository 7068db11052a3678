"""`shrike serve --ray`: deploy the engine replicas and the ingress on a Ray cluster, serve until
SIGTERM or SIGINT, then drain and tear down (the cluster too, if this command started it)."""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import socket
import threading
from pathlib import Path

from shrike import __version__
from shrike.default_model import DEFAULT_GGUF_FILE, resolve_model
from shrike.errors import ConfigError
from shrike.engine.config import engine_config_from_args
from shrike.server.args import add_serve_arguments
from shrike.server.ray.args import add_ray_arguments, check_ray_arguments, ray_address
from shrike.server.serve import listen

logger = logging.getLogger("shrike.server.ray")

APP_NAME = "shrike"
ENGINE_DEPLOYMENT = "ShrikeReplica"
INGRESS_DEPLOYMENT = "ShrikeIngress"
ROUTERS = {"prefix-affinity": "shrike.server.ray.router.PrefixAffinityRouter",
           "power-of-two": "shrike.server.ray.router.PowerOfTwoRouter"}
# Ray notices a dead replica at once; this is for one that hangs.
HEALTH_CHECK_PERIOD_SECONDS = 2.0
# Requests and responses pass through Ray's object store only in small pieces.
LOCAL_OBJECT_STORE_BYTES = 256 << 20
CONNECT_TIMEOUT_SECONDS = 5.0
# A resource only the head node has (ray._common.constants.HEAD_NODE_RESOURCE_NAME).
HEAD_NODE_RESOURCE = "node:__internal_head__"


def ray_serve_main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check_ray_arguments(args)
    address = ray_address(args)
    if address is not None:
        _check_reachable(address)
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ConfigError("--ray needs Ray Serve: pip install 'shrike[ray]'") from None
    _resolve_model(args)
    if address is None:
        # The proxy will listen on this machine: a taken port should fail now, not inside Ray.
        listen(args.host, args.port).close()
    if address is None:
        # A cluster started on the user's behalf does not report usage to Ray's servers unless asked to.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    local = {} if address else {"object_store_memory": LOCAL_OBJECT_STORE_BYTES}
    cluster = ray.init(address=address or "local", include_dashboard=False, logging_level=logging.WARNING,
                       configure_logging=False, **local)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        try:
            # Ray's access log would add a line per request and per replica call; Shrike logs throughput.
            serve.run(build_application(args, args.request_router or "prefix-affinity"), name=APP_NAME,
                      route_prefix="/", logging_config={"enable_access_log": False})
        except RuntimeError as e:
            raise ConfigError(f"the deployment failed: {' '.join(str(e).split())[:500]}") from None
        logger.info(_startup_line(args, address, cluster.address_info.get("gcs_address", "?")))
        _wait_for_stop_signal()
        logger.info("stopping: in-flight requests get up to %g s to finish", args.shutdown_timeout)
        serve.delete(APP_NAME)
        if address is None:
            serve.shutdown()
    finally:
        ray.shutdown()
    logger.info("stopped")
    return 0


def build_application(args: argparse.Namespace, router: str = "prefix-affinity"):
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from shrike.server.ray.ingress import ShrikeIngress
    from shrike.server.ray.replica import ShrikeReplica

    cpus = args.cpus_per_replica or 1
    capacity = args.max_num_seqs + args.max_queue_len  # what one `shrike serve` holds
    if args.min_replicas is not None or args.max_replicas is not None:
        low = args.min_replicas if args.min_replicas is not None else 1
        high = args.max_replicas if args.max_replicas is not None else max(low, 1)
        scaling = {"autoscaling_config": {
            "min_replicas": low, "max_replicas": high, "initial_replicas": max(low, 1),
            "target_ongoing_requests": args.target_ongoing_requests or max(args.max_num_seqs / 2, 1)}}
    else:
        high = args.num_replicas or 1
        scaling = {"num_replicas": high}
    engine = serve.deployment(
        ShrikeReplica, name=ENGINE_DEPLOYMENT, ray_actor_options={"num_cpus": cpus},
        # Each replica holds what one `shrike serve` holds; once all are full, --max-queue-len more
        # wait at the ingress and the rest get 503.
        max_ongoing_requests=capacity, max_queued_requests=args.max_queue_len,
        request_router_config=RequestRouterConfig(request_router_class=ROUTERS[router]),
        health_check_period_s=HEALTH_CHECK_PERIOD_SECONDS, graceful_shutdown_timeout_s=args.shutdown_timeout,
        graceful_shutdown_wait_loop_s=0.5, max_constructor_retry_count=3, **scaling)
    ingress = serve.deployment(
        serve.ingress()(ShrikeIngress), name=INGRESS_DEPLOYMENT, num_replicas=1,
        # It only relays bytes: it must not take a core from the engines. On the head node, which holds the
        # cluster's state (GCS) and Serve's controller: losing any other node then never takes the HTTP path down.
        ray_actor_options={"num_cpus": 0, "resources": {HEAD_NODE_RESOURCE: 0.001}},
        max_ongoing_requests=high * capacity + args.max_queue_len + 64,
        graceful_shutdown_timeout_s=args.shutdown_timeout + 5)
    serve_args = {**vars(args), "cpus_per_replica": cpus}
    return ingress.bind(engine.bind(serve_args), ENGINE_DEPLOYMENT, args.api_key)


def app_builder(config: dict):
    """The application from `shrike serve` flags, for Serve config files and KubeRay's RayService:

        import_path: shrike.server.ray.launch:app_builder
        args: {flags: "/models/qwen3 --num-replicas 2 --cpus-per-replica 4"}

    Serve listens where the cluster's Serve config says; --host/--port/--ray-address do not apply.
    """
    parser = argparse.ArgumentParser(prog="shrike serve")
    add_serve_arguments(parser)
    add_ray_arguments(parser)
    args = parser.parse_args(["--ray", *shlex.split(str(config.get("flags", "")))])
    engine_config_from_args(args)
    check_ray_arguments(args)
    if args.model is not None:
        args.served_model_name = args.served_model_name or [args.model]
    return build_application(args, args.request_router or "prefix-affinity")


def _resolve_model(args: argparse.Namespace) -> None:
    if args.model is None:
        # Convert the default model once here rather than in every replica of this machine at once.
        resolve_model(None, weights=args.gguf_weights != "native")
        args.served_model_name = args.served_model_name or [DEFAULT_GGUF_FILE.split(".")[0]]
        return
    path = Path(args.model).expanduser()
    if not path.exists():
        raise ConfigError(f"{args.model} does not exist (with --ray it must exist at this path on every node)")
    # Replicas do not run in this directory.
    args.served_model_name = args.served_model_name or [args.model]
    args.model = str(path.resolve())


def _check_reachable(address: str) -> None:
    """ray.init retries an unreachable address for minutes; a wrong one deserves one line now."""
    host, _, port = address.rpartition(":")
    if "://" in address or not port.isdigit():
        return  # "auto", ray:// client addresses: Ray resolves those itself
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_SECONDS).close()
    except OSError as e:
        raise ConfigError(f"cannot reach the Ray cluster at {address} ({e.strerror or e}); start its head with "
                          "`ray start --head` or fix --ray-address / RAY_ADDRESS") from None


def _wait_for_stop_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.set())
    while not stop.wait(1.0):
        pass


def _startup_line(args: argparse.Namespace, address: str | None, gcs_address: str) -> str:
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    if args.num_replicas is None and (args.min_replicas is not None or args.max_replicas is not None):
        replicas = f"{args.min_replicas or 0}-{args.max_replicas or 'n'} replicas (autoscaling)"
    else:
        replicas = f"{args.num_replicas or 1} replica(s)"
    return (f"Shrike {__version__} serving {args.served_model_name[0]!r} at http://{shown_host}:{args.port}/v1 on "
            f"Ray ({'cluster' if address else 'local cluster'} {gcs_address}): {replicas} x "
            f"{args.cpus_per_replica or 1} CPU, {args.request_router or 'prefix-affinity'} routing, "
            f"API key {'required' if args.api_key else 'off'}")
