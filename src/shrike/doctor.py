"""`shrike doctor`: what Shrike detects on this machine and what it would use there.

Every section is gathered even when another fails; whatever would stop Shrike from running is
listed under "problems", each as one line, and makes the exit status non-zero.
"""

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from shrike.engine.config import EngineConfig, add_engine_arguments, engine_config_from_args
from shrike.errors import ConfigError
from shrike.layers.kv_dtypes import KV_ELEMENTS
from shrike.model.footprint import Footprint, checkpoint_tensor_bytes, footprint
from shrike.platform.cpulist import format_cpu_list
from shrike.platform.memory import GIB, MemoryInfo, plan_kv_cache, read_memory
from shrike.platform.topology import Topology, read_topology, resolve_binding



def _kernel_section(problems: list[str]) -> dict[str, Any]:
    try:
        from shrike import kernels
    except ImportError as error:
        problems.append(f"the kernel extension shrike._C does not load ({error}); reinstall Shrike")
        return {"error": str(error)}
    return {**kernels.describe(), "shrike_isa": os.environ.get("SHRIKE_ISA")}


def _topology_section(topology: Topology, config: EngineConfig, problems: list[str]) -> dict[str, Any]:
    basis, _ = topology.speed_classes(topology.usable)
    try:
        binding = resolve_binding(config.cpu_threads, config.cpu_bind, topology)
    except ConfigError as error:
        problems.append(str(error))
        binding = []
    return {
        "cores": [
            {
                "core": core.id,
                "type": core.kind.label if core.kind else None,
                "efficiency_core": core.kind.efficiency if core.kind else None,
                "capacity": core.capacity,
                "max_freq_mhz": core.max_freq_khz // 1000 if core.max_freq_khz else None,
                "online": core.online,
                "allowed": core.allowed,
            }
            for core in topology.cores
        ],
        "affinity": format_cpu_list(topology.affinity),
        "cgroup_cpuset": None if topology.cgroup.cpuset is None else format_cpu_list(topology.cgroup.cpuset),
        "cgroup_cpu_quota_cores": topology.cgroup.cpu_quota_cores,
        "speed_classes_by": basis,
        "binding": format_cpu_list(binding),
        "binding_cores": binding,
    }


def _memory_section(memory: MemoryInfo) -> dict[str, Any]:
    return {
        "total_bytes": memory.total_bytes,
        "available_bytes": memory.available_bytes,
        "host_available_bytes": memory.host_available_bytes,
        "cgroup_limit_bytes": memory.cgroup_limit_bytes,
    }


def _parameters(source: Path, config: dict) -> dict[str, int] | None:
    """Total and active parameters and bytes per token, or None when the checkpoint cannot tell them (the cache
    can still be planned from the attention shape and the file sizes)."""
    try:
        return footprint(config, checkpoint_tensor_bytes(source)).__dict__
    except (KeyError, ValueError, OSError):
        return None


def _model_shape(model_dir: Path, native_gguf: Path | None) -> dict[str, Any]:
    """native_gguf: the GGUF file the model runs from natively (about its size in memory, and its tensors as
    they are stored); model_dir then holds only the model's description."""
    config_path = model_dir / "config.json"
    try:
        config = json.loads(config_path.read_text())
        heads = config["num_attention_heads"]
        dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
        return {
            "num_layers": config["num_hidden_layers"],
            "num_kv_heads": config.get("num_key_value_heads") or heads,
            "head_dim": config.get("head_dim") or config["hidden_size"] // heads,
            "max_position_embeddings": config["max_position_embeddings"],
            # By default the cache is kept in the compute dtype, which is bfloat16 for 16-bit checkpoints.
            "kv_dtype": "bfloat16" if dtype in ("bfloat16", "float16") else "float32",
            "weight_bytes": native_gguf.stat().st_size if native_gguf else
            sum(path.stat().st_size for path in model_dir.glob("*.safetensors")),
            "parameters": _parameters(native_gguf or model_dir, config),
        }
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read {config_path}: {error}") from None
    except KeyError as error:
        raise ConfigError(f"{config_path} has no {error.args[0]}; is it a decoder-only language model?") from None


