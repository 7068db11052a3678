// One dispatch style for every op: a table of the op's variants, best first. A call runs the first
// entry whose level the active level includes (isa_at_least: same architecture, at or above) and whose
// condition accepts the call; the last entry is the scalar reference at level scalar, which accepts
// every call. Each op exposes its table's description (variant_tables(), printed by `shrike doctor`).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "common/isa.h"

namespace shrike {

template <typename Fn, typename Call>
struct Variant {
  Isa level;
  Fn fn;
  bool (*serves)(const Call&) = nullptr;  // null: every call at its level
  const char* condition = "";  // what `serves` asks, for people
  const char* name = nullptr;  // null: the level's name
};

template <typename Fn, typename Call, size_t N>
const Variant<Fn, Call>& pick_variant(const Variant<Fn, Call> (&table)[N], const Call& call) {
  for (size_t i = 0; i + 1 < N; ++i)
    if (isa_at_least(table[i].level) && (!table[i].serves || table[i].serves(call))) return table[i];
  return table[N - 1];
}

// One row of a table as doctor prints it.
struct VariantInfo {
  std::string name, condition;
};
struct OpVariants {
  std::string op;
  std::vector<VariantInfo> variants;  // best first
};

template <typename Fn, typename Call, size_t N>
OpVariants describe_variants(const char* op, const Variant<Fn, Call> (&table)[N]) {
  OpVariants out{op, {}};
  for (const auto& v : table) out.variants.push_back({v.name ? v.name : isa_name(v.level), v.condition});
  return out;
}

// Every op's table (common/variant_tables.cpp).
std::vector<OpVariants> variant_tables();

}  // namespace shrike
