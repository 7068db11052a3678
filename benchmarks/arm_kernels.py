#!/usr/bin/env python3
"""Arm kernel evidence without Arm hardware (issue 39): static cycle models and dynamic instruction counts.

  python benchmarks/arm_kernels.py static  [--out-dir benchmarks/results] [--tag NAME]
  python benchmarks/arm_kernels.py dynamic [--out-dir benchmarks/results] [--tag NAME] [--layers 2]
  python benchmarks/arm_kernels.py selftest          # the assembly parsing on a tiny hand-written loop nest

static: every Shrike Arm linear kernel (csrc/linear/*_{dotprod,i8mm,sve2}.cpp, compiled from the shipped
sources through benchmarks/arm/mca_shrike.cpp with each variant's flags from csrc/kernels.cmake plus
-mtune=cortex-a720) and llama.cpp's matching ggml loops (arch/arm/repack.cpp from the llama-cpp-python
sdist that benchmarks/build_peers.sh uses, compiled with -mcpu=cortex-a720 as a native build on the
A720 would be) are compiled to assembly with clang-19; the hot loop of each kernel is cut out of the
assembly and given to llvm-mca-19 -mcpu=cortex-a720. For Shrike's W4A8 the modelled block is one whole
weight group (the K loop repeated group/step times plus the per-group scale work), for ggml one Q4_0 /
Q8_0 block of 32 (its scale work is inside the loop). Reported: cycles and instructions per 32 weights
per activation row (= per 32 multiply-adds), per kernel and shape.

dynamic: cross-compiles a driver (benchmarks/arm/decode_count.cpp) against Shrike's kernel library and
ggml's CPU backend, runs one decode step's linears of an N-layer MiniCPM5-2B-shaped model (q, k, v, o,
gate, up, down per layer, batch 1, one thread) under qemu-user with `-d in_asm,exec,nochain`, and
counts the guest instructions executed inside each kernel (translation blocks attributed to symbols).

Prerequisites (installed with apt-get when missing and running as root): clang-19, llvm-19,
g++-aarch64-linux-gnu, qemu-user, cmake. The llama.cpp sources are fetched with pip download
(the llama-cpp-python sdist) into $SHRIKE_PEERS_DIR/src (default ~/.cache/shrike-peers/src);
build outputs go to $SHRIKE_ARM_BENCH_DIR (default /tmp/shrike-arm-bench).
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.environ.get("SHRIKE_ARM_BENCH_DIR", "/tmp/shrike-arm-bench")
PEERS = os.environ.get("SHRIKE_PEERS_DIR", os.path.expanduser("~/.cache/shrike-peers"))
CLANG, CLANGXX, MCA = "clang-19", "clang++-19", "llvm-mca-19"
MCPU = "cortex-a720"
# For the side check that the model LLVM uses for cortex-a720 is the Neoverse-N2 one.
MCPU_ALT = "neoverse-n2"
GROUP = 128  # Shrike W4A8-G128, the MiniCPM5-2B checkpoint's group


# ---------------------------------------------------------------------------------------------------------
# tools and sources

def ensure_tools(need_qemu: bool) -> None:
    want = {CLANGXX: "clang-19", MCA: "llvm-19"}
    if need_qemu:
        want.update({"aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu", "qemu-aarch64": "qemu-user", "cmake": "cmake",
                     "make": "make"})
    missing = sorted({pkg for exe, pkg in want.items() if shutil.which(exe) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        sys.exit(f"missing tools; install the Debian packages: {' '.join(missing)}")
    print(f"== apt-get install {' '.join(missing)}", flush=True)
    subprocess.run(["apt-get", "update"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *missing], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, stdout=subprocess.DEVNULL)


def llama_cpp_dir() -> str:
    """vendor/llama.cpp of the newest llama-cpp-python sdist in PEERS/src (downloaded like build_peers.sh)."""
    src = os.path.join(PEERS, "src")
    os.makedirs(src, exist_ok=True)
    sdists = sorted(glob.glob(os.path.join(src, "llama_cpp_python-*.tar.gz")))
    if not sdists:
        subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
                        "--no-binary", "llama-cpp-python", "llama-cpp-python", "-d", src], check=True)
        sdists = sorted(glob.glob(os.path.join(src, "llama_cpp_python-*.tar.gz")))
    sdist = sdists[-1]
    vendor = sdist[: -len(".tar.gz")] + "/vendor/llama.cpp"
    if not os.path.isdir(vendor):
        subprocess.run(["tar", "xzf", sdist, "-C", src], check=True)
    return vendor


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


# ---------------------------------------------------------------------------------------------------------
# assembly: functions, labels, branches, loops

def decode_inst(word: int) -> str | None:
    """Text form of the int8 dot/matrix instructions ggml's inline assembly emits as `.inst 0x...` words."""
    d, n, m = word & 31, (word >> 5) & 31, (word >> 16) & 31
    for base, name in ((0x4e80a400, "smmla"), (0x6e80a400, "ummla"), (0x4e80ac00, "usmmla")):
        if word & 0xffe0fc00 == base:
            return f"{name} v{d}.4s, v{n}.16b, v{m}.16b"
    q = (word >> 30) & 1
    for base, name in ((0x0e809400, "sdot"), (0x2e809400, "udot")):
        if word & 0xbfe0fc00 == base:
            return f"{name} v{d}.{'4s' if q else '2s'}, v{n}.{'16b' if q else '8b'}, v{m}.{'16b' if q else '8b'}"
    for base, name in ((0x0f80e000, "sdot"), (0x2f80e000, "udot")):
        if word & 0xbfc0f400 == base:
            idx = ((word >> 11) & 1) << 1 | ((word >> 21) & 1)
            return f"{name} v{d}.{'4s' if q else '2s'}, v{n}.{'16b' if q else '8b'}, v{m}.4b[{idx}]"
    return None


