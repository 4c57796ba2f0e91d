// Fuzz target "calibration": the calibration-file loader (a GGUF file of kvtrim's own
// layout, src/calib/calibration.cpp) over arbitrary bytes. Seeds: calibrations of tiny
// models (fuzz_make_seeds). The loader runs twice: as a user's file is read (with its
// checksum, which stops most tensor mutations), and with the checksum check off so that
// mutated shapes and values reach the checks behind it. What a press reads from a loaded
// file (ranks from energies, basis columns, statistics, layer samples) is then read too.
#include <cmath>

#include "calib/calibration.h"
#include "calib/stief_fits.h"
#include "fuzz_util.h"
#include "model/gguf.h"

using namespace kvtrim;

namespace {

void use(const Calibration& c) {
  for (BasisMethod m : c.methods()) {
    for (int il = 0; il < c.n_layer(); ++il) {
      for (int ih = 0; ih < c.n_head_kv(); ++ih) {
        const HeadFit& hf = c.fit(m, il, ih);
        for (const SideFit* s : {&hf.k, &hf.v}) {
          try {
            const int r = s->rank_for_energy(0.9);
            KVTRIM_FUZZ_ASSERT(r >= 1 && r <= s->d, "rank_for_energy gave %d for d = %d", r, s->d);
            (void)s->enc_cols(r);
            (void)s->dec_cols(r);
          } catch (const Error& e) {
            fuzz::check_error_message(e);
          }
        }
      }
    }
  }
  if (c.has_stief()) {  // StiefAttention's section: what its presses read
    const StiefFits& f = c.stief();
    for (RankAlloc a : {RankAlloc::kUniform, RankAlloc::kPareto, RankAlloc::kWeightedPareto})
      for (double eps : {0.0, 0.05, 1.0}) {
        const std::vector<LayerRankChoice> ch = allocate_ranks(f, a, eps);
        KVTRIM_FUZZ_ASSERT(static_cast<int>(ch.size()) == f.n_layer(), "allocation of %zu layers",
                           ch.size());
        for (const LayerRankChoice& x : ch)
          KVTRIM_FUZZ_ASSERT(x.ik >= 0 && x.ik <= f.n_cand() && x.iv >= 0 && x.iv <= f.n_cand(),
                             "candidate index out of range");
      }
    for (double tau : eigen_thresholds(f, 0.05))
      KVTRIM_FUZZ_ASSERT(tau > 0 && tau <= 1, "threshold %g", tau);
  }
  if (c.has_stats()) (void)c.stats(c.n_layer() - 1, c.n_head_kv() - 1).gram_k.size();
  if (c.has_layer_io()) (void)c.layer_io(c.n_layer() - 1).x_in.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<GgufFile> f;
  try {
    f = GgufFile::from_memory("fuzz.kvcalib", data, size);
  } catch (const Error& e) {
    fuzz::check_error_message(e);
    return 0;
  }
  for (bool verify : {true, false}) {
    try {
      use(Calibration::from_gguf(*f, nullptr, verify));
    } catch (const Error& e) {
      fuzz::check_error_message(e);
    }
  }
  return 0;
}
