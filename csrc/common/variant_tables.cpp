// Every op's variants table, collected for `shrike doctor` (each op's file describes its own).
#include "common/variants.h"

namespace shrike {

OpVariants rmsnorm_variants();
OpVariants silu_mul_variants();
OpVariants act_quant_variants();
OpVariants dense_variants();
OpVariants weight_only_variants();
OpVariants grouped_variants();
OpVariants attention_variants();
std::vector<OpVariants> linear_variants();
namespace lora {
OpVariants lora_variants();
}

std::vector<OpVariants> variant_tables() {
  std::vector<OpVariants> tables = linear_variants();
  for (OpVariants op : {act_quant_variants(), dense_variants(), weight_only_variants(), grouped_variants(), attention_variants(),
                        rmsnorm_variants(), silu_mul_variants(), lora::lora_variants()})
    tables.push_back(std::move(op));
  return tables;
}

}  // namespace shrike