BRANCH_COND = re.compile(r"^(b\.?(eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le)|cbn?z|tbn?z)$")


@dataclass
class Item:
    kind: str  # "label" or "insn"
    text: str
    mnemonic: str = ""
    target: str | None = None  # branch target label as written
    cond: bool = False


def function_items(asm: str, name: str) -> list[Item]:
    lines = asm.splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if re.match(rf"^{re.escape(name)}:", l))
    except StopIteration:
        raise SystemExit(f"function {name} not found in the assembly")
    items: list[Item] = []
    for line in lines[start + 1:]:
        if re.match(r"^\.Lfunc_end\d+:", line) or re.match(r"^\s*\.size\s", line):
            break
        code = line.split("//")[0].strip()
        while True:
            m = re.match(r"^([.\w$]+):\s*(.*)$", code)
            if not m:
                break
            items.append(Item("label", m.group(1)))
            code = m.group(2).strip()
        m = re.match(r"^\.inst\s+(0x[0-9a-fA-F]+)$", code)
        if m:
            text = decode_inst(int(m.group(1), 16))
            if text is None:
                raise SystemExit(f"{name}: undecoded instruction word {code}")
            code = text
        if not code or code.startswith("."):
            continue
        mnemonic = code.split()[0].lower()
        item = Item("insn", code, mnemonic)
        ops = [o.strip() for o in code[len(mnemonic):].split(",")]
        if mnemonic == "b" or BRANCH_COND.match(mnemonic):
            item.target = ops[-1]
            item.cond = mnemonic != "b"
        items.append(item)
    return items


def label_positions(items: list[Item]) -> dict:
    pos: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        if it.kind == "label":
            pos.setdefault(it.text, []).append(i)
    return pos


def resolve(items: list[Item], labels: dict, at: int, target: str) -> int | None:
    m = re.match(r"^(\d+)([bf])$", target)
    if m:  # GNU local numeric labels in inline assembly: 1b = nearest 1: before, 1f = nearest after
        cands = labels.get(m.group(1), [])
        if m.group(2) == "b":
            prev = [c for c in cands if c <= at]
            return prev[-1] if prev else None
        nxt = [c for c in cands if c > at]
        return nxt[0] if nxt else None
    cands = labels.get(target)
    return cands[0] if cands else None


def macs(insn: Item, vl_bits: int = 128) -> int:
    """int8 multiply-adds of one dot-product instruction (SVE counted at vl_bits)."""
    parts = insn.text.split(None, 1)
    m, ops = insn.mnemonic, parts[1] if len(parts) > 1 else ""
    seg = vl_bits // 128
    if m in ("sdot", "udot", "usdot", "sudot"):
        if ops.startswith("z"):
            return 16 * seg if ".s" in ops.split(",")[0] else 8 * seg
        return 16 if ".4s" in ops.split(",")[0] else 8
    if m in ("smmla", "ummla", "usmmla"):
        return 32 * seg
    return 0


