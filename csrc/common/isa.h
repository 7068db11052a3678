// Instruction-set variants the kernels are compiled for, and which one runs.
#pragma once
#include <string>

namespace shrike {

// Levels, best last within each architecture. On x86 each level includes the ones before it:
// avxvnni = AVX2 + VEX vpdpbusd; avx512vnni = AVX-512 F/BW/VL/DQ + vpdpbusd; avx512bf16 adds
// vdpbf16ps; amx adds the AMX tile unit with INT8 and BF16 (Linux: the process must be granted the tile
// state, which detection requests). An op without a variant of its own at a level runs its best variant below it
// (isa_at_least), so forcing a level with SHRIKE_ISA never selects code the CPU cannot run.
enum class Isa : int {
  scalar = 0, avx2 = 1, avxvnni = 2, avx512vnni = 3, avx512bf16 = 4, amx = 5, dotprod = 6, i8mm = 7, sve2 = 8
};
constexpr int kNumIsas = 9;

struct CpuFeatures {
  // x86
  bool avx2 = false, fma = false, f16c = false, avx_vnni = false;
  bool avx512 = false;  // F, BW, VL, DQ with the OS saving zmm state
  bool avx512_vnni = false, avx512_bf16 = false, avx512_vbmi = false;
  bool amx = false;  // AMX-TILE + AMX-INT8 + AMX-BF16 (and AVX512-VBMI), tile state enabled by the OS and granted to this process
  // aarch64
  bool asimddp = false, i8mm = false, sve = false, sve2 = false, bf16 = false;
};

const CpuFeatures& cpu_features();
const char* isa_name(Isa isa);
// Compiled into this build and runnable on this CPU.
bool isa_available(Isa isa);
// The variant kernels use: the best available, or SHRIKE_ISA / set_active_isa when given.
Isa active_isa();
// True when the active level is `level` or a later level of the same architecture.
bool isa_at_least(Isa level);
// Throws std::invalid_argument naming the available variants when `name` is not one.
void set_active_isa(const std::string& name);

}  // namespace shrike
