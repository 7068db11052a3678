"""Time to first token against vLLM's CPU build, measured by vLLM's own client (also ``shrike bench vllm``).

`vllm bench serve` (random dataset: 256 prompt tokens, 64 output tokens, `--ignore-eos`, 8 requests in
flight) is run against `vllm serve` and `shrike serve` on the same checkpoint (default: the bf16
SmolLM2-135M directory Shrike converts its default model into), both with 2 threads.

Both servers are started once and stay up (vLLM takes minutes to start: it compiles its graphs); the
client then alternates between them, A B B A ..., so drift of the machine hits both alike. Each run
uses a new random seed, the same for both engines, so no prefix cache serves a prompt seen before.
Before every run the harness waits until processes other than the two servers use few cores.
Reported: medians over the runs of each run's median TTFT (and mean, p99, TPOT, output tokens/s), and
Shrike's median TTFT as a fraction of vLLM's. Results: benchmarks/results/vs-vllm-MODEL-DATE.json.

    python benchmarks/bench_vs_vllm.py                         # bf16 SmolLM2, 3 runs per engine
    python benchmarks/bench_vs_vllm.py --shrike-model /work/peers/models/smollm2-135m-w4a8-g64

vLLM comes from `bash benchmarks/build_peers.sh --vllm` (its own venv, outside the repository).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import (  # noqa: E402  (benchmarks/ is not a package)
    RESULTS_DIR, SERVED_NAME, CpuUsage, EngineSetup, PeerPaths, RunningServer, default_peers_dir, free_port,
    machine_facts, process_tree_cpu_seconds, shrike_setup, vllm_setup,
)

METRICS = ("median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms",
           "output_throughput", "total_token_throughput")
CLIENT_TIMEOUT_S = 900


def vllm_peer(peers_dir: Path, vllm_python: Path | None) -> PeerPaths:
    python = vllm_python or peers_dir / "vllm-venv" / "bin" / "python"
    return PeerPaths(llama_server=Path(), llama_quantize=Path(), llama_cpp_python=Path(), vllm_python=python,
                     work_dir=peers_dir / "models")


def client_command(vllm_bin: Path, server: RunningServer, tokenizer_dir: Path, args: argparse.Namespace,
                   seed: int, result_path: Path) -> list[str]:
    return [str(vllm_bin), "bench", "serve", "--backend", "openai", "--base-url", server.base_url,
            "--endpoint", "/v1/completions", "--model", SERVED_NAME, "--tokenizer", str(tokenizer_dir),
            "--dataset-name", "random", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
            "--max-concurrency", str(args.concurrency), "--ignore-eos", "--seed", str(seed), "--num-warmups", "2",
            "--temperature", "0",
            "--save-result", "--result-dir", str(result_path.parent), "--result-filename", result_path.name,
            "--disable-tqdm"]


def wait_quiet(servers: list[RunningServer], max_cores: float, timeout_s: float) -> float:
    """Cores used by everything but the servers and this harness, once it is at most max_cores (or timed out)."""
    deadline = time.perf_counter() + timeout_s
    while True:
        window = OthersWindow(servers)
        time.sleep(1.0)
        busy = window.cores()
        if busy <= max_cores or time.perf_counter() > deadline:
            return busy
        print(f"  waiting: other processes keep {busy:.2f} cores busy", flush=True)
        time.sleep(4.0)


class OthersWindow:
    """From its creation on: cores kept busy by processes other than the servers' trees, this harness and
    the client runs it waited for."""

    def __init__(self, servers: list[RunningServer]):
        self.servers = servers
        self.start = CpuUsage.now()
        self.servers_start = self._servers_cpu()
        self.clients_start = _finished_children_cpu()

    def _servers_cpu(self) -> float:
        return sum(process_tree_cpu_seconds(s.process.pid) for s in self.servers)

    def cores(self) -> float:
        ours = self._servers_cpu() - self.servers_start + _finished_children_cpu() - self.clients_start
        later = CpuUsage.now()
        busy = later.machine_busy - self.start.machine_busy - (later.this_process - self.start.this_process)
        return max(0.0, busy - ours) / (later.wall - self.start.wall)


def _finished_children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_client(vllm_bin: Path, server: RunningServer, servers: list[RunningServer], tokenizer_dir: Path,
               args: argparse.Namespace, seed: int, result_dir: Path, log_dir: Path) -> dict:
    result_path = result_dir / f"{server.setup.engine}-seed{seed}.json"
    log_path = log_dir / f"client-{server.setup.engine}-seed{seed}.log"
    window = OthersWindow(servers)
    with log_path.open("wb") as log:
        completed = subprocess.run(client_command(vllm_bin, server, tokenizer_dir, args, seed, result_path),
                                   stdout=log, stderr=subprocess.STDOUT, timeout=CLIENT_TIMEOUT_S)
    others = window.cores()
    if completed.returncode != 0 or not result_path.is_file():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"vllm bench serve against {server.setup.label} failed ({completed.returncode}); "
                           f"log: {log_path}\n{tail}")
    raw = json.loads(result_path.read_text())
    run = {name: raw.get(name) for name in METRICS}
    run.update(seed=seed, completed=raw.get("completed"), total_input_tokens=raw.get("total_input_tokens"),
               total_output_tokens=raw.get("total_output_tokens"), duration_s=raw.get("duration"),
               other_processes_cores_during=round(others, 3))
    return run


def checkpoint_kind(model_dir: Path) -> str:
    """bf16, or the quantized checkpoint's directory name (which names its scheme)."""
    config = json.loads((model_dir / "config.json").read_text())
    return model_dir.name if "quantization_config" in config else "bf16"


