// kvtrim eval mc: the data readers (good and malformed files), the scoring against a
// brute-force full prefill on a tiny random model, and resumable results.
#include "eval/mc.h"

#include <bzlib.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "engine/press_runner.h"
#include "engine/session.h"
#include "eval_fixture.h"
#include "press/press.h"

namespace kvtrim::eval {
namespace {

using test_support::tiny_model;
namespace fs = std::filesystem;

std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string p = (fs::path(dir) / name).string();
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
  return p;
}

// Expects an Error whose message contains `needle`.
template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

const char* kHella =
    "Roof shingle removal: A man is sitting on a roof. he\n"
    "3\n"
    "is using wrap to wrap a pair of skis.\n"
    "is ripping level tiles off.\n"
    "is holding a [header] rubik's cube.\n"
    "starts pulling up roofing on a roof.\n"
    "Family Life: How to play. [title] Visit a site like  [www.x.org] today.\n"
    "0\n"
    "a\n"
    "b\n"
    "c\n"
    "d\n";

TEST(McReaders, HellaswagPreprocess) {
  EXPECT_EQ(hellaswag_preprocess("  How to play. [title] Visit [www.x.org] it.  "), "How to play.. Visit it.");
  EXPECT_EQ(hellaswag_preprocess("a  b"), "a b");
}

TEST(McReaders, HellaswagGood) {
  const auto items = parse_hellaswag(kHella, "h.txt");
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].context, "Roof shingle removal: A man is sitting on a roof. he");
  EXPECT_EQ(items[0].gold, 3);
  ASSERT_EQ(items[0].choices.size(), 4u);
  EXPECT_EQ(items[0].choices[0], " is using wrap to wrap a pair of skis.");
  EXPECT_EQ(items[0].choices[2], " is holding a rubik's cube.");
  // Python's one-pass replace("  ", " ") leaves two of three spaces, as lm-eval does.
  EXPECT_EQ(items[1].context, "Family Life: How to play.. Visit a site like  today.");
  EXPECT_EQ(items[1].index, 1);
  EXPECT_NE(items[0].hash(), items[1].hash());
}

TEST(McReaders, HellaswagBz2) {
  const std::string dir = kvtrim::test::temp_dir("mc_bz2");
  std::string in = kHella;
  std::vector<char> out(in.size() * 2 + 600);
  unsigned int n = static_cast<unsigned int>(out.size());
  ASSERT_EQ(BZ2_bzBuffToBuffCompress(out.data(), &n, in.data(), static_cast<unsigned int>(in.size()), 9, 0, 0), BZ_OK);
  const std::string p = write(dir, "h.txt.bz2", std::string(out.data(), n));
  EXPECT_EQ(load_hellaswag(p).size(), 2u);
  const std::string bad = write(dir, "bad.txt.bz2", "not bzip2 at all");
  expect_error([&] { load_hellaswag(bad); }, "bad.txt.bz2: ");
  const std::string torn = write(dir, "torn.txt.bz2", std::string(out.data(), n / 2));
  expect_error([&] { load_hellaswag(torn); }, "torn.txt.bz2: not a valid bzip2 file");
}

TEST(McReaders, HellaswagMalformed) {
  std::string bad_gold = kHella;
  bad_gold.replace(bad_gold.find("\n0\n"), 3, "\n7\n");
  expect_error([&] { parse_hellaswag(bad_gold, "h.txt"); }, "h.txt:8: expected the gold index 0-3, got '7'");
  std::string short_file = kHella;
  short_file.resize(short_file.rfind("d\n"));
  expect_error([&] { parse_hellaswag(short_file, "h.txt"); }, "h.txt:11: the file ends inside an item");
  std::string empty_end = kHella;
  empty_end.replace(empty_end.find("\nb\n"), 3, "\n \n");
  expect_error([&] { parse_hellaswag(empty_end, "h.txt"); }, "h.txt:10: empty ending 1");
}

TEST(McReaders, HellaswagSharedFileIsSixLinesPerItem) {
  const std::string p = kvtrim::test::shared_data_dir() + "/hellaswag/hellaswag_val_full.txt.bz2";
  if (!fs::exists(p)) GTEST_SKIP() << p << " not present";
  const auto items = load_hellaswag(p);
  EXPECT_EQ(items.size(), 10042u);  // data/README.md
  for (const auto& it : items) ASSERT_EQ(it.choices.size(), 4u);
}

