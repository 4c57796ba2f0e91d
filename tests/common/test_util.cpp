#include "test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"

namespace kvtrim::test {

namespace fs = std::filesystem;

std::string model_path(const std::string& name) {
  if (const char* d = std::getenv("KVTRIM_MODELS_DIR")) return std::string(d) + "/" + name + ".gguf";
  return std::string(KVTRIM_SOURCE_DIR) + "/models/" + name + ".gguf";
}

std::string require_model(const std::string& name) {
  std::string p = model_path(name);
  if (!fs::exists(p)) {
    ADD_FAILURE() << "model '" << name << "' is not installed at " << p
                  << " (run: python3 scripts/install_models.py " << name << ")";
  }
  return p;
}

std::string data_dir() { return KVTRIM_TEST_DATA_DIR; }

std::string shared_data_dir() {
  if (const char* d = std::getenv("KVTRIM_SHARED_DATA")) return d;
  return (fs::path(KVTRIM_SOURCE_DIR) / ".." / "shared" / "data").lexically_normal().string();
}

std::string temp_dir(const std::string& tag) {
  fs::path p = fs::temp_directory_path() /
               ("kvtrim_test_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace kvtrim::test
