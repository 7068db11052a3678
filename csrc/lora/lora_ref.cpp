// The LoRA update as the portable scalar reference (lora_impl.h without target flags).
#include <algorithm>
#include <utility>
#include <vector>

#include "common/bf16.h"
#include "lora/lora.h"
#include "runtime/threadpool.h"

namespace shrike::lora::ref {
#include "lora/lora_impl.h"
}  // namespace shrike::lora::ref