TEST(McReaders, Piqa) {
  const std::string jl =
      R"({"goal": "Open a jar", "sol1": "twist the lid", "sol2": "hit it"})"
      "\n\n"
      R"({"goal": "Boil water", "sol1": "freeze it", "sol2": "heat it"})"
      "\n";
  const auto items = parse_piqa(jl, "v.jsonl", "0\n1\n", "l.lst");
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].context, "Question: Open a jar\nAnswer:");
  EXPECT_EQ(items[0].choices[0], " twist the lid");
  EXPECT_EQ(items[1].gold, 1);
  expect_error([&] { parse_piqa(jl, "v.jsonl", "0\n", "l.lst"); }, "v.jsonl:3: has more items than labels");
  expect_error([&] { parse_piqa(jl, "v.jsonl", "0\n1\n1\n", "l.lst"); }, "l.lst:3: more labels than items");
  expect_error([&] { parse_piqa(jl, "v.jsonl", "0\n2\n", "l.lst"); }, "l.lst:2: expected a label 0 or 1");
  expect_error([&] { parse_piqa("{\"goal\": \"x\", \"sol1\": \"a\"}\n", "v.jsonl", "0\n", "l.lst"); },
               "v.jsonl:1: missing string field 'sol2'");
  expect_error([&] { parse_piqa("{\"goal\": \n", "v.jsonl", "0\n", "l.lst"); }, "v.jsonl:1: not valid JSON");
  // a number past double is a json out_of_range, not a parse_error (found by fuzz/eval_data)
  expect_error([&] { parse_piqa("{\"goal\": 2E1000000}\n", "v.jsonl", "0\n", "l.lst"); }, "v.jsonl:1: not valid JSON");
}