@dataclass
class Region:
    start: int  # position of the target label of the backward branch
    end: int  # position of the backward branch
    dots: int = 0
    macs: int = 0
    sve: bool = False


def regions(items: list[Item]) -> list[Region]:
    labels = label_positions(items)
    out = []
    for j, it in enumerate(items):
        if it.kind == "insn" and it.target is not None:
            i = resolve(items, labels, j, it.target)
            if i is not None and i <= j:
                r = Region(i, j)
                body = [x for x in items[i:j + 1] if x.kind == "insn"]
                r.dots = sum(1 for x in body if macs(x))
                r.macs = sum(macs(x) for x in body)
                r.sve = any(macs(x) and x.text.split(None, 1)[1].startswith("z") for x in body)
                out.append(r)
    return out


def innermost_dot_region(items: list[Item], want_sve: bool | None = None) -> Region:
    rs = [r for r in regions(items) if r.dots and (want_sve is None or r.sve == want_sve)]
    leaves = [r for r in rs if not any(o is not r and r.start <= o.start and o.end <= r.end and (o.start, o.end) !=
                                       (r.start, r.end) for o in regions(items))]
    if not leaves:
        raise SystemExit("no innermost loop with dot-product instructions found")
    return max(leaves, key=lambda r: (r.macs, -r.start))


def parent_region(items: list[Item], inner: Region) -> Region:
    rs = [r for r in regions(items) if r.start <= inner.start and inner.end <= r.end and
          (r.start, r.end) != (inner.start, inner.end)]
    if not rs:
        raise SystemExit("the dot loop has no enclosing loop")
    return min(rs, key=lambda r: r.end - r.start)


def walk(items: list[Item], region: Region, inner: Region | None, trips: int) -> list[Item]:
    """The instructions of one iteration of `region` along the laid-out path: conditional branches other
    than back edges are taken as not taken, the inner loop runs `trips` times."""
    labels = label_positions(items)
    out: list[Item] = []
    pos, steps = region.start, 0
    while pos <= region.end:
        steps += 1
        if steps > 100000:
            raise SystemExit("path walk did not terminate")
        if inner is not None and pos == inner.start:
            body = [x for x in items[inner.start:inner.end + 1] if x.kind == "insn"]
            out.extend(body * trips)
            pos = inner.end + 1
            continue
        it = items[pos]
        if it.kind == "label":
            pos += 1
            continue
        out.append(it)
        if it.target is not None:
            tgt = resolve(items, labels, pos, it.target)
            if tgt == region.start:
                return out
            if not it.cond:
                if tgt is None or not region.start <= tgt <= region.end:
                    return out
                pos = tgt
                continue
        pos += 1
    return out


# ---------------------------------------------------------------------------------------------------------
# llvm-mca

def mca(insns: list[Item], mcpu: str, iterations: int = 200) -> dict:
    os.makedirs(WORK, exist_ok=True)
    path = os.path.join(WORK, "mca_block.s")
    with open(path, "w") as f:
        f.write("\n".join(x.text for x in insns) + "\n")
    out = run([MCA, "-mtriple=aarch64-linux-gnu", f"-mcpu={mcpu}", f"-iterations={iterations}", path]).stdout

    def field(name):
        return float(re.search(rf"^{name}:\s+([\d.]+)", out, re.M).group(1))
    return {"cycles": field("Total Cycles") / field("Iterations"), "instructions": field("Instructions") / field("Iterations"),
            "rthroughput": field("Block RThroughput"), "ipc": field("IPC")}


# ---------------------------------------------------------------------------------------------------------
# what is modelled

@dataclass
class Kernel:
    engine: str  # "shrike" or "llama.cpp"
    fmt: str  # "W4A8-G128 / Q4_0" family: "int4" or "int8"
    name: str  # display name
    asm: str  # key of the assembly file
    symbol: str
    shape: str  # "decode" or "prefill"
    rows: int  # activation rows one loop iteration serves
    nest: int = 1  # 2: the modelled block is the enclosing loop (one weight group) with the K loop repeated
    inner_k: int = 0  # K per K-loop iteration, for nest 2
    note: str = ""
    want_sve: bool | None = None
    result: dict = field(default_factory=dict)


