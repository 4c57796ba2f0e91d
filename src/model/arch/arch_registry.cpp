// The table of supported architectures.
#include <cmath>

#include "model/arch/arch.h"

namespace kvtrim {

static const ArchInfo* const kArchs[] = {&kArchLlama, &kArchQwen2, &kArchQwen3, &kArchQwen3Moe, &kArchPhi3, &kArchGemma2, &kArchGemma3};

const ArchInfo& arch_info(Arch a) {
  for (const ArchInfo* ai : kArchs) {
    if (ai->arch == a) return *ai;
  }
  return kArchLlama;  // unreachable: every Arch has an entry
}

const ArchInfo* find_arch(std::string_view gguf_name) {
  for (const ArchInfo* ai : kArchs) {
    if (gguf_name == ai->gguf_name) return ai;
  }
  return nullptr;
}

std::string supported_archs() {
  std::string s;
  for (const ArchInfo* ai : kArchs) {
    if (!s.empty()) s += ", ";
    s += ai->gguf_name;
  }
  return s;
}

const char* arch_name(Arch a) {
  return arch_info(a).gguf_name;
}

}  // namespace kvtrim
