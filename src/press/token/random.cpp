// Random: keeps a uniformly random subset of each head's tokens (the baseline every method
// must beat). kvpress random_press.py. Deterministic: the score of a token is a hash of
// (seed, layer, kv head, position), so the same seed gives the same choice whatever the
// order of evaluation.
// Hyper-parameters (defaults): ratio = 0.5, budget = 0, seed = 0.
#include "press/press.h"

namespace kvtrim {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class RandomPress : public ScorerPress {
 public:
  RandomPress(Budget b, uint64_t seed) : ScorerPress(b), seed_(seed) {}
  std::string name() const override { return "random"; }
  void score_layer(const PressContext& ctx, int il, std::vector<std::vector<float>>* scores) const override {
    HeadData hd;
    for (int ih = 0; ih < ctx.n_head_kv(); ++ih) {
      ctx.read_head(il, ih, &hd, false, false);
      auto& sc = (*scores)[static_cast<size_t>(ih)];
      sc.resize(static_cast<size_t>(hd.n));
      for (size_t t = 0; t < static_cast<size_t>(hd.n); ++t)
        sc[t] = random_score(seed_, il, ih, hd.pos[t]);
    }
  }
  static float random_score(uint64_t seed, int il, int ih, int32_t pos) {
    const uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(il)) ^
                                  (static_cast<uint64_t>(ih) << 32 | static_cast<uint32_t>(pos)));
    return static_cast<float>(h >> 40) / static_cast<float>(1 << 24);
  }

 private:
  uint64_t seed_;
};

}  // namespace

PressInfo random_press_info() {
  PressInfo i;
  i.name = "random";
  i.description = "keep a seeded random subset of each head's tokens (baseline)";
  i.paper = "kvpress baseline (random_press.py)";
  i.options = budget_options();
  i.options.push_back({"seed", "0", "random seed"});
  i.axis = PressAxis::kToken;
  i.make = [](const PressArgs& a) -> std::unique_ptr<Press> {
    return std::make_unique<RandomPress>(a.get_budget(), static_cast<uint64_t>(a.get_int("seed")));
  };
  return i;
}

}  // namespace kvtrim