def _kv_section(config: EngineConfig, memory: MemoryInfo, problems: list[str]) -> dict:
    try:
        from shrike.default_model import gguf_source, resolve_model

        native_gguf = gguf_source(config.model) if config.gguf_weights == "native" else None
        model_dir = resolve_model(config.model, weights=native_gguf is None)
    except (ImportError, ValueError) as error:
        if config.model is None:
            return {"skipped": f"no model given and the default model is unavailable: {error}"}
        problems.append(str(error))
        return {"error": str(error)}
    try:
        shape = _model_shape(Path(model_dir), native_gguf)
        if config.kv_cache_dtype != "auto":
            shape["kv_dtype"] = config.kv_cache_dtype
        elif config.dtype != "auto":
            shape["kv_dtype"] = config.dtype  # the cache follows the activations
        element = KV_ELEMENTS[shape["kv_dtype"]]
        length = config.max_model_len or shape["max_position_embeddings"]
        if length > shape["max_position_embeddings"]:
            raise ConfigError(
                f"--max-model-len {length} is more than the model's maximum {shape['max_position_embeddings']}; lower it"
            )
        plan = plan_kv_cache(
            num_layers=shape["num_layers"],
            num_kv_heads=shape["num_kv_heads"],
            head_dim=shape["head_dim"],
            kv_dtype_bytes=element.value_bytes,
            kv_scale_bytes=element.scale_bytes,
            block_size=config.block_size,
            max_model_len=length,
            weight_bytes=shape["weight_bytes"],
            kv_cache_space_gib=config.kv_cache_space,
            available_bytes=memory.available_bytes,
            max_num_seqs=config.max_num_seqs,
        )
    except ConfigError as error:
        problems.append(str(error))
        return {"model": str(model_dir), "error": str(error)}
    return {"model": str(model_dir), **shape, "max_model_len": length, "plan": plan.__dict__}


def _directory_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file() and not entry.is_symlink())


def _cache_section() -> dict[str, Any]:
    try:
        from shrike.default_model import cache_dir
    except ImportError as error:
        return {"error": str(error)}
    root = cache_dir()
    if not root.is_dir():
        return {"root": str(root), "exists": False}
    children = sorted(child for child in root.iterdir() if child.is_dir())
    return {
        "root": str(root),
        "exists": True,
        "bytes": _directory_bytes(root),
        "directories": {child.name: _directory_bytes(child) for child in children},
    }


def _plugin_section(problems: list[str], kernels_load: bool) -> dict[str, Any]:
    from shrike.plugins import installed_plugins

    installed = [
        {
            "name": name,
            "entry_point": entry_point.value,
            "distribution": entry_point.dist.name if entry_point.dist else None,
            "version": entry_point.dist.version if entry_point.dist else None,
        }
        for name, entry_point in sorted(installed_plugins().items())
    ]
    if not kernels_load:  # the built-in ops are the kernels; that failure is reported already
        return {"installed": installed}
    from shrike.server.tools import build_server_registry

    try:
        registry = build_server_registry()
    except ConfigError as error:
        problems.append(str(error))
        return {"installed": installed, "error": str(error)}
    table = registry.op_table()
    # An op without a built-in C++ entry runs in Python: the executor stops before each of its calls.
    tape_breaks = {name: f"{impl.source} ({impl.provider})" for name, impl in sorted(table.chosen.items())
                   if not table.is_builtin(name)}
    return {"installed": installed, **registry.describe(), "tape_breaks": tape_breaks}


