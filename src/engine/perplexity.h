// Perplexity over a token sequence with llama.cpp-compatible windows.
// Windows of n_ctx tokens start every `stride` tokens; each is evaluated from an empty cache
// with its first token replaced by BOS (when bos >= 0).
//  - stride == n_ctx: non-overlapping windows scoring their second half (llama.cpp's
//    perplexity tool), so the numbers compare with llama.cpp's;
//  - stride < n_ctx: each window scores its last `stride` tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

namespace kvtrim {

class Session;

struct PplResult {
  double ppl = 0;
  double ppl_stderr = 0;  // standard error of ppl (delta method on the mean NLL)
  double mean_nll = 0;
  int64_t n_scored = 0;
  int64_t n_windows = 0;
  double seconds = 0;
};

// Running negative log-likelihood of scored tokens (log-softmax in double), shared by the
// perplexity loops (full cache, compressed cache).
class NllAccumulator {
 public:
  // Adds -log softmax(logits)[target]; logits: [n_vocab].
  void add(const float* logits, size_t n_vocab, int32_t target);
  int64_t n() const { return n_; }
  double ppl_so_far() const;
  // Fills n_scored, mean_nll, ppl and ppl_stderr.
  void finish(PplResult* r) const;

 private:
  double sum_ = 0, sum2_ = 0;
  int64_t n_ = 0;
};

// tokens: the whole text (BOS first if the model adds one). progress(done, total, ppl_so_far)
// is called after each window. The session's cache is left holding the last window. Throws Error if tokens.size() < n_ctx or stride is out of range.
PplResult perplexity(Session& s, const std::vector<int32_t>& tokens, int64_t n_ctx, int64_t stride,
                     int32_t bos, const std::function<void(int64_t, int64_t, double)>& progress = {});

}  // namespace kvtrim