TEST(McReaders, CsvAndMmlu) {
  const std::string csv =
      "What is 1+1?,1,2,3,4,B\r\n"
      "\"Statement 1 | a, b. Statement 2 | \"\"q\"\"\nsecond line\",\"True, True\",x,y,z,D\n"
      "Last,a,b,c,d,A";
  const auto rows = parse_csv(csv, "s.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1].line, 2);
  EXPECT_EQ(rows[2].line, 4);
  EXPECT_EQ(rows[1].fields[0], "Statement 1 | a, b. Statement 2 | \"q\"\nsecond line");
  EXPECT_EQ(rows[1].fields[1], "True, True");
  const auto qs = parse_mmlu_csv(csv, "s.csv");
  ASSERT_EQ(qs.size(), 3u);
  EXPECT_EQ(qs[0].answer, 1);
  EXPECT_EQ(qs[1].answer, 3);
  EXPECT_EQ(mmlu_prompt("high_school_math", qs, 1, qs[2]),
            "The following are multiple choice questions (with answers) about high school math.\n\n"
            "What is 1+1?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: B\n\n"
            "Last\nA. a\nB. b\nC. c\nD. d\nAnswer:");
  expect_error([&] { parse_mmlu_csv("q,a,b,c,d,A\nq,a,b,c,E\n", "s.csv"); }, "s.csv:2: expected 6 fields");
  expect_error([&] { parse_mmlu_csv("q,a,b,c,d,A\n\nq,a,b,c,d,E\n", "s.csv"); }, "s.csv:3: the answer must be A");
  expect_error([&] { parse_csv("q,\"a,b\n", "s.csv"); }, "s.csv:1: unterminated quoted field");
  expect_error([&] { parse_csv("q,\"a\"b,c\n", "s.csv"); }, "s.csv:1: unexpected character 'b'");

  const std::string dir = kvtrim::test::temp_dir("mc_mmlu");
  fs::create_directories(fs::path(dir) / "dev");
  fs::create_directories(fs::path(dir) / "test");
  write(dir, "dev/anatomy_dev.csv", "D?,w,x,y,z,C\n");
  write(dir, "test/anatomy_test.csv", "T1?,w,x,y,z,A\nT2?,w,x,y,z,D\nT3?,w,x,y,z,B\n");
  write(dir, "dev/virology_dev.csv", "V?,w,x,y,z,A\n");
  write(dir, "test/virology_test.csv", "U1?,w,x,y,z,C\n");
  std::vector<std::string> subjects;
  const auto items = load_mmlu(dir, 1, &subjects);
  ASSERT_EQ(items.size(), 4u);
  // round robin over the subjects: anatomy 1, virology 1, anatomy 2, anatomy 3
  EXPECT_EQ(subjects, (std::vector<std::string>{"anatomy", "virology", "anatomy", "anatomy"}));
  std::vector<int> gold;
  for (const auto& it : items) gold.push_back(it.gold);
  EXPECT_EQ(gold, (std::vector<int>{0, 2, 3, 1}));
  for (size_t i = 0; i < items.size(); ++i) EXPECT_EQ(items[i].index, static_cast<int64_t>(i));
  EXPECT_EQ(items[0].choices[2], " C");
  EXPECT_NE(items[0].context.find("D?\nA. w\nB. x\nC. y\nD. z\nAnswer: C\n\nT1?"), std::string::npos);
  EXPECT_NE(items[1].context.find("about virology"), std::string::npos);
  expect_error([&] { load_mmlu(dir, 2); }, "--shots 2: the anatomy dev set has 1 questions");
}

// f32 keys/values: the cache path then differs from the full prefill only by summation order
// (with f16 storage, the context is rounded for the choices but not inside one batch, and the
// tiny random model's peaked logits amplify that).
SessionParams mc_params() {
  SessionParams p;
  p.n_ctx = 1024;
  p.n_threads = 2;
  p.kv_dtype = KvDtype::kF32;
  return p;
}

McItem tiny_item() {
  McItem it;
  it.index = 0;
  it.context = "Question: How do you keep bread fresh for a week?\nAnswer:";
  it.choices = {" Keep it in a sealed bag.", " Leave it out in the rain, uncovered.", " x"};
  it.gold = 0;
  return it;
}

TEST(McScoring, TruncateAndContinueEqualsFullPrefill) {
  Session s(tiny_model(), mc_params());
  const McItem it = tiny_item();
  const McTokens toks = tokenize_item(tiny_model(), it);
  ASSERT_EQ(toks.choices.size(), 3u);
  EXPECT_GT(toks.choices[1].size(), 5u);
  const McResult r = score_item(s, toks, it, "piqa", {});
  ASSERT_EQ(r.loglik.size(), 3u);
  for (size_t c = 0; c < 3; ++c) {
    std::vector<int32_t> all = toks.context;
    all.insert(all.end(), toks.choices[c].begin(), toks.choices[c].end());
    const double ref = loglik_full(s, all, toks.context.size());
    // Both paths run the same f32 sgemm kernels when the choice has >= 16 tokens (kGemmMinTok,
    // src/ops/matmul.cpp): equal up to summation order. A shorter choice is evaluated with
    // 8-bit quantised activations while the full prefill is not; the tiny random model's
    // peaked logits (~ -40 per token) make that visible, hence the looser bound.
    const double tol = toks.choices[c].size() >= 16 ? 1e-4 : 1e-2;
    EXPECT_NEAR(r.loglik[c], ref, tol * std::max(1.0, std::fabs(ref))) << "choice " << c;
    EXPECT_EQ(r.n_tokens[c], static_cast<int64_t>(toks.choices[c].size()));
    EXPECT_EQ(r.n_bytes[c], static_cast<int64_t>(it.choices[c].size()) - 1);
  }
  EXPECT_EQ(r.n_context, static_cast<int64_t>(toks.context.size()));
  // argmax consistency
  for (size_t c = 0; c < 3; ++c) EXPECT_LE(r.loglik[c], r.loglik[static_cast<size_t>(r.pred)]);
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_LE(r.loglik[c] / static_cast<double>(r.n_bytes[c]),
              r.loglik[static_cast<size_t>(r.pred_norm)] / static_cast<double>(r.n_bytes[static_cast<size_t>(r.pred_norm)]));
  }
  // Deterministic: the same item scores the same again.
  const McResult r2 = score_item(s, toks, it, "piqa", {});
  for (size_t c = 0; c < 3; ++c) EXPECT_EQ(r.loglik[c], r2.loglik[c]);
}

