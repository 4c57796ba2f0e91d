// SnapKV's press class, shared with PyramidKV (which only changes the per-layer budget).
#pragma once
#include "press/press.h"

namespace kvtrim {

class SnapKVPress : public ScorerPress {
 public:
  SnapKVPress(Budget b, int64_t window, int64_t kernel, bool max_pool, bool query_aware)
      : ScorerPress(b), window_(window), kernel_(kernel), max_pool_(max_pool), query_aware_(query_aware) {}
  std::string name() const override { return "snapkv"; }
  PressNeeds needs() const override;
  void score_layer(const PressContext& ctx, int il, std::vector<std::vector<float>>* scores) const override;
  int64_t window() const { return window_; }

 private:
  int64_t window_, kernel_;
  bool max_pool_, query_aware_;
};

}  // namespace kvtrim

namespace kvtrim {
// SnapKV's options and factory (PyramidKV reuses them).
std::vector<PressOption> snapkv_press_options();
std::unique_ptr<SnapKVPress> make_snapkv_from_args(const PressArgs& a);
}  // namespace kvtrim