SHRIKE_VARIANTS = {
    "DOTPROD": "-march=armv8.2-a+dotprod",
    "I8MM": "-march=armv8.6-a+dotprod+i8mm",
    "SVE2": "-march=armv9-a+sve2+i8mm",
}


def kernels() -> list[Kernel]:
    g = f"G{GROUP}"
    k = [
        # Shrike W4A8 (int4 weights, group 128)
        Kernel("shrike", "int4", f"dotprod W4A8-{g} rows_x_tile<1>", "DOTPROD", "mca_w4a8_rows1", "decode", 1, 2, 16,
               "runs decode on dotprod and i8mm CPUs"),
        Kernel("shrike", "int4", f"sve2 W4A8-{g} rows_x_pass<1>", "SVE2", "mca_w4a8_rows1", "decode", 1, 2, 16,
               "SVE2 level (VL 128: 4 columns per pass)"),
        Kernel("shrike", "int4", f"dotprod W4A8-{g} rows_x_tile<4>", "DOTPROD", "mca_w4a8_rows4", "prefill", 4, 2, 16),
        Kernel("shrike", "int4", f"i8mm W4A8-{g} pairs_x_tile<2>", "I8MM", "mca_w4a8_pairs2", "prefill", 4, 2, 8),
        Kernel("shrike", "int4", f"sve2 W4A8-{g} pairs_x_pass<2>", "SVE2", "mca_w4a8_pairs2", "prefill", 4, 2, 8),
        # Shrike W8A8 (int8 weights, per channel)
        Kernel("shrike", "int8", "dotprod W8A8 rows_x_tile<1>", "DOTPROD", "mca_w8a8_rows1", "decode", 1,
               note="runs decode on dotprod and i8mm CPUs"),
        Kernel("shrike", "int8", "sve2 W8A8 rows_x_pass<1>", "SVE2", "mca_w8a8_rows1", "decode", 1),
        Kernel("shrike", "int8", "dotprod W8A8 rows_x_tile<4>", "DOTPROD", "mca_w8a8_rows4", "prefill", 4),
        Kernel("shrike", "int8", "i8mm W8A8 pairs_x_tile<2>", "I8MM", "mca_w8a8_pairs2", "prefill", 4),
        Kernel("shrike", "int8", "sve2 W8A8 pairs_x_pass<2>", "SVE2", "mca_w8a8_pairs2", "prefill", 4),
        # llama.cpp (ggml CPU backend, weights repacked at load; A720 = i8mm -> the 4x8 layouts)
        Kernel("llama.cpp", "int4", "ggml_gemv_q4_0_4x8_q8_0", "llama_repack", "ggml_gemv_q4_0_4x8_q8_0", "decode", 1,
               note="what an A720 runs for Q4_0 decode"),
        Kernel("llama.cpp", "int4", "ggml_gemv_q4_0_4x4_q8_0", "llama_repack", "ggml_gemv_q4_0_4x4_q8_0", "decode", 1,
               note="dotprod-only CPUs"),
        Kernel("llama.cpp", "int4", "ggml_gemm_q4_0_4x8_q8_0", "llama_repack", "ggml_gemm_q4_0_4x8_q8_0", "prefill", 16,
               note="i8mm, inline asm; 16-row main loop"),
        Kernel("llama.cpp", "int4", "ggml_gemm_q4_0_4x4_q8_0", "llama_repack", "ggml_gemm_q4_0_4x4_q8_0", "prefill", 16,
               note="dotprod, inline asm; 16-row main loop"),
        Kernel("llama.cpp", "int8", "ggml_gemv_q8_0_4x8_q8_0", "llama_repack", "ggml_gemv_q8_0_4x8_q8_0", "decode", 1,
               note="what an A720 runs for Q8_0 decode"),
        Kernel("llama.cpp", "int8", "ggml_gemv_q8_0_4x4_q8_0", "llama_repack", "ggml_gemv_q8_0_4x4_q8_0", "decode", 1,
               note="dotprod-only CPUs"),
        Kernel("llama.cpp", "int8", "ggml_gemm_q8_0_4x8_q8_0", "llama_repack", "ggml_gemm_q8_0_4x8_q8_0", "prefill", 4,
               note="i8mm"),
        Kernel("llama.cpp", "int8", "ggml_gemm_q8_0_4x4_q8_0", "llama_repack", "ggml_gemm_q8_0_4x4_q8_0", "prefill", 4,
               note="dotprod"),
    ]
    return k


