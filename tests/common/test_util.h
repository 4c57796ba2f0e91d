// Helpers shared by the tests.
#pragma once
#include <string>

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

}  // namespace kvtrim::test