TEST(McScoring, CompressedContextHoldsFewerBytes) {
  SessionParams p = mc_params();
  p.kv_dtype = KvDtype::kF16;
  Session s(tiny_model(), p);
  s.set_press(make_press("streamingllm:ratio=0.5"), PressSchedule{false, 0, 0});
  const McItem it = tiny_item();
  const McTokens toks = tokenize_item(tiny_model(), it);
  int calls = 0;
  const McResult r = score_item(s, toks, it, "piqa", [&](Session& ss) {
    ++calls;
    EXPECT_EQ(ss.n_past(), static_cast<int32_t>(toks.context.size()));  // the choices are not seen
    ss.compress();
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(r.n_context, static_cast<int64_t>(toks.context.size()));
  EXPECT_LT(r.kv_bytes, r.kv_bytes_dense * 3 / 4);
  for (double ll : r.loglik) EXPECT_TRUE(std::isfinite(ll) && ll < 0);
}

McResult fake_result(int64_t index, int gold, int pred) {
  McResult r;
  r.bench = "piqa";
  r.index = index;
  r.item_hash = "h" + std::to_string(index);
  r.gold = gold;
  r.pred = r.pred_norm = pred;
  r.loglik = {-1, -2};
  r.n_tokens = {1, 2};
  r.n_bytes = {3, 4};
  r.kv_bytes = 50;
  r.kv_bytes_dense = 100;
  return r;
}

TEST(McResults, ResumeKeepsRowsAndIgnoresOtherConfigs) {
  const std::string dir = kvtrim::test::temp_dir("mc_results");
  const std::string path = (fs::path(dir) / "r.jsonl").string();
  fs::remove(path);
  McItem a = tiny_item();
  McResult ra = fake_result(0, 0, 0);
  ra.item_hash = a.hash();
  {
    McResultsFile f(path, "cfgA");
    EXPECT_FALSE(f.done("piqa", a));
    f.append(ra);
    f.append(fake_result(1, 1, 0));
  }
  {
    McResultsFile other(path, "cfgB");
    EXPECT_EQ(other.rows().size(), 0u);
    EXPECT_EQ(other.n_other_config(), 2);
    other.append(fake_result(0, 0, 1));
  }
  {
    std::ofstream f(path, std::ios::app);
    f << R"({"config": "cfgA", "bench": "piq)";  // a torn write
  }
  McResultsFile f(path, "cfgA");
  ASSERT_EQ(f.rows().size(), 2u);
  EXPECT_EQ(f.n_other_config(), 1);
  EXPECT_TRUE(f.done("piqa", a));
  EXPECT_EQ(f.rows()[0].loglik, ra.loglik);
  McItem changed = a;
  changed.gold = 1;
  expect_error([&] { (void)f.done("piqa", changed); }, "was scored on different data");
  const McSummary s = summarize(f.rows());
  EXPECT_EQ(s.n, 2);
  EXPECT_DOUBLE_EQ(s.acc, 0.5);
  EXPECT_DOUBLE_EQ(s.kv_ratio, 0.5);
  const std::string table = mc_summary_table("piqa", f.rows());
  EXPECT_NE(table.find("| piqa | 2 | 0.5000"), std::string::npos) << table;
  EXPECT_NE(table.find("**0.5000"), std::string::npos) << table;
  // rows without kv_bases (older files) leave the w/o-bases column empty
  EXPECT_EQ(s.n_with_bases, 0);
  EXPECT_NE(table.find("| 0.500 | — |"), std::string::npos) << table;
  // The torn line was cut off: the file ends with a newline.
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.back(), '\n');
}

// kv_bases: written, read back, set apart in the summary; a row written before it existed reads -1.
TEST(McResults, BasesSetApart) {
  const std::string path = testing::TempDir() + "/mc_bases.jsonl";
  std::remove(path.c_str());
  {
    McResultsFile f(path, "cfg");
    McResult a = fake_result(0, 0, 0), b = fake_result(1, 1, 1);
    a.kv_bases = 30;  // 50 held, 30 of them bases: 20 / 100 per item
    b.kv_bases = 10;  // 40 / 100
    f.append(a);
    f.append(b);
  }
  McResultsFile f(path, "cfg");
  ASSERT_EQ(f.rows().size(), 2u);
  EXPECT_EQ(f.rows()[0].kv_bases, 30);
  McSummary s = summarize(f.rows());
  EXPECT_EQ(s.n_with_bases, 2);
  EXPECT_DOUBLE_EQ(s.kv_ratio, 0.5);
  EXPECT_DOUBLE_EQ(s.kv_ratio_wo_bases, 0.3);
  EXPECT_NE(mc_summary_table("piqa", f.rows()).find("| 0.500 | 0.300 |"), std::string::npos);
  {
    std::ofstream o(path, std::ios::app);
    o << R"({"config":"cfg","bench":"piqa","index":2,"item_hash":"h2","gold":0,"pred":0,"pred_norm":0,)"
      << R"("acc":1,"acc_norm":1,"loglik":[-1,-2],"n_tokens":[1,2],"n_bytes":[3,4],"n_context":5,)"
      << R"("kv_bytes":50,"kv_bytes_dense":100,"seconds":0.1})" << "\n";
  }
  McResultsFile g(path, "cfg");
  ASSERT_EQ(g.rows().size(), 3u);
  EXPECT_EQ(g.rows()[2].kv_bases, -1);
  s = summarize(g.rows());
  EXPECT_EQ(s.n_with_bases, 2);  // the mean covers the rows that recorded bases
  EXPECT_DOUBLE_EQ(s.kv_ratio_wo_bases, 0.3);
  EXPECT_NE(mc_summary_table("piqa", g.rows()).find("| — |"), std::string::npos);  // not every row
}

}  // namespace
}  // namespace kvtrim::eval