def compile_asm(vendor: str) -> dict:
    os.makedirs(WORK, exist_ok=True)
    asm = {}
    for key, flags in SHRIKE_VARIANTS.items():
        path = os.path.join(WORK, f"shrike_{key}.s")
        run([CLANGXX, "--target=aarch64-linux-gnu", "-std=c++17", "-O3", "-fno-math-errno", flags, f"-mtune={MCPU}",
             "-DSHRIKE_AARCH64=1", f"-DSHRIKE_MCA_{key}", f"-I{REPO}/csrc", "-S",
             os.path.join(REPO, "benchmarks/arm/mca_shrike.cpp"), "-o", path])
        asm[key] = open(path).read()
    g = os.path.join(vendor, "ggml")
    path = os.path.join(WORK, "llama_repack.s")
    run([CLANGXX, "--target=aarch64-linux-gnu", "-std=c++17", "-O3", f"-mcpu={MCPU}", "-DNDEBUG", "-D_GNU_SOURCE",
         f"-I{g}/include", f"-I{g}/src", f"-I{g}/src/ggml-cpu", "-S", f"{g}/src/ggml-cpu/arch/arm/repack.cpp", "-o", path])
    asm["llama_repack"] = open(path).read()
    return asm


def model_kernel(kern: Kernel, asm: str) -> dict:
    items = function_items(asm, kern.symbol)
    inner = innermost_dot_region(items, kern.want_sve)
    inner_insns = [x for x in items[inner.start:inner.end + 1] if x.kind == "insn"]
    if kern.nest == 2:
        trips = GROUP // kern.inner_k
        block = walk(items, parent_region(items, inner), inner, trips)
    else:
        trips = 1
        block = inner_insns
    total_macs = sum(macs(x) for x in block)
    if total_macs != inner.macs * trips:
        raise SystemExit(f"{kern.name}: the modelled block has {total_macs} multiply-adds, expected {inner.macs * trips}")
    res = mca(block, MCPU)
    alt = mca(block, MCPU_ALT)
    weights = total_macs / kern.rows  # weights one block covers (each weight meets `rows` activation rows)
    per32 = 32 / total_macs  # per 32 multiply-adds = per 32 weights per row
    return {
        "block_instructions": len(block), "block_macs": total_macs, "weights_per_block": weights,
        "inner_loop_trips": trips, "cycles_per_block": res["cycles"], "rthroughput_per_block": res["rthroughput"],
        "ipc": res["ipc"],
        "cycles_per_32": res["cycles"] * per32, "instructions_per_32": len(block) * per32,
        "rthroughput_per_32": res["rthroughput"] * per32,
        "dot_instructions_per_32": sum(1 for x in block if macs(x)) * per32,
        "same_as_neoverse_n2": abs(alt["cycles"] - res["cycles"]) < 1e-9,
        "block": [x.text for x in block],
    }


def cmd_static(args) -> None:
    ensure_tools(need_qemu=False)
    vendor = llama_cpp_dir()
    asm = compile_asm(vendor)
    ks = kernels()
    for kern in ks:
        kern.result = model_kernel(kern, asm[kern.asm])
        r = kern.result
        print(f"{kern.engine:9s} {kern.shape:7s} {kern.name:38s} cyc/32 {r['cycles_per_32']:6.2f}  "
              f"insn/32 {r['instructions_per_32']:6.2f}  rthr/32 {r['rthroughput_per_32']:5.2f}  IPC {r['ipc']:.2f}")
    clang_v = run([CLANGXX, "--version"]).stdout.splitlines()[0]
    meta = {"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "mcpu": MCPU, "clang": clang_v,
            "llvm_mca": "llvm-mca " + re.search(r"LLVM version ([\d.]+)", run([MCA, "--version"]).stdout).group(1),
            "llama_cpp": os.path.basename(os.path.dirname(os.path.dirname(vendor))), "group": GROUP,
            "all_same_as_neoverse_n2": all(k.result["same_as_neoverse_n2"] for k in ks)}
    tag = args.tag or datetime.datetime.utcnow().strftime("%Y%m%d")
    os.makedirs(args.out_dir, exist_ok=True)
    jpath = os.path.join(args.out_dir, f"arm-mca-{tag}.json")
    with open(jpath, "w") as f:
        json.dump({"meta": meta, "kernels": [{**{k: v for k, v in kern.__dict__.items() if k != "result"},
                                              **kern.result} for kern in ks]}, f, indent=1)
    mpath = os.path.join(args.out_dir, f"arm-mca-{tag}.md")
    with open(mpath, "w") as f:
        f.write(static_markdown(ks, meta))
    print(f"wrote {jpath}\nwrote {mpath}")


