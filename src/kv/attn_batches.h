// Query-head batching shared by the attention kernel translation units (attn_kernels*.cpp):
// the group's query heads are processed in batches of at most kMaxBatch (8 -> 4 + 4,
// 9 -> 5 + 4), each by a kernel compiled for its batch size, whose accumulators stay in
// registers. Plain templates (no SIMD types): each Highway target instantiates its own.
#pragma once
#include <type_traits>

namespace kvtrim::kv {

constexpr int kMaxBatch = 6;
// f(g0, ng) for consecutive batches [g0, g0 + ng) covering [0, n_g), sizes as even as possible.
template <class F>
inline __attribute__((always_inline)) void for_batches(int n_g, const F& f) {
  const int nb = (n_g + kMaxBatch - 1) / kMaxBatch;
  for (int b = 0, g0 = 0; b < nb; ++b) {
    const int ng = n_g / nb + (b < n_g % nb ? 1 : 0);
    f(g0, ng);
    g0 += ng;
  }
}
// f(std::integral_constant<int, ng>()) for 1 <= ng <= kMaxBatch.
template <class F>
inline __attribute__((always_inline)) void with_batch(int ng, const F& f) {
  switch (ng) {
    case 1:
      return f(std::integral_constant<int, 1>());
    case 2:
      return f(std::integral_constant<int, 2>());
    case 3:
      return f(std::integral_constant<int, 3>());
    case 4:
      return f(std::integral_constant<int, 4>());
    case 5:
      return f(std::integral_constant<int, 5>());
    default:
      return f(std::integral_constant<int, 6>());
  }
}

}  // namespace kvtrim::kv
