# Kernel sources are grouped by op (csrc/<op>/) and named by ISA suffix:
#   *_ref.cpp     portable scalar reference, always built
#   *_avx2.cpp    x86-64 AVX2+FMA+F16C
#   *_avxvnni.cpp x86-64 AVX2 + AVX-VNNI (VEX vpdpbusd)
#   *_avx512vnni.cpp x86-64 AVX-512 F/BW/VL/DQ + VNNI
#   *_avx512bf16.cpp x86-64 AVX-512 + VNNI + BF16 (vdpbf16ps)
#   *_amx.cpp     x86-64 AVX-512 + VNNI + BF16 + VBMI + AMX-TILE/INT8/BF16 (tdpbssd, tdpbf16ps)
#   *_dotprod.cpp aarch64 NEON with SDOT
#   *_i8mm.cpp    aarch64 NEON with SMMLA
#   *_sve2.cpp    aarch64 SVE2 (vector-length agnostic)
# Each ISA file gets only its own target flags; the runtime dispatcher (csrc/common/isa.cpp)
# decides from cpuid / HWCAP which compiled variant runs.
file(GLOB_RECURSE SHRIKE_ALL_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
list(FILTER SHRIKE_ALL_SOURCES EXCLUDE REGEX "/bindings[^/]*\\.cpp$|/tests/")

# ISA suffix -> target flags; files of the other architecture's suffixes are left out.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set(SHRIKE_ISA_FLAGS_avx2 "-mavx2;-mfma;-mf16c")
  set(SHRIKE_ISA_FLAGS_avxvnni "-mavx2;-mfma;-mf16c;-mavxvnni")
  set(SHRIKE_ISA_FLAGS_avx512vnni "-mavx2;-mfma;-mf16c;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni")
  set(SHRIKE_ISA_FLAGS_avx512bf16 "-mavx2;-mfma;-mf16c;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512bf16")
  set(SHRIKE_ISA_FLAGS_amx "-mavx2;-mfma;-mf16c;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512bf16;-mavx512vbmi;-mamx-tile;-mamx-int8;-mamx-bf16")
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
  set(SHRIKE_ISA_FLAGS_dotprod "-march=armv8.2-a+dotprod")
  set(SHRIKE_ISA_FLAGS_i8mm "-march=armv8.6-a+dotprod+i8mm")
  set(SHRIKE_ISA_FLAGS_sve2 "-march=armv9-a+sve2+i8mm")
endif()

set(SHRIKE_SOURCES "")
foreach(src ${SHRIKE_ALL_SOURCES})
  if(src MATCHES "_(avx2|avxvnni|avx512vnni|avx512bf16|amx|dotprod|i8mm|sve2)\\.cpp$")
    if(NOT DEFINED SHRIKE_ISA_FLAGS_${CMAKE_MATCH_1})
      continue()
    endif()
    set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${SHRIKE_ISA_FLAGS_${CMAKE_MATCH_1}}")
  endif()
  list(APPEND SHRIKE_SOURCES ${src})
endforeach()

# The AMX and int16-dot attention kernels and their scalar models must round alike: no multiply-add fused
# unless written as one (the GNU dialect's default -ffp-contract=fast would fuse some in one file and not the other).
set_property(SOURCE ${CMAKE_CURRENT_LIST_DIR}/attention/attention_amx.cpp ${CMAKE_CURRENT_LIST_DIR}/attention/attention_amx_ref.cpp
                    ${CMAKE_CURRENT_LIST_DIR}/attention/attention_int16_avx512vnni.cpp
                    ${CMAKE_CURRENT_LIST_DIR}/attention/attention_int16_ref.cpp
                    ${CMAKE_CURRENT_LIST_DIR}/moe/moe.cpp ${CMAKE_CURRENT_LIST_DIR}/fused/packed_embedding.cpp
                    ${CMAKE_CURRENT_LIST_DIR}/lora/lora_ref.cpp ${CMAKE_CURRENT_LIST_DIR}/lora/lora_avx2.cpp
                    ${CMAKE_CURRENT_LIST_DIR}/lora/lora_avx512vnni.cpp
             APPEND PROPERTY COMPILE_OPTIONS -ffp-contract=off)

add_library(shrike_kernels STATIC ${SHRIKE_SOURCES})
target_include_directories(shrike_kernels PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_compile_options(shrike_kernels PRIVATE -O3 -fno-math-errno)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  target_compile_definitions(shrike_kernels PUBLIC SHRIKE_X86=1)
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
  target_compile_definitions(shrike_kernels PUBLIC SHRIKE_AARCH64=1)
endif()
find_package(Threads REQUIRED)
target_link_libraries(shrike_kernels PUBLIC Threads::Threads)