def static_markdown(ks: list[Kernel], meta: dict) -> str:
    out = [f"# llvm-mca: Shrike vs llama.cpp Arm kernel loops ({meta['date']})", "",
           f"`python benchmarks/arm_kernels.py static` — {meta['clang']}; {meta['llvm_mca']}; "
           f"`-mcpu={meta['mcpu']}` (LLVM schedules it with its Neoverse-N2 model: identical results with "
           f"`-mcpu=neoverse-n2` for every block: {meta['all_same_as_neoverse_n2']}); llama.cpp from {meta['llama_cpp']}.",
           "", "Per 32 weights per activation row (= per 32 int8 multiply-adds); all data in L1 (llvm-mca has no "
           "memory model). Shrike W4A8 blocks are one whole group of 128 (K loop x trips + group epilogue); ggml "
           "blocks are one 32-weight block (scales inside).", ""]
    for fam, title in (("int4", "int4 weights: Shrike W4A8-G128 vs ggml Q4_0"), ("int8", "int8 weights: Shrike W8A8 vs ggml Q8_0")):
        out += [f"## {title}", "", "| shape | engine | kernel | rows | cycles / 32 | instructions / 32 | dot instr / 32 | "
                "resource bound cycles / 32 | IPC | note |", "|---|---|---|---|---|---|---|---|---|---|"]
        for shape in ("decode", "prefill"):
            for kern in ks:
                if kern.fmt != fam or kern.shape != shape:
                    continue
                r = kern.result
                out.append(f"| {shape} | {kern.engine} | `{kern.name}` | {kern.rows} | {r['cycles_per_32']:.2f} | "
                           f"{r['instructions_per_32']:.2f} | {r['dot_instructions_per_32']:.2f} | "
                           f"{r['rthroughput_per_32']:.2f} | {r['ipc']:.2f} | {kern.note} |")
        out.append("")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------------

def cmd_selftest(args) -> None:
    """The loop finder and path walk on a hand-written two-level nest (no tools needed)."""
    asm = """f:
\tmov x0, #0
.LBB0_3:
\tscvtf v3.4s, v3.4s
\tfmla v22.4s, v5.4s, v3.4s
\tcmp x14, x9
\tb.eq .LBB0_8
.LBB0_4:
\tcmp x15, x16
\tb.ge .LBB0_9
.LBB0_6:
\tldp q4, q5, [x10]
\tsdot v2.4s, v17.16b, v20.4b[0]
\tsmmla v3.4s, v1.16b, v2.16b
\tcmp x15, x16
\tb.lt .LBB0_6
\tb .LBB0_3
.LBB0_8:
\tret
.LBB0_9:
1:
\tsdot z0.s, z1.b, z2.b
\tsubs x1, x1, #1
\tbne 1b
\tret
.Lfunc_end0:
"""
    items = function_items(asm, "f")
    inner = innermost_dot_region(items, want_sve=False)
    assert inner.macs == 48 and inner.dots == 2, inner
    outer = parent_region(items, inner)
    block = walk(items, outer, inner, 3)
    names = [x.mnemonic for x in block]
    assert names == ["scvtf", "fmla", "cmp", "b.eq", "cmp", "b.ge"] + ["ldp", "sdot", "smmla", "cmp", "b.lt"] * 3 + ["b"], names
    sve = innermost_dot_region(items, want_sve=True)
    assert sve.macs == 16, sve
    print("selftest: ok")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("static",):
        p = sub.add_parser(name)
        p.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks/results"))
        p.add_argument("--tag", default=None)
        if name == "dynamic":
            p.add_argument("--layers", type=int, default=2)
    sub.add_parser("selftest")
    args = ap.parse_args(argv)
    {"static": cmd_static, "selftest": cmd_selftest}[args.cmd](args)


if __name__ == "__main__":
    main()
