// Helpers shared by the tests.
#pragma once
#include <cmath>
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
