#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/session.h"

namespace kvtrim {

namespace fs = std::filesystem;

namespace {
struct Alias { const char* alias; const char* name; };
constexpr Alias kAliases[] = {
    {"smollm2", "smollm2"},        {"smollm2-135m", "smollm2"},
    {"qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b"}, {"qwen", "qwen2.5-coder-1.5b"},
    {"qwen2.5", "qwen2.5-coder-1.5b"}, {"qwen2.5-1.5b", "qwen2.5-coder-1.5b"},
    {"gemma3-270m", "gemma3-270m"}, {"gemma3", "gemma3-270m"}, {"gemma", "gemma3-270m"},
};

std::vector<fs::path> model_dirs() {
  std::vector<fs::path> dirs;
  if (const char* d = std::getenv("KVTRIM_MODELS_DIR")) dirs.emplace_back(d);
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    dirs.push_back(exe.parent_path() / ".." / ".." / "models");  // build/<preset>/kvtrim
    dirs.push_back(exe.parent_path() / ".." / "models");
  }
  dirs.emplace_back("models");
  if (const char* h = std::getenv("HOME")) dirs.push_back(fs::path(h) / ".local" / "share" / "kvtrim" / "models");
  return dirs;
}
}  // namespace

std::vector<std::string> known_model_names() { return {"smollm2", "qwen2.5-coder-1.5b", "gemma3-270m"}; }

std::string resolve_model_path(const std::string& arg) {
  KVTRIM_CHECK(!arg.empty(), "no model given (-m NAME or -m FILE.gguf)");
  std::error_code ec;
  if (fs::is_regular_file(arg, ec)) return arg;
  std::string name = arg;
  bool known = false;
  for (const auto& a : kAliases)
    if (arg == a.alias) {
      name = a.name;
      known = true;
    }
  const bool looks_like_path = arg.find('/') != std::string::npos || arg.ends_with(".gguf");
  if (looks_like_path && !known) fail("model file '%s' does not exist", arg.c_str());
  std::string searched;
  for (const auto& d : model_dirs()) {
    fs::path p = (d / (name + ".gguf")).lexically_normal();
    if (fs::is_regular_file(p, ec)) return p.string();
    searched += "\n  " + p.string();
  }
  if (!known)
    fail("unknown model '%s': not a file, and not an installed model name (known: smollm2, "
         "qwen2.5-coder-1.5b, gemma3-270m)", arg.c_str());
  fail("model '%s' is not installed; looked in:%s\ninstall it with: python3 scripts/install_models.py %s",
       arg.c_str(), searched.c_str(), name.c_str());
}

}  // namespace kvtrim