def summarize(runs: list[dict]) -> dict:
    summary = {name: statistics.median(r[name] for r in runs) for name in METRICS if all(r[name] is not None
                                                                                           for r in runs)}
    summary["runs"] = runs
    return summary


def print_table(results: dict) -> None:
    print("| engine | median TTFT ms | mean TTFT ms | p99 TTFT ms | median TPOT ms | output tok/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, s in results["engines"].items():
        print(f"| {label} | {s['median_ttft_ms']:.0f} | {s['mean_ttft_ms']:.0f} | {s['p99_ttft_ms']:.0f} | "
              f"{s['median_tpot_ms']:.1f} | {s['output_throughput']:.1f} |")
    if "shrike_over_vllm_median_ttft" in results:
        print(f"Shrike median TTFT / vLLM's: {results['shrike_over_vllm_median_ttft']:.2f} (target <= 0.8)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench_vs_vllm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None,
                        help="checkpoint both engines serve (default: Shrike's bf16 conversion of SmolLM2-135M)")
    parser.add_argument("--shrike-model", type=Path, default=None,
                        help="a different checkpoint for Shrike only, e.g. its W4A8 quantization (default: --model)")
    parser.add_argument("--runs", type=int, default=3, help="client runs per engine (default: 3)")
    parser.add_argument("--num-prompts", type=int, default=32, help="requests per client run (default: 32)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (default: 8)")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="threads each engine computes with (default: 2)")
    parser.add_argument("--quiet-cores", type=float, default=0.3,
                        help="before each run wait until other processes use at most this many cores")
    parser.add_argument("--quiet-timeout", type=float, default=60, help="seconds to wait for that (default: 60)")
    parser.add_argument("--peers-dir", type=Path, default=default_peers_dir())
    parser.add_argument("--vllm-python", type=Path, default=None, help="default: PEERS/vllm-venv/bin/python")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: benchmarks/results/...)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args, argv)
    finally:
        for server in list(RunningServer.live):
            server.stop()


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    if args.model is None:
        from shrike.default_model import default_model_dir
        args.model = default_model_dir()
    shrike_model = args.shrike_model or args.model
    peers = vllm_peer(args.peers_dir, args.vllm_python)
    vllm_bin = peers.vllm_python.parent / "vllm"
    if not vllm_bin.is_file():
        raise SystemExit(f"{vllm_bin} not found: build vLLM with `bash benchmarks/build_peers.sh --vllm`")
    log_dir = Path(tempfile.mkdtemp(prefix="bench-logs-", dir=peers.work_dir if peers.work_dir.is_dir() else None))
    setups: list[EngineSetup] = [shrike_setup(shrike_model, checkpoint_kind(shrike_model), args.threads),
                                 dataclasses.replace(vllm_setup(peers, args.model, args.threads),
                                                     label=f"vllm {checkpoint_kind(args.model)}")]
    started = datetime.now(timezone.utc)
    servers, ready_s = [], {}
    for setup in setups:  # one at a time: each start is timed alone
        server = RunningServer(setup, free_port(), log_dir / f"{setup.engine}.log")
        servers.append(server)
        ready_s[setup.label] = round(asyncio.run(_ready(server)), 1)
        print(f"{setup.label} ready after {ready_s[setup.label]:.1f} s", flush=True)
    runs: dict[str, list[dict]] = {s.setup.label: [] for s in servers}
    results = {"model": str(args.model), "shrike_model": str(shrike_model), "threads": args.threads,
               "workload": {"input_len": args.input_len, "output_len": args.output_len,
                            "num_prompts": args.num_prompts, "concurrency": args.concurrency, "runs": args.runs},
               "command": [sys.argv[0], *(argv if argv is not None else sys.argv[1:])],
               "started_utc": started.isoformat(timespec="seconds"), "machine": machine_facts(),
               "server_logs": str(log_dir), "start_to_ready_s": ready_s}
    json_path = args.out or RESULTS_DIR / f"vs-vllm-{args.model.name.split('.')[0].lower()}-{started:%Y%m%d-%H%M}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    for index in range(args.runs):
        seed = 1000 + index
        order = servers if index % 2 == 0 else servers[::-1]
        for server in order:
            quiet = wait_quiet(servers, args.quiet_cores, args.quiet_timeout)
            run_result = run_client(vllm_bin, server, servers, args.model, args, seed, log_dir, log_dir)
            run_result["other_processes_cores_before"] = round(quiet, 3)
            runs[server.setup.label].append(run_result)
            print(f"run {index + 1}/{args.runs} {server.setup.label}: median TTFT {run_result['median_ttft_ms']:.0f} ms, "
                  f"TPOT {run_result['median_tpot_ms']:.1f} ms, {run_result['completed']} completed, "
                  f"others {quiet:.2f}->{run_result['other_processes_cores_during']:.2f} cores", flush=True)
            # After every run, so a run cut short keeps what it measured
            write_results(results, runs, servers, json_path)
    print_table(results)
    print(f"wrote {json_path}")
    return 0


def write_results(results: dict, runs: dict[str, list[dict]], servers: list[RunningServer], json_path: Path) -> None:
    results["engines"] = {label: summarize(label_runs) for label, label_runs in runs.items() if label_runs}
    shrike_label, vllm_label = servers[0].setup.label, servers[1].setup.label
    if shrike_label in results["engines"] and vllm_label in results["engines"]:
        results["shrike_over_vllm_median_ttft"] = (results["engines"][shrike_label]["median_ttft_ms"]
                                                   / results["engines"][vllm_label]["median_ttft_ms"])
    json_path.write_text(json.dumps(results, indent=1))


async def _ready(server: RunningServer) -> float:
    import httpx
    async with httpx.AsyncClient() as client:
        return await server.wait_ready(client)


if __name__ == "__main__":
    sys.exit(main())
