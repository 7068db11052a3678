#include "common/isa.h"

#include <cstdlib>
#include <stdexcept>

#if defined(SHRIKE_X86)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#elif defined(SHRIKE_AARCH64)
#include <sys/auxv.h>
#endif

namespace shrike {
namespace {

#if defined(SHRIKE_X86)
// Linux enables the AMX tile data state per process, on request (arch_prctl ARCH_REQ_XCOMP_PERM
// for XFEATURE_XTILEDATA); without the grant the first tile instruction faults.
bool request_amx_state() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if defined(SHRIKE_X86)
  unsigned a, b, c, d;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    f.fma = c & (1u << 12);
    f.f16c = c & (1u << 29);
    bool osxsave = c & (1u << 27);
    unsigned xcr0 = 0;
    if (osxsave) {
      unsigned hi;
      __asm__("xgetbv" : "=a"(xcr0), "=d"(hi) : "c"(0));
    }
    bool ymm_enabled = (xcr0 & 6) == 6;
    if (ymm_enabled && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {
      f.avx2 = b & (1u << 5);
      bool zmm_enabled = (xcr0 & 0xe6) == 0xe6;
      // F (b16), DQ (b17), BW (b30), VL (b31)
      f.avx512 = zmm_enabled && (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31));
      f.avx512_vnni = f.avx512 && (c & (1u << 11));
      f.avx512_vbmi = f.avx512 && (c & (1u << 1));
      // AMX-BF16 (d22), AMX-TILE (d24), AMX-INT8 (d25); XCR0 bits 17-18 are the tile config and data
      // states. Every AMX CPU so far has both data types and VBMI, so one level covers them.
      bool amx_cpu = (d & (1u << 22)) && (d & (1u << 24)) && (d & (1u << 25)) && (xcr0 & 0x60000) == 0x60000;
      f.amx = f.avx512_vnni && f.avx512_vbmi && amx_cpu && request_amx_state();
      if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
        f.avx_vnni = a & (1u << 4);
        f.avx512_bf16 = f.avx512 && (a & (1u << 5));
      }
    }
  }
#elif defined(SHRIKE_AARCH64)
  unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  f.asimddp = hw & (1ul << 20);   // HWCAP_ASIMDDP
  f.sve = hw & (1ul << 22);       // HWCAP_SVE
  f.sve2 = hw2 & (1ul << 1);      // HWCAP2_SVE2
  f.i8mm = hw2 & (1ul << 13);     // HWCAP2_I8MM
  f.bf16 = hw2 & (1ul << 14);     // HWCAP2_BF16
#endif
  return f;
}

bool compiled(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
#if defined(SHRIKE_X86)
    case Isa::avx2:
    case Isa::avxvnni:
    case Isa::avx512vnni:
    case Isa::avx512bf16:
    case Isa::amx: return true;
#elif defined(SHRIKE_AARCH64)
    case Isa::dotprod:
    case Isa::i8mm:
    case Isa::sve2: return true;
#endif
    default: return false;
  }
}

bool cpu_runs(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::scalar: return true;
    case Isa::avx2: return f.avx2 && f.fma && f.f16c;
    case Isa::avxvnni: return f.avx2 && f.fma && f.f16c && f.avx_vnni;
    case Isa::avx512vnni: return f.avx2 && f.fma && f.f16c && f.avx512_vnni;
    case Isa::avx512bf16: return f.avx2 && f.fma && f.f16c && f.avx512_vnni && f.avx512_bf16;
    case Isa::amx: return f.avx2 && f.fma && f.f16c && f.avx512_vnni && f.avx512_bf16 && f.amx;
    case Isa::dotprod: return f.asimddp;
    case Isa::i8mm: return f.asimddp && f.i8mm;
    case Isa::sve2: return f.sve2 && f.i8mm;
  }
  return false;
}

Isa best_available() {
  for (int i = kNumIsas - 1; i > 0; --i)
    if (isa_available(static_cast<Isa>(i))) return static_cast<Isa>(i);
  return Isa::scalar;
}

Isa parse_isa(const std::string& name) {
  for (int i = 0; i < kNumIsas; ++i) {
    Isa isa = static_cast<Isa>(i);
    if (name == isa_name(isa)) {
      if (!isa_available(isa)) break;
      return isa;
    }
  }
  std::string avail;
  for (int i = 0; i < kNumIsas; ++i)
    if (isa_available(static_cast<Isa>(i))) avail += std::string(avail.empty() ? "" : ", ") + isa_name(static_cast<Isa>(i));
  throw std::invalid_argument("kernel variant '" + name + "' is not available on this CPU/build; available: " + avail);
}

Isa initial_isa() {
  const char* forced = std::getenv("SHRIKE_ISA");
  if (forced && *forced) return parse_isa(forced);
  return best_available();
}

Isa g_active = Isa::scalar;
bool g_active_set = false;

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

const char* isa_name(Isa isa) {
  static const char* names[kNumIsas] = {"scalar", "avx2",    "avxvnni", "avx512vnni", "avx512bf16",
                                        "amx",    "dotprod", "i8mm",    "sve2"};
  return names[static_cast<int>(isa)];
}

bool isa_available(Isa isa) { return compiled(isa) && cpu_runs(isa); }

Isa active_isa() {
  if (!g_active_set) {
    g_active = initial_isa();
    g_active_set = true;
  }
  return g_active;
}

bool isa_at_least(Isa level) {
  Isa a = active_isa();
  if (level == Isa::scalar) return true;
  bool a_x86 = a >= Isa::avx2 && a <= Isa::amx, l_x86 = level >= Isa::avx2 && level <= Isa::amx;
  return a_x86 == l_x86 && a != Isa::scalar && static_cast<int>(a) >= static_cast<int>(level);
}

void set_active_isa(const std::string& name) {
  g_active = parse_isa(name);
  g_active_set = true;
}

}  // namespace shrike
