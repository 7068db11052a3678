#!/usr/bin/env bash
# Cross-compiles the kernel library and its C++ consistency driver for aarch64 and runs the
# driver under qemu-user on three CPU models:
#   SVE at 128 bits (dotprod, i8mm and sve2 variants), SVE at 256 bits (sve2 again, at the
#   other vector length), Cortex-A76 (dotprod only: no I8MM, no SVE).
# Every variant must match the scalar reference bit for bit. Exits non-zero on any mismatch,
# on a missing variant, or on a build failure. The attention driver (test_attention_driver) runs
# on the first and last model and checks within float tolerance instead (exp and sums differ).
#   bash .ci/arm-kernels.sh            (build dir: $SHRIKE_ARM_BUILD, else build/arm-kernels in the checkout)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SHRIKE_ARM_BUILD:-$repo/build/arm-kernels}"

need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || command -v make >/dev/null || need+=(make)
if ((${#need[@]})); then
  echo "== installing ${need[*]}"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
echo "== cross-compiling into $build"
cmake -S "$repo/csrc/tests" -B "$build" "${generator[@]}" \
  -DCMAKE_TOOLCHAIN_FILE="$repo/cmake/aarch64-linux-gnu.cmake" >/dev/null
cmake --build "$build" -j 2
attention_driver="$build/test_attention_driver"
aarch64-linux-gnu-g++ -std=c++17 -O2 -I"$repo/csrc" "$repo/csrc/tests/test_attention_driver.cpp" \
  "$build/libshrike_kernels.a" -pthread -o "$attention_driver"

driver="$build/linear_consistency"
declare -a names=() results=()
run() {
  local name="$1" cpu="$2"
  shift 2
  echo "== $name (qemu -cpu $cpu)"
  local status=0
  qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu "$cpu" "$driver" --quick "$@" || status=$?
  names+=("$name")
  results+=("$([[ $status == 0 ]] && echo PASS || echo "FAIL (exit $status)")")
}

run "SVE 128-bit: dotprod, i8mm, sve2" "max,sve-default-vector-length=16" --expect dotprod,i8mm,sve2
run "SVE 256-bit: sve2" "max,sve-default-vector-length=32" --isa sve2
run "Cortex-A76: dotprod" "cortex-a76" --expect dotprod
driver="$attention_driver" run "attention, SVE 128-bit: all variants" "max,sve-default-vector-length=16" --expect dotprod,i8mm,sve2
driver="$attention_driver" run "attention, Cortex-A76" "cortex-a76" --expect dotprod

echo
echo "== Arm kernel summary"
failed=0
for i in "${!names[@]}"; do
  printf '  %-36s %s\n' "${names[$i]}" "${results[$i]}"
  [[ ${results[$i]} == PASS ]] || failed=1
done
exit $failed