def collect_report(config: EngineConfig, sysfs_root: str = "/sys", procfs_root: str = "/proc") -> dict[str, Any]:
    """What this machine gives an engine run with `config`; only the settings that plan memory and cores
    (model, dtype, max-model-len, KV-cache dtype and space, max-num-seqs, CPU threads and binding) change it."""
    problems: list[str] = []
    topology = read_topology(sysfs_root, procfs_root)
    memory = read_memory(sysfs_root, procfs_root)
    kernels = _kernel_section(problems)
    return {
        "cpu": {"model": topology.cpu_model, **kernels},
        "topology": _topology_section(topology, config, problems),
        "memory": _memory_section(memory),
        "kv_cache": _kv_section(config, memory, problems),
        "caches": _cache_section(),
        "plugins": _plugin_section(problems, kernels_load="error" not in kernels),
        "environment": {name: value for name, value in sorted(os.environ.items()) if name.startswith("SHRIKE_")},
        "problems": problems,
    }


def _gib(num_bytes: int | None) -> str:
    return "none" if num_bytes is None else f"{num_bytes / GIB:.1f} GiB"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _format_table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def _format_cpu(cpu: dict) -> list[str]:
    lines = [f"CPU           {cpu['model']}"]
    if "error" in cpu:
        return lines + [f"Kernels       extension does not load: {cpu['error']}"]
    present = [name for name, on in cpu["features"].items() if on]
    lines.append(f"ISA features  {' '.join(present) or 'none of those Shrike uses'}")
    chosen = f"SHRIKE_ISA={cpu['shrike_isa']}" if cpu["shrike_isa"] else "best available"
    lines.append(f"Kernels       {cpu['active_isa']} ({chosen}; built and runnable: {', '.join(cpu['available_isas'])})")
    linear = cpu["linear_variants"]
    lines.append("Linear        " + "; ".join(
        f"{scheme.upper()} decode (M=1) {v['decode_m1']}, prefill {v['prefill']}" for scheme, v in linear.items()))
    lines.append("Dense         " + "; ".join(
        f"{dtype} {_dense_variant_text(variant)}" for dtype, variant in cpu["dense_variants"].items()))
    lines.append("Attention     " + "; ".join(
        f"{case} {'amx-bf16 tiles' if variant == 'amx' else variant}" for case, variant in cpu["attention_variants"].items())
        + " (head_dim 128)")
    lines.append("Variants      best first; a call runs the first at or below the active level whose condition holds")
    for op, variants in cpu["variant_tables"].items():
        lines.append(f"  {op:<19} " + " > ".join(
            v["variant"] + (f" [{v['condition']}]" if v["condition"] else "") for v in variants))
    return lines


def _dense_variant_text(variant: str) -> str:
    if variant == "amx":
        return "amx-bf16 tiles (tdpbf16ps, every M; weights packed at load)"
    return f"{variant} (lanes order)"


def _format_topology(topology: dict) -> list[str]:
    used = set(topology["binding_cores"])
    rows = [["core", "type", "capacity", "max MHz", "online", "allowed", "used"]]
    for core in topology["cores"]:
        rows.append([
            str(core["core"]), core["type"] or "?", str(core["capacity"] or "-"), str(core["max_freq_mhz"] or "-"),
            _yes(core["online"]), _yes(core["allowed"]), "*" if core["core"] in used else "",
        ])
    quota = topology["cgroup_cpu_quota_cores"]
    limits = (
        f"  affinity {topology['affinity']}; cgroup cpuset {topology['cgroup_cpuset'] or 'none'}; "
        f"cgroup CPU quota {'none' if quota is None else f'{quota:g} cores'}; "
        f"speed classes by {topology['speed_classes_by'] or 'none (all cores alike)'}"
    )
    binding = f"{topology['binding']} ({len(used)} threads)" if used else "none"
    return ["Cores", *_format_table(rows), limits, f"Binding       {binding}"]


