// The LoRA update at the avx2 level: lora_impl.h compiled with this level's flags.
#include <algorithm>
#include <utility>
#include <vector>

#include "common/bf16.h"
#include "lora/lora.h"
#include "runtime/threadpool.h"

namespace shrike::lora::avx2 {
#include "lora/lora_impl.h"
}  // namespace shrike::lora::avx2
