// The config recipes: each benchmark's hash is the part list results files were written with
// (committed results resume only while these hold), and the sample-set identities.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "eval/recipe.h"

namespace kvtrim::eval {
namespace {

namespace fs = std::filesystem;

TEST(EvalRecipe, FileIdentityIsNameAndSize) {
  const fs::path p = fs::temp_directory_path() / "kvtrim_recipe_test.bin";
  { std::ofstream(p) << "12345"; }
  EXPECT_EQ(file_identity(p.string()), "kvtrim_recipe_test.bin:5");
  fs::remove(p);
  EXPECT_EQ(file_identity("/nonexistent/x.gguf"), "x.gguf:0");
}

TEST(EvalRecipe, HashesArePinned) {
  const RunIdentity id{"/nonexistent/m.gguf", "f16", 256, "", ""};
  // the part lists the commands wrote their results with, in their order
  const std::string gen = generation_config(id, PromptFormat::kChat, "none", "src");
  EXPECT_EQ(gen, config_hash({"model=m.gguf:0", "format=chat", "kv=f16", "batch=256", "press=none",
                              "protocol=kvpress-v1", "src"}));
  EXPECT_EQ(gen, "81873e6c8169c259");
  EXPECT_EQ(mc_config(id, "piqa", "snapkv:ratio=0.5", "s"),
            config_hash({"model=m.gguf:0", "bench=piqa", "kv=f16", "batch=256", "press=snapkv:ratio=0.5",
                         "protocol=mc-loglik-v1", "s"}));
  PplConfig c;
  c.ctx = 512;
  c.mode = PplMode::kThroughout;
  c.chunk = 4;
  EXPECT_EQ(ppl_config(id, "/x/test.txt", c, "none"),
            config_hash({"model=m.gguf:0", "data=test.txt:0", "kv=f16", "batch=256", "press=none", "mode=throughout",
                         "ctx=512", "prefix=256", "chunk=4", "protocol=ppl-v1"}));

  std::vector<SweepCell> cells(1);
  set_generation_sweep_configs(&cells, id, PromptFormat::kBase, "src", "gsm8k", false);
  EXPECT_EQ(cells[0].config, config_hash({"model=m.gguf:0", "kv=f16", "batch=256", "format=base", "src",
                                          "press=none", "protocol=sweep-gsm8k-v1"}));
  EXPECT_EQ(cells[0].config, "9b40e46484046a53");
  set_generation_sweep_configs(&cells, id, PromptFormat::kChat, "src", "ruler", true);
  EXPECT_EQ(cells[0].config, config_hash({"model=m.gguf:0", "kv=f16", "batch=256", "format=chat", "src",
                                          "press=none", "protocol=sweep-ruler-query-aware-v1"}));
  set_mc_sweep_configs(&cells, id, "mmlu", "s");
  EXPECT_EQ(cells[0].config, config_hash({"model=m.gguf:0", "kv=f16", "batch=256", "bench=mmlu", "s", "press=none",
                                          "protocol=sweep-mc-loglik-v1"}));
  c.mode = PplMode::kPcc;
  set_ppl_sweep_configs(&cells, id, "/x/test.txt", c);
  EXPECT_EQ(cells[0].config, config_hash({"model=m.gguf:0", "data=test.txt:0", "kv=f16", "batch=256", "mode=pcc",
                                          "ctx=512", "prefix=256", "chunk=0", "press=none", "protocol=sweep-ppl-v1"}));
}

// The calibration a press reads joins the config right after the press, and only then (runs
// without one keep the hashes above): another calibration at the same path is another config.
TEST(EvalRecipe, CalibrationIsPartOfTheIdentity) {
  RunIdentity id{"/nonexistent/m.gguf", "f16", 256, "", ""};
  const std::string none_gen = generation_config(id, PromptFormat::kChat, "ksvd:ratio=0.5", "src");
  const std::string none_mc = mc_config(id, "mmlu", "ksvd:ratio=0.5", "s");
  PplConfig c;
  c.ctx = 512;
  const std::string none_ppl = ppl_config(id, "/x/test.txt", c, "ksvd:ratio=0.5");
  id.calib = "0123456789abcdef";
  EXPECT_EQ(generation_config(id, PromptFormat::kChat, "ksvd:ratio=0.5", "src"),
            config_hash({"model=m.gguf:0", "format=chat", "kv=f16", "batch=256", "press=ksvd:ratio=0.5",
                          "calib=0123456789abcdef", "protocol=kvpress-v1", "src"}));
  EXPECT_EQ(mc_config(id, "mmlu", "ksvd:ratio=0.5", "s"),
            config_hash({"model=m.gguf:0", "bench=mmlu", "kv=f16", "batch=256", "press=ksvd:ratio=0.5",
                         "calib=0123456789abcdef", "protocol=mc-loglik-v1", "s"}));
  EXPECT_EQ(ppl_config(id, "/x/test.txt", c, "ksvd:ratio=0.5"),
            config_hash({"model=m.gguf:0", "data=test.txt:0", "kv=f16", "batch=256", "press=ksvd:ratio=0.5",
                         "calib=0123456789abcdef", "mode=pcc", "ctx=512", "prefix=256", "chunk=0", "protocol=ppl-v1"}));
  EXPECT_NE(generation_config(id, PromptFormat::kChat, "ksvd:ratio=0.5", "src"), none_gen);
  EXPECT_NE(mc_config(id, "mmlu", "ksvd:ratio=0.5", "s"), none_mc);
  EXPECT_NE(ppl_config(id, "/x/test.txt", c, "ksvd:ratio=0.5"), none_ppl);
  id.calib = "fedcba9876543210";
  EXPECT_NE(generation_config(id, PromptFormat::kChat, "ksvd:ratio=0.5", "src"),
            config_hash({"model=m.gguf:0", "format=chat", "kv=f16", "batch=256", "press=ksvd:ratio=0.5",
                          "calib=0123456789abcdef", "protocol=kvpress-v1", "src"}));

  std::vector<SweepCell> cells(2);
  cells[1].spec = "ksvd:ratio=0.5";
  set_mc_sweep_configs(&cells, id, "mmlu", "s");
  const std::string before = cells[1].config;
  cells[1].calib = "0123456789abcdef";
  set_mc_sweep_configs(&cells, id, "mmlu", "s");
  EXPECT_EQ(cells[1].config, config_hash({"model=m.gguf:0", "kv=f16", "batch=256", "bench=mmlu", "s",
                                          "press=ksvd:ratio=0.5", "calib=0123456789abcdef",
                                          "protocol=sweep-mc-loglik-v1"}));
  EXPECT_NE(cells[1].config, before);
}

// The prefill precision changes the numerics of every forward pass: 8-bit runs (the CLI's default)
// get other hashes than f32 ones (--f32-prefill; a sweep never mixes rows of the two), and the f32
// runs' stay as pinned above, as they were before 8-bit prefill became the default.
TEST(EvalRecipe, Int8PrefillIsPartOfTheIdentity) {
  const RunIdentity f32{"/nonexistent/m.gguf", "f16", 256, "", ""}, int8{"/nonexistent/m.gguf", "f16", 256, "int8", ""};
  EXPECT_EQ(generation_config(int8, PromptFormat::kChat, "none", "src"),
            config_hash({"model=m.gguf:0", "format=chat", "kv=f16;prefill=int8", "batch=256", "press=none",
                         "protocol=kvpress-v1", "src"}));
  EXPECT_NE(generation_config(int8, PromptFormat::kChat, "none", "src"),
            generation_config(f32, PromptFormat::kChat, "none", "src"));
  std::vector<SweepCell> a(1), b(1);
  set_generation_sweep_configs(&a, f32, PromptFormat::kBase, "src", "gsm8k", false);
  set_generation_sweep_configs(&b, int8, PromptFormat::kBase, "src", "gsm8k", false);
  EXPECT_EQ(a[0].config, "9b40e46484046a53");
  EXPECT_NE(a[0].config, b[0].config);
}

TEST(EvalRecipe, SampleSetIdentities) {
  EXPECT_EQ(ruler_data_source("abc"), ruler_data_source("abc"));
  EXPECT_NE(ruler_data_source("abc"), ruler_data_source("abd"));
  EXPECT_EQ(gsm8k_source("/d/test.jsonl", 5, 256), "gsm8k=test.jsonl:0,shots=5,max_new=256");
  EXPECT_EQ(mc_source("mmlu", "/d/mmlu", 100, 5), "data=/d/mmlu:100,shots=5,order=rr");
  EXPECT_EQ(mc_source("piqa", "/d/piqa", 10, 0), "data=valid.jsonl:0,valid-labels.lst:0");
  EXPECT_EQ(mc_source("hellaswag", "/d/h.txt.bz2", 10, 0), "data=h.txt.bz2:0");
}

TEST(EvalRecipe, SharedDataPathNamesTheOption) {
  const fs::path dir = fs::temp_directory_path() / "kvtrim_recipe_shared";
  fs::create_directories(dir / "x");
  ::setenv("KVTRIM_SHARED_DATA", dir.string().c_str(), 1);
  EXPECT_EQ(shared_data_path("x", "--data DIR"), (dir / "x").string());
  try {
    shared_data_path("no/such/file.jsonl", "--data FILE");
    ADD_FAILURE() << "found a file that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no no/such/file.jsonl found (give --data FILE"), std::string::npos) << e.what();
  }
  ::unsetenv("KVTRIM_SHARED_DATA");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvtrim::eval
