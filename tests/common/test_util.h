// Helpers shared by the tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace kvtrim::test {

// Path of an installed real model ("smollm2", "qwen2.5-coder-1.5b", "gemma3-270m"):
// $KVTRIM_MODELS_DIR/<name>.gguf, else <source>/models/<name>.gguf. Model tests call
// require_model(), which fails the test (it does not skip: CI installs the models) with a
// message naming the install command when the file is missing.
std::string model_path(const std::string& name);
std::string require_model(const std::string& name);

// Directory with committed reference data (tests/data).
std::string data_dir();
// ../shared/data (evaluation data), or $KVTRIM_SHARED_DATA.
std::string shared_data_dir();

// A fresh empty temporary directory for one test (removed by the OS, not by the test).
std::string temp_dir(const std::string& tag);

// The message of the kvtrim::Error f throws ("" if it throws none).
std::string error_of(const std::function<void()>& f);

// n token ids in [0, n_vocab) from a linear congruential generator started at seed: the same
// ids on every platform (no <random> distribution involved).
inline std::vector<int32_t> random_tokens(int64_t n, int n_vocab, uint32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint32_t s = seed;
  for (int32_t& x : t) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<int32_t>((s >> 8) % static_cast<uint32_t>(n_vocab));
  }
  return t;
}

// max |a - b| / max(1, max |b|) over n values: the error of a against the reference b.
inline double rel_err(const float* a, const float* b, int64_t n) {
  double max_diff = 0, max_ref = 1;
  for (int64_t i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::fabs(double(a[i]) - b[i]));
    max_ref = std::max(max_ref, std::fabs(double(b[i])));
  }
  return max_diff / max_ref;
}

// Index of the first largest of x[0, n).
inline int argmax(const float* x, int64_t n) {
  return static_cast<int>(std::max_element(x, x + n) - x);
}

// A dictionary of N random unit-norm atoms of dimension d (Gaussian directions), as the cache and
// the coder take it: D [d, N] row-major, column j = atom j.
inline std::vector<float> random_dictionary(int d, int N, std::mt19937& rng) {
  std::normal_distribution<double> nd(0, 1);
  std::vector<float> D(static_cast<size_t>(d) * static_cast<size_t>(N));
  std::vector<double> a(static_cast<size_t>(d));
  for (int j = 0; j < N; ++j) {
    double nn = 0;
    for (double& x : a) {
      x = nd(rng);
      nn += x * x;
    }
    for (int i = 0; i < d; ++i) D[static_cast<size_t>(i) * N + j] = static_cast<float>(a[static_cast<size_t>(i)] / std::sqrt(nn));
  }
  return D;
}

}  // namespace kvtrim::test
