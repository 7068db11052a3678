#!/usr/bin/env python3
"""Arm kernel evidence without Arm hardware (issue 39): static cycle models and dynamic instruction counts.

  python benchmarks/arm_kernels.py static  [--compiler clang|gcc] [--out-dir benchmarks/results] [--tag NAME]
  python benchmarks/arm_kernels.py dynamic [--out-dir benchmarks/results] [--tag NAME] [--layers 2]
  python benchmarks/arm_kernels.py project --mca M.json --counts C.json --out P.md   # the CIX P1 projection
  python benchmarks/arm_kernels.py selftest          # the assembly parsing on a tiny hand-written loop nest

static: every Shrike Arm linear kernel (csrc/linear/*_{dotprod,i8mm,sve2}.cpp, compiled from the shipped
sources through benchmarks/arm/mca_shrike.cpp with exactly the library's flags from csrc/kernels.cmake) and
llama.cpp's matching ggml loops (arch/arm/repack.cpp from the llama-cpp-python sdist that
benchmarks/build_peers.sh uses, compiled with -mcpu=cortex-a720 as a native build on the A720 would be)
are compiled to assembly (clang-19 by default, `--compiler gcc` for Debian's GCC 12 cross compiler, which
knows no cortex-a720 and gets -mcpu=cortex-a710 for ggml); the hot loop of each kernel is cut out of the
assembly and given to llvm-mca-19 -mcpu=cortex-a720 (LLVM 19 schedules that core with its Neoverse-N2
model; the script checks that -mcpu=neoverse-n2 gives the same cycles). For Shrike's W4A8 the modelled block
is one whole weight group (the K loop repeated group/step times plus the per-group scale work), for ggml one
Q4_0 / Q8_0 block of 32 (its scale work is inside the loop). Reported: cycles and instructions per 32
weights per activation row (= per 32 multiply-adds), per kernel and shape.

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


MAC_KIND = "int8"  # "int8": dot/matrix instructions carry the multiply-adds; "fp32": fmla .4s (the bf16 dense loop)


def macs(insn: Item, vl_bits: int = 128) -> int:
    """Multiply-adds of one instruction of the modelled kind (SVE counted at vl_bits)."""
    parts = insn.text.split(None, 1)
    m, ops = insn.mnemonic, parts[1] if len(parts) > 1 else ""
    if MAC_KIND == "fp32":
        return 4 if m == "fmla" and ops.split(",")[0].endswith(".4s") and "[" not in ops else 0
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
    def text(x: Item) -> str:  # branch targets pointed at one label (llvm-mca ignores where branches go)
        return x.text[: x.text.rindex(x.target)] + ".Lmca_top" if x.target else x.text
    with open(path, "w") as f:
        f.write(".Lmca_top:\n" + "\n".join(text(x) for x in insns) + "\n")
    out = run([MCA, "-mtriple=aarch64-linux-gnu", f"-mcpu={mcpu}", f"-iterations={iterations}", path]).stdout

    def field(name):
        return float(re.search(rf"^{name}:\s+([\d.]+)", out, re.M).group(1))
    units = sorted(set(re.findall(r"^\[[\d.]+\]\s+- (\w+)", out, re.M)))
    return {"units": units, "cycles": field("Total Cycles") / field("Iterations"), "instructions": field("Instructions") / field("Iterations"),
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
    mac_kind: str = "int8"
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
        # Shrike's bf16 dense GEMV (the bf16 lm_head at decode): 1 row x 2 columns, fp32 fma on widened bf16
        Kernel("shrike", "bf16", "dotprod dense bf16 block<1,2>", "DOTPROD", "mca_dense_bf16_r1c2", "decode", 1,
               note="lm_head of the W4A8/W8A8 checkpoints (bf16); no llama.cpp counterpart modelled", mac_kind="fp32"),
    ]
    return k


# GCC 12 (Debian's cross compiler, what .ci/arm-kernels.sh and a Debian arm64 build use) has no cortex-a720;
# cortex-a710 is its nearest core (the A720's predecessor but one, same 2 x 128-bit SIMD back end as the N2).
GCC_CPU = "cortex-a710"


def compile_asm(vendor: str, compiler: str) -> dict:
    os.makedirs(WORK, exist_ok=True)
    if compiler == "clang":
        cxx, target, cpu = [CLANGXX, "--target=aarch64-linux-gnu"], [], f"-mcpu={MCPU}"
    else:
        cxx, target, cpu = ["aarch64-linux-gnu-g++"], [], f"-mcpu={GCC_CPU}"
    asm = {}
    for key, flags in SHRIKE_VARIANTS.items():  # exactly the library's flags (csrc/kernels.cmake): no -mtune
        path = os.path.join(WORK, f"shrike_{key}_{compiler}.s")
        run([*cxx, *target, "-std=c++17", "-O3", "-fno-math-errno", flags,
             "-DSHRIKE_AARCH64=1", f"-DSHRIKE_MCA_{key}", f"-I{REPO}/csrc", "-S",
             os.path.join(REPO, "benchmarks/arm/mca_shrike.cpp"), "-o", path])
        asm[key] = open(path).read()
    g = os.path.join(vendor, "ggml")
    path = os.path.join(WORK, f"llama_repack_{compiler}.s")
    run([*cxx, *target, "-std=c++17", "-O3", cpu, "-DNDEBUG", "-D_GNU_SOURCE",
         f"-I{g}/include", f"-I{g}/src", f"-I{g}/src/ggml-cpu", "-S", f"{g}/src/ggml-cpu/arch/arm/repack.cpp", "-o", path])
    asm["llama_repack"] = open(path).read()
    return asm


def model_kernel(kern: Kernel, asm: str) -> dict:
    global MAC_KIND
    MAC_KIND = kern.mac_kind
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
        "same_as_neoverse_n2": abs(alt["cycles"] - res["cycles"]) < 1e-9, "sched_units": res["units"],
        "block": [x.text for x in block],
    }


def cmd_static(args) -> None:
    ensure_tools(need_qemu=args.compiler == "gcc")
    vendor = llama_cpp_dir()
    asm = compile_asm(vendor, args.compiler)
    ks = kernels()
    for kern in ks:
        kern.result = model_kernel(kern, asm[kern.asm])
        r = kern.result
        print(f"{kern.engine:9s} {kern.shape:7s} {kern.name:38s} cyc/32 {r['cycles_per_32']:6.2f}  "
              f"insn/32 {r['instructions_per_32']:6.2f}  rthr/32 {r['rthroughput_per_32']:5.2f}  IPC {r['ipc']:.2f}")
    cxx = CLANGXX if args.compiler == "clang" else "aarch64-linux-gnu-g++"
    compiler_v = run([cxx, "--version"]).stdout.splitlines()[0]
    flags = (f"-O3 -mcpu={MCPU} (llama.cpp, as a native build there), -O3 -fno-math-errno and each variant's -march "
             f"from csrc/kernels.cmake (Shrike, as shipped)" if args.compiler == "clang" else
             f"-O3 -mcpu={GCC_CPU} (llama.cpp), -O3 -fno-math-errno and each variant's -march (Shrike, as shipped)")
    meta = {"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "mcpu": MCPU, "compiler": compiler_v,
            "compile_flags": flags,
            "llvm_mca": "llvm-mca " + re.search(r"LLVM version ([\d.]+)", run([MCA, "--version"]).stdout).group(1),
            "llama_cpp": os.path.basename(os.path.dirname(os.path.dirname(vendor))), "group": GROUP,
            "all_same_as_neoverse_n2": all(k.result["same_as_neoverse_n2"] for k in ks),
            "sched_units": sorted({u for k in ks for u in k.result["sched_units"]})}
    tag = args.tag or datetime.datetime.utcnow().strftime("%Y%m%d")
    if args.compiler == "gcc":
        tag = f"gcc-{tag}"
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
           f"`python benchmarks/arm_kernels.py static{'' if 'clang' in meta['compiler'] else ' --compiler gcc'}` — "
           f"compiled by {meta['compiler']} with {meta['compile_flags']}; {meta['llvm_mca']} "
           f"`-mcpu={meta['mcpu']}`: LLVM has no model of its own for that core and schedules it with its Neoverse-N2 "
           f"model (resources {', '.join(meta['sched_units'][:3])}, ...; identical cycles with `-mcpu=neoverse-n2` for "
           f"every block: {meta['all_same_as_neoverse_n2']}); llama.cpp from {meta['llama_cpp']}.",
           "", "Per 32 weights per activation row (= per 32 int8 multiply-adds); all data in L1 (llvm-mca has no "
           "memory model). Shrike W4A8 blocks are one whole group of 128 (K loop x trips + group epilogue); ggml "
           "blocks are one 32-weight block (scales inside).", ""]
    for fam, title in (("int4", "int4 weights: Shrike W4A8-G128 vs ggml Q4_0"), ("int8", "int8 weights: Shrike W8A8 vs ggml Q8_0"),
                       ("bf16", "bf16 weights: Shrike's dense GEMV (the lm_head); multiply-adds are fmla lanes")):
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


# ---------------------------------------------------------------------------------------------------------
# dynamic counts under qemu-user

AARCH64_TOOLCHAIN = os.path.join(REPO, "cmake/aarch64-linux-gnu.cmake")
QEMU_SVE128 = "max,sve-default-vector-length=16"  # SVE2 + I8MM + dotprod at the A720's 128-bit vector length
KERNEL_RE = re.compile(r"w4a8_tiles|w8a8_tiles|rows_x_|pairs_x_|ggml_gemv_|ggml_gemm_|ggml_vec_dot_")
QUANT_RE = re.compile(r"quantize|row_sum|act_quant")


GGML_ARCH = {  # ggml builds: "a720" = the A720's features (-mcpu=native there), "dotprod" = a Cortex-A76-class CPU
    "a720": ("armv9-a+sve2+i8mm+dotprod", ""),
    "dotprod": ("armv8.2-a+dotprod", "-dotprod"),
}


def build_driver(vendor: str, peer: str = "a720") -> str:
    """Shrike's kernel library (as .ci/arm-kernels.sh builds it), ggml's CPU backend and the driver, for aarch64."""
    arch, suffix = GGML_ARCH[peer]
    shrike_build, ggml_build = os.path.join(WORK, "shrike-build"), os.path.join(WORK, f"ggml-build{suffix}")
    if not os.path.exists(os.path.join(shrike_build, "CMakeCache.txt")):
        run(["cmake", "-S", os.path.join(REPO, "csrc/tests"), "-B", shrike_build,
             f"-DCMAKE_TOOLCHAIN_FILE={AARCH64_TOOLCHAIN}"])
    print("== building Shrike's kernel library (aarch64)", flush=True)
    run(["cmake", "--build", shrike_build, "--target", "shrike_kernels", "-j1"])
    if not os.path.exists(os.path.join(ggml_build, "CMakeCache.txt")):
        # The CPU features of an A720 build (-mcpu=native there): SVE2, I8MM, dotprod; the SVE vector length is
        # read at run time (128 bits under QEMU_SVE128, as on the A720), so ggml picks its 4x8 repacked kernels.
        run(["cmake", "-S", vendor, "-B", ggml_build, f"-DCMAKE_TOOLCHAIN_FILE={AARCH64_TOOLCHAIN}",
             "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", f"-DGGML_CPU_ARM_ARCH={arch}",
             "-DBUILD_SHARED_LIBS=OFF", "-DGGML_OPENMP=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
             "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
             "-DLLAMA_BUILD_COMMON=OFF"])
    print("== building ggml's CPU backend (aarch64; a few minutes on one core the first time)", flush=True)
    run(["cmake", "--build", ggml_build, "--target", "ggml-cpu", "ggml-base", "-j1"])
    driver = os.path.join(WORK, f"decode_count{suffix}")
    libs = [os.path.join(shrike_build, "libshrike_kernels.a"), os.path.join(ggml_build, "ggml/src/libggml-cpu.a"),
            os.path.join(ggml_build, "ggml/src/libggml-base.a")]
    run(["aarch64-linux-gnu-g++", "-std=c++17", "-O2", "-static", "-DSHRIKE_AARCH64=1", f"-I{REPO}/csrc",
         f"-I{vendor}/ggml/include", os.path.join(REPO, "benchmarks/arm/decode_count.cpp"), *libs, "-pthread", "-lm",
         "-o", driver])
    return driver


def symbol_address(binary: str, name: str) -> int:
    for line in run(["aarch64-linux-gnu-nm", binary]).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return int(parts[0], 16)
    raise SystemExit(f"{name} not in {binary}")


def count_instructions(driver: str, argv: list[str], cpu: str, env: dict) -> dict:
    """Guest instructions executed between count_begin() and count_end(): qemu logs every translation block
    (in_asm: its instructions) and every execution of one (exec, with chaining off so none is skipped);
    executions x block sizes, summed per symbol."""
    begin, end = symbol_address(driver, "count_begin"), symbol_address(driver, "count_end")
    fifo = os.path.join(WORK, f"qemu-log-{os.getpid()}.fifo")
    if os.path.exists(fifo):
        os.unlink(fifo)
    os.mkfifo(fifo)
    proc = subprocess.Popen(["qemu-aarch64", "-cpu", cpu, "-d", "in_asm,exec,nochain", "-D", fifo, driver, *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    tb_size: dict[int, int] = {}
    per_symbol: dict[str, int] = {}
    counting, done, executions = False, False, 0
    tb_pc, tb_n = None, 0
    with open(fifo, errors="replace") as log:
        for line in log:
            if line.startswith("Trace "):
                if done:
                    continue
                head, _, sym = line.partition("] ")
                pc = int(head.split("[", 1)[1].split("/")[1], 16)
                if pc == begin:
                    counting = True
                elif pc == end:
                    counting, done = False, True
                if counting:
                    n = tb_size[pc]
                    executions += 1
                    sym = sym.strip() or f"0x{pc:x}"
                    per_symbol[sym] = per_symbol.get(sym, 0) + n
            elif line.startswith("IN:"):
                tb_pc, tb_n = None, 0
            elif line.startswith("0x"):
                if tb_pc is None:
                    tb_pc = int(line.split(":", 1)[0], 16)
                tb_n += 1
            elif not line.strip() and tb_pc is not None:
                tb_size[tb_pc] = tb_n
                tb_pc = None
    out, err = proc.communicate()
    os.unlink(fifo)
    if proc.returncode != 0 or not done:
        raise SystemExit(f"qemu run {argv} failed (exit {proc.returncode}): {err[-2000:]}")
    info = dict(kv.split("=", 1) for kv in out.split())
    total = sum(per_symbol.values())
    return {"total": total, "tb_executions": executions, "info": info,
            "kernel": sum(v for k, v in per_symbol.items() if KERNEL_RE.search(k)),
            "act_quant": sum(v for k, v in per_symbol.items() if QUANT_RE.search(k) and not KERNEL_RE.search(k)),
            "top_symbols": sorted(per_symbol.items(), key=lambda kv: -kv[1])[:12]}


def cmd_dynamic(args) -> None:
    ensure_tools(need_qemu=True)
    vendor = llama_cpp_dir()
    drivers = {"a720": build_driver(vendor, "a720")}
    if args.dotprod_peer:
        drivers["dotprod"] = build_driver(vendor, "dotprod")
    weights_per_layer = sum(n * k for n, k in ((2048, 2048), (256, 2048), (256, 2048), (2048, 2048), (6144, 2048),
                                               (6144, 2048), (2048, 6144)))
    weights = weights_per_layer * args.layers
    # ggml is built for the A720's features (SVE2, I8MM), so it runs only on a CPU model that has them; with
    # --dotprod-peer a second ggml build for a dotprod-only CPU (Cortex-A76 class) runs its 4x4 kernels.
    configs = [  # (label, engine, format, qemu cpu, env)
        ("Shrike W4A8-G128, sve2 (default on SVE2+I8MM CPUs such as the A720)", "shrike", "int4", QEMU_SVE128,
         {"SHRIKE_ISA": "sve2"}),
        ("Shrike W4A8-G128, dotprod (also what i8mm runs at batch 1)", "shrike", "int4", QEMU_SVE128,
         {"SHRIKE_ISA": "dotprod"}),
        ("llama.cpp Q4_0, repacked (SVE 128 + I8MM: q4_0_4x8)", "llama", "int4", QEMU_SVE128, {}),
        ("Shrike W8A8, sve2 (default on SVE2+I8MM CPUs)", "shrike", "int8", QEMU_SVE128, {"SHRIKE_ISA": "sve2"}),
        ("Shrike W8A8, dotprod", "shrike", "int8", QEMU_SVE128, {"SHRIKE_ISA": "dotprod"}),
        ("llama.cpp Q8_0, repacked (SVE 128 + I8MM: q8_0_4x8)", "llama", "int8", QEMU_SVE128, {}),
    ]
    configs = [(*c, "a720") for c in configs]
    if args.dotprod_peer:
        configs += [("llama.cpp Q4_0, repacked (Cortex-A76, dotprod only: q4_0_4x4)", "llama", "int4", "cortex-a76", {},
                     "dotprod"),
                    ("llama.cpp Q8_0, repacked (Cortex-A76, dotprod only: q8_0_4x4)", "llama", "int8", "cortex-a76", {},
                     "dotprod"),
                    ("Shrike W4A8-G128 on a Cortex-A76 (dotprod)", "shrike", "int4", "cortex-a76", {}, "dotprod"),
                    ("Shrike W8A8 on a Cortex-A76 (dotprod)", "shrike", "int8", "cortex-a76", {}, "dotprod")]
    if args.only:
        configs = [c for c in configs if args.only in c[0]]
    rows = []
    for label, engine, fmt, cpu, env, peer in configs:
        print(f"== {label}", flush=True)
        r = count_instructions(drivers[peer], [engine, fmt, str(args.layers)], cpu, env)
        wbytes = float(r["info"]["weight_bytes"])
        r.update({"label": label, "engine": engine, "format": fmt, "qemu_cpu": cpu, "env": env, "weights": weights,
                  "weight_bytes": wbytes, "instructions_per_weight_byte": r["total"] / wbytes,
                  "instructions_per_32_weights": r["total"] * 32 / weights,
                  "kernel_instructions_per_32_weights": r["kernel"] * 32 / weights})
        print(f"   {r['total']:,} instructions; {r['instructions_per_weight_byte']:.3f} per weight byte; "
              f"{r['instructions_per_32_weights']:.2f} per 32 weights (kernel {r['kernel_instructions_per_32_weights']:.2f});"
              f" activation quantization {r['act_quant']:,}", flush=True)
        rows.append(r)
    meta = {"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "layers": args.layers,
            "qemu": run(["qemu-aarch64", "--version"]).stdout.splitlines()[0],
            "compiler": run(["aarch64-linux-gnu-g++", "--version"]).stdout.splitlines()[0],
            "llama_cpp": os.path.basename(os.path.dirname(os.path.dirname(vendor))),
            "shrike_commit": run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]).stdout.strip()}
    tag = args.tag or datetime.datetime.utcnow().strftime("%Y%m%d")
    os.makedirs(args.out_dir, exist_ok=True)
    jpath = os.path.join(args.out_dir, f"arm-qemu-counts-{tag}.json")
    with open(jpath, "w") as f:
        json.dump({"meta": meta, "runs": rows}, f, indent=1)
    mpath = os.path.join(args.out_dir, f"arm-qemu-counts-{tag}.md")
    with open(mpath, "w") as f:
        f.write(dynamic_markdown(rows, meta))
    print(f"wrote {jpath}\nwrote {mpath}")


def dynamic_markdown(rows: list[dict], meta: dict) -> str:
    out = [f"# qemu-user instruction counts: one decode step's linears, {meta['layers']}-layer MiniCPM5-2B shape ({meta['date']})",
           "", f"`python benchmarks/arm_kernels.py dynamic` — {meta['qemu']}; {meta['compiler']}, static; "
           f"llama.cpp (ggml) from {meta['llama_cpp']}; Shrike at {meta['shrike_commit']}.", "",
           "Batch 1, one thread, the 7 linears of each layer (q 2048x2048, k/v 256x2048, o 2048x2048, gate/up "
           "6144x2048, down 2048x6144); Shrike with bf16 activations and outputs, ggml with f32 (its graph "
           "quantizes them to Q8_0). Counted: every guest instruction between the driver's count_begin() and "
           "count_end() (the step after a warm-up step): kernels, activation quantization, dispatch and ggml's "
           "graph walk. Attention, norms, embedding and lm_head are not in the step.", "",
           "| run | qemu -cpu | instructions | per weight byte | per 32 weights | kernel per 32 weights | "
           "activation quantization | weight bytes |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['label']} | `{r['qemu_cpu']}` | {r['total']:,} | {r['instructions_per_weight_byte']:.3f} | "
                   f"{r['instructions_per_32_weights']:.2f} | {r['kernel_instructions_per_32_weights']:.2f} | "
                   f"{r['act_quant']:,} | {r['weight_bytes']:,.0f} |")
    out += ["", "Top symbols per run (instructions):", ""]
    for r in rows:
        top = ", ".join(f"`{s[:60]}` {n:,}" for s, n in r["top_symbols"][:5])
        out.append(f"- {r['label']}: {top}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------------
# projection for the CIX P1 board

P1_CORES = 8  # Cortex-A720 cores Shrike binds to (0,1,6-11); the 4 A520 are left out
P1_CLOCKS_GHZ = (2.3, 2.6)  # A720 cpufreq maxima reported on CIX P1 boards: 2.3 GHz (most) and 2.6 GHz (one core)
P1_READ_GBS = 44.0  # STREAM-like read measured on the board (FACTS.md section 9)
LLAMA_FRACTION = (0.75, 0.85)  # of that bandwidth llama.cpp decodes at on this SoC (FACTS.md section 9)
BODY_WEIGHTS = 42 * 47_185_920  # MiniCPM5-2B: 42 layers x (q, k, v, o, gate, up, down)
HEAD_WEIGHTS = 130_560 * 2048  # lm_head (untied)
REFERENCE = {"int4": 7.73, "int8": 4.69}
DENSE_KERNEL = "dotprod dense bf16 block<1,2>"
# Shrike's decode on x86 as a fraction of STREAM read (FACTS.md section 8): 14.6-16.1 tok/s x 1.555 GB against 46-58 GB/s
X86_SHRIKE_FRACTION = (14.6 * 1.555 / 58, 16.1 * 1.555 / 46)  # the reference system on the board, tok/s (FACTS.md section 9)


def cmd_project(args) -> None:
    mca_runs = {k["name"]: k for k in json.load(open(args.mca))["kernels"]}
    counts = json.load(open(args.counts))
    layers = counts["meta"]["layers"]

    def count(label_start):
        return next(r for r in counts["runs"] if r["label"].startswith(label_start))
    cases = [
        # (name, family, static kernel, dynamic run, body bytes per weight source, head bytes, head note)
        ("Shrike W4A8-G128, sve2 (today's default on the A720)", "int4", "sve2 W4A8-G128 rows_x_pass<1>",
         "Shrike W4A8-G128, sve2", 2 * HEAD_WEIGHTS, "bf16"),
        ("Shrike W4A8-G128, dotprod (SHRIKE_ISA=dotprod or i8mm)", "int4", "dotprod W4A8-G128 rows_x_tile<1>",
         "Shrike W4A8-G128, dotprod", 2 * HEAD_WEIGHTS, "bf16"),
        ("llama.cpp Q4_0 (output Q6_K)", "int4", "ggml_gemv_q4_0_4x8_q8_0", "llama.cpp Q4_0", HEAD_WEIGHTS * 210 / 256,
         "Q6_K"),
        ("Shrike W8A8, sve2 (today's default on the A720)", "int8", "sve2 W8A8 rows_x_pass<1>", "Shrike W8A8, sve2",
         2 * HEAD_WEIGHTS, "bf16"),
        ("Shrike W8A8, dotprod (SHRIKE_ISA=dotprod or i8mm)", "int8", "dotprod W8A8 rows_x_tile<1>",
         "Shrike W8A8, dotprod", 2 * HEAD_WEIGHTS, "bf16"),
        ("llama.cpp Q8_0 (output Q8_0)", "int8", "ggml_gemv_q8_0_4x8_q8_0", "llama.cpp Q8_0", HEAD_WEIGHTS * 34 / 32,
         "Q8_0"),
    ]
    f_lo, f_hi = P1_CLOCKS_GHZ
    lines = [f"# Decode projection for the CIX P1 board (8 x Cortex-A720, {P1_READ_GBS:.0f} GB/s): MiniCPM5-2B", "",
             "Written by `python benchmarks/arm_kernels.py project` from "
             f"`{os.path.relpath(args.mca, REPO)}` (llvm-mca) and `{os.path.relpath(args.counts, REPO)}` (qemu counts). "
             "Nothing here was run on an Arm CPU: it is a model, with every input listed.", "", "## Assumptions", "",
             f"- {P1_CORES} A720 cores compute (Shrike binds to them by itself; the A520s are left out), at "
             f"{f_lo}-{f_hi} GHz (cpufreq maxima of the P1's A720 cores as listed for a Radxa Orion O6 in sbc-bench "
             "issue 115: 2600 MHz for cpu0, 2300 for the others listed; CIX's developers state 2.6 / 2.5 GHz for the "
             "big cores in geerlingguy/sbc-reviews issue 62).",
             f"- Memory: {P1_READ_GBS:.0f} GB/s read, the STREAM-like figure measured on the board with 12 threads "
             "(102 GB/s on paper). llama.cpp decodes at about 75-85% of it there (3B and 8B models through Ollama).",
             "- Per token, every weight is read once from DRAM (2B parameters do not fit the caches); KV cache, "
             "norms, embedding row and attention are left out (a 43-token prompt adds ~4 MB of KV reads).",
             "- Kernel cycles per 32 weights are llvm-mca's (LLVM 19's Neoverse-N2 model, which it uses for "
             "-mcpu=cortex-a720), with all operands in L1: a lower bound on the core's time, which assumes the A720's "
             "SIMD back end matches the N2's as LLVM models it (2 x 128-bit pipes; 3-cycle sdot latency, seen in the "
             "single-accumulator SVE2 loops: 4 chained sdot per 12 cycles).",
             "- lm_head: Shrike keeps it bf16 (0.53 GB/token) on its dense GEMV (`dense_dotprod.cpp`, modelled like the "
             "others: block<1,2>, bf16 widened to fp32 and fmla); llama-quantize stores it Q6_K for Q4_0 and Q8_0 for "
             "Q8_0, whose GEMV is not modelled here, so llama.cpp's head counts as memory time only.",
             f"- Compute time = ({BODY_WEIGHTS:,} body weights x cycles per 32 + {HEAD_WEIGHTS:,} head weights x the "
             f"dense loop's cycles per 32) / 32 / ({P1_CORES} cores x clock); threads split the output columns evenly, "
             "no synchronisation cost; activation quantization, attention and norms left out.",
             "- Decode time per token is bracketed by two models: overlap (time = max(memory, compute), a perfect "
             "prefetching roofline) and serial (memory + compute, nothing hidden).", "",
             "## Bandwidth-bound or compute-bound", "",
             "| decode kernel | cycles / 32 w (mca) | instructions / 32 w (qemu, whole step) | weight bytes / 32 w | "
             "bytes per core-cycle it can consume | bytes per core-cycle the board delivers (8 cores, 2.3-2.6 GHz) | "
             "headroom | verdict |", "|---|---|---|---|---|---|---|---|"]
    rows, consume_of = [], {}
    for name, fam, kname, run_label, head_bytes, head_fmt in cases:
        k = mca_runs[kname]
        c = count(run_label)
        bytes_per_weight = c["weight_bytes"] / c["weights"]
        body_bytes = BODY_WEIGHTS * bytes_per_weight
        cyc32 = k["cycles_per_32"]
        consume = 32 * bytes_per_weight / cyc32
        deliver_hi = P1_READ_GBS / (P1_CORES * f_lo)  # fewer cycles per second -> more bytes per cycle
        deliver_lo = P1_READ_GBS / (P1_CORES * f_hi)
        verdict = "bandwidth-bound" if consume > deliver_hi else "compute-bound"
        consume_of[name] = consume
        lines.append(f"| {name} | {cyc32:.2f} | {c['instructions_per_32_weights']:.2f} | {32 * bytes_per_weight:.2f} | "
                     f"{consume:.2f} | {deliver_lo:.2f}-{deliver_hi:.2f} | {consume / deliver_hi:.1f}-{consume / deliver_lo:.1f}x | "
                     f"{verdict} |")
        mem_s = (body_bytes + head_bytes) / (P1_READ_GBS * 1e9)
        # Shrike's bf16 head runs the dense GEMV whose loop is modelled; llama.cpp's Q6_K / Q8_0 head is not.
        head_cyc32 = mca_runs[DENSE_KERNEL]["cycles_per_32"] if head_fmt == "bf16" else 0.0
        comp_s = [(BODY_WEIGHTS * cyc32 + HEAD_WEIGHTS * head_cyc32) / 32 / (P1_CORES * f * 1e9) for f in (f_hi, f_lo)]
        rows.append((name, fam, body_bytes, head_bytes, head_fmt, mem_s, comp_s))
    dense = mca_runs[DENSE_KERNEL]
    consume = 64 / dense["cycles_per_32"]
    consume_of["Shrike bf16 dense GEMV (lm_head)"] = consume
    lines.append(f"| Shrike bf16 dense GEMV (lm_head) | {dense['cycles_per_32']:.2f} | - | 64.00 | {consume:.2f} | "
                 f"{deliver_lo:.2f}-{deliver_hi:.2f} | {consume / deliver_hi:.1f}-{consume / deliver_lo:.1f}x | "
                 f"{'bandwidth-bound' if consume > deliver_hi else 'compute-bound'} |")
    headroom = [consume_of[n] / (P1_READ_GBS / (P1_CORES * f_lo)) for n in consume_of]
    bound = [n for n in consume_of if consume_of[n] <= P1_READ_GBS / (P1_CORES * f_lo)]
    lines += ["", (f"Every decode kernel, the slowest included, consumes weight bytes at least {min(headroom):.1f}x as fast "
                   "as 8 A720 cores are fed at 44 GB/s: by this model decode on the P1 is bandwidth-bound, and the "
                   "kernels' instructions per byte become the limit only with more bandwidth per core (the Neoverse-N2 "
                   "servers of the llama.cpp report)." if not bound else
                   f"Compute-bound by this model: {', '.join(bound)}."), "",
              "## Projected decode speed, MiniCPM5-2B", "",
              "| engine / kernel | body GB | head GB | GB per token | compute ms (2.6-2.3 GHz) | "
              "memory ms at 44 GB/s | tok/s, overlap, 100% of 44 GB/s | tok/s, overlap, 75-85% | tok/s, serial, 75% | "
              "reference system |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, fam, body_bytes, head_bytes, head_fmt, mem_s, comp_s in rows:
        total_gb = (body_bytes + head_bytes) / 1e9
        full = 1 / max(mem_s, comp_s[1])
        frac = [1 / max(mem_s / e, comp_s[1]) for e in LLAMA_FRACTION]
        serial = 1 / (mem_s / LLAMA_FRACTION[0] + comp_s[1])
        lines.append(f"| {name} | {body_bytes / 1e9:.3f} | {head_bytes / 1e9:.3f} ({head_fmt}) | {total_gb:.3f} | "
                     f"{comp_s[0] * 1e3:.1f}-{comp_s[1] * 1e3:.1f} | {mem_s * 1e3:.1f} | {full:.1f} | "
                     f"{frac[0]:.1f}-{frac[1]:.1f} | {serial:.1f} | {REFERENCE[fam]} |")
    by = {r[0]: r for r in rows}

    def gb(name):
        r = by[name]
        return (r[2] + r[3]) / 1e9
    s4, s4d, l4, s8, s8d, l8 = (c[0] for c in cases)
    lines += ["", "Reading it:", "",
              f"- The reference system's 7.73 tok/s (W4A8) and 4.69 (W8A8) are {7.73 * gb(s4):.1f} and "
              f"{4.69 * gb(s8):.1f} GB/s at Shrike's bytes per token: {7.73 * gb(s4) / P1_READ_GBS:.0%} and "
              f"{4.69 * gb(s8) / P1_READ_GBS:.0%} of the 44 GB/s.",
              f"- Against llama.cpp the difference is the bytes per token ({gb(s4):.2f} vs {gb(l4):.2f} GB for int4, "
              f"{gb(s8):.2f} vs {gb(l8):.2f} for int8): Shrike's lm_head is bf16, llama.cpp's Q6_K / Q8_0. At equal "
              f"bandwidth fractions Shrike W4A8 is projected at {gb(l4) / gb(s4):.2f}x llama.cpp Q4_0 and W8A8 at "
              f"{gb(l8) / gb(s8):.2f}x Q8_0.",
              f"- Measured on x86 (FACTS.md section 8: Zen 5, 2 threads, 14.6-16.1 tok/s at 1.555 GB per token against "
              f"46-58 GB/s STREAM) Shrike decoded this model at {X86_SHRIKE_FRACTION[0]:.0%}-{X86_SHRIKE_FRACTION[1]:.0%} "
              f"of STREAM, llama.cpp at ~69%. If that carries over, Shrike W4A8 lands at "
              f"{P1_READ_GBS * X86_SHRIKE_FRACTION[0] / gb(s4):.1f}-{P1_READ_GBS * X86_SHRIKE_FRACTION[1] / gb(s4):.1f} "
              f"tok/s and W8A8 at {P1_READ_GBS * X86_SHRIKE_FRACTION[0] / gb(s8):.1f}-"
              f"{P1_READ_GBS * X86_SHRIKE_FRACTION[1] / gb(s8):.1f}: the table is an upper bound until it runs there.",
              f"- The A720's default Arm level is sve2 (SVE2 and I8MM present), whose batch-1 loops are the slowest "
              f"modelled: W4A8 {mca_runs['sve2 W4A8-G128 rows_x_pass<1>']['cycles_per_32'] / mca_runs['dotprod W4A8-G128 rows_x_tile<1>']['cycles_per_32']:.2f}x "
              f"and W8A8 {mca_runs['sve2 W8A8 rows_x_pass<1>']['cycles_per_32'] / mca_runs['dotprod W8A8 rows_x_tile<1>']['cycles_per_32']:.2f}x "
              "the dotprod loop's cycles. Bandwidth-bound on the P1 that matters only in the serial model; on cores "
              "with more bandwidth each it decides the speed.", ""]
    out = args.out
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("static", "dynamic"):
        p = sub.add_parser(name)
        p.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks/results"))
        p.add_argument("--tag", default=None)
        if name == "dynamic":
            p.add_argument("--layers", type=int, default=2)
            p.add_argument("--dotprod-peer", action="store_true",
                           help="also build ggml for a dotprod-only CPU and count its 4x4 kernels under -cpu cortex-a76")
            p.add_argument("--only", default=None, help="run only the configurations whose label contains this")
        else:
            p.add_argument("--compiler", choices=("clang", "gcc"), default="clang",
                           help="compiler of the assembly llvm-mca models (clang-19, or Debian's GCC 12 cross compiler)")
    p = sub.add_parser("project")
    p.add_argument("--mca", required=True, help="JSON written by `static`")
    p.add_argument("--counts", required=True, help="JSON written by `dynamic`")
    p.add_argument("--out", required=True)
    sub.add_parser("selftest")
    args = ap.parse_args(argv)
    {"static": cmd_static, "dynamic": cmd_dynamic, "project": cmd_project, "selftest": cmd_selftest}[args.cmd](args)


if __name__ == "__main__":
    main()