def _format_kv(kv: dict) -> list[str]:
    if "skipped" in kv:
        return [f"KV cache      skipped: {kv['skipped']}"]
    if "plan" not in kv:
        where = f"{kv['model']}: " if "model" in kv else ""
        return [f"KV cache      {where}{kv['error']}"]
    plan = kv["plan"]
    return [
        f"KV cache      {kv['model']}",
        f"  {kv['num_layers']} layers x {kv['num_kv_heads']} KV heads x {kv['head_dim']} ({kv['kv_dtype']}), "
        f"weights {_gib(kv['weight_bytes'])}, max-model-len {kv['max_model_len']}",
        *([f"  {Footprint(**kv['parameters']).describe()}"] if kv.get("parameters") else []),
        f"  {plan['bytes_per_token']} bytes/token; {plan['num_blocks']} blocks of {plan['block_size']} = "
        f"{plan['capacity_tokens']} tokens ({_gib(plan['cache_bytes'])}); "
        f"{plan['max_concurrent_full_sequences']} full-length sequences at once",
        f"  sized {plan['source']}: {plan['reason']}",
    ]


def _format_caches(caches: dict) -> list[str]:
    if "error" in caches:
        return [f"Caches        unknown: {caches['error']}"]
    if not caches["exists"]:
        return [f"Caches        {caches['root']} (not created yet)"]
    lines = [f"Caches        {caches['root']}  {_gib(caches['bytes'])}"]
    return lines + [f"  {name}  {_gib(size)}" for name, size in caches["directories"].items()]


def _format_plugins(plugins: dict) -> list[str]:
    installed = ", ".join(
        f"{p['name']} ({p['distribution']} {p['version']})" for p in plugins["installed"]
    ) or "none"
    lines = [f"Plugins       installed: {installed}"]
    if "op" not in plugins:
        return lines + ([f"  {plugins['error']}"] if "error" in plugins else [])
    lines[0] += f"; loaded: {', '.join(plugins['plugins']) or 'none'}"
    for kind, title in (("op", "Ops"), ("architecture", "Architectures"), ("quantization", "Quantization")):
        for name, chosen in plugins[kind].items():
            others = ", ".join(c["source"] for c in chosen["candidates"][1:])
            lines.append(
                f"{title:<13} {name} -> {chosen['source']} ({chosen['provider']})" + (f"; also: {others}" if others else "")
            )
            title = ""
    breaks = plugins.get("tape_breaks", {})
    lines.append("Executor      " + ("every op runs on the C++ executor" if not breaks else
                 "these ops run in Python and split each step's op tape (a return to Python and back per call, "
                 "each layer that uses them): " + ", ".join(f"{op} -> {source}" for op, source in breaks.items())))
    return lines


def format_report(report: dict[str, Any]) -> str:
    memory = report["memory"]
    sections = [
        _format_cpu(report["cpu"]),
        _format_topology(report["topology"]),
        [
            f"Memory        total {_gib(memory['total_bytes'])}, available {_gib(memory['available_bytes'])}, "
            f"cgroup limit {_gib(memory['cgroup_limit_bytes'])}"
        ],
        _format_kv(report["kv_cache"]),
        _format_caches(report["caches"]),
        _format_plugins(report["plugins"]),
        [f"Environment   {' '.join(f'{k}={v}' for k, v in report['environment'].items()) or 'no SHRIKE_* variables set'}"],
    ]
    return "\n\n".join("\n".join(lines) for lines in sections)


def run_doctor(config: EngineConfig, as_json: bool, sysfs_root: str = "/sys", procfs_root: str = "/proc") -> int:
    report = collect_report(config, sysfs_root, procfs_root)
    print(json.dumps(report, indent=2) if as_json else format_report(report))
    for problem in report["problems"]:
        print(f"shrike doctor: {problem}", file=sys.stderr)
    return 1 if report["problems"] else 0


def add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """MODEL, every engine flag (the KV-cache plan and the core binding follow them) and --json."""
    add_engine_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def doctor_main(args: argparse.Namespace) -> int:
    return run_doctor(engine_config_from_args(args), args.json)
