// aarch64 baseline variant of the attention walk: the plain NEON float loops of attention_neon.h
// (the file suffix only names the aarch64 baseline build).
#include "attention/attention_neon.h"

namespace shrike::dotprod {

void attend(const PagedAttentionArgs& args, const AttentionWorkItem& item, float* scratch) {
  attention_detail::attend<neon_attention::NeonVec>(args, item, scratch);
}

}  // namespace shrike::dotprod
