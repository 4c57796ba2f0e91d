// Writes a tiny random model (tests/common/tiny_model.h) for the script tests that drive the
// CLI (tests/kill_resume.sh): usage: write_tiny_model ARCH N_CTX_TRAIN OUT_DIR, prints the path.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tiny_model.h"

using namespace kvtrim;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s llama|qwen2|gemma3 N_CTX_TRAIN OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string a = argv[1];
  if (a != "llama" && a != "qwen2" && a != "gemma3") {
    std::fprintf(stderr, "write_tiny_model: unknown architecture '%s' (llama, qwen2, gemma3)\n", argv[1]);
    return 2;
  }
  const Arch arch = a == "llama" ? Arch::kLlama : a == "qwen2" ? Arch::kQwen2 : Arch::kGemma3;
  test::TinyModelSpec s = test::tiny_spec(arch, 1);
  s.n_ctx_train = std::atoi(argv[2]);
  if (s.n_ctx_train < 16) {
    std::fprintf(stderr, "write_tiny_model: N_CTX_TRAIN must be >= 16\n");
    return 2;
  }
  std::printf("%s\n", test::write_tiny_model(s, argv[3]).c_str());
  return 0;
}
