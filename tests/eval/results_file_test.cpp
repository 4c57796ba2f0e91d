// ResultsFile<Row, Key> (eval/results_file.h), the one results file under every evaluation, on a
// toy row: resume, other configs kept and counted, a torn last line cut off, duplicates (the first
// counts), a changed input under the same key an error naming the file, the item and the flag, and
// a malformed line an error naming its line.
#include "eval/results_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/error.h"
#include "test_util.h"

namespace kvtrim::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ToyRow {
  std::string id, hash;
  int value = 0;
};

const ResultsFormat<ToyRow, std::string> kToy = {
    "toy", "toy results line", "--toy-out",
    [](const json& j) { return ToyRow{j.at("id").get<std::string>(), j.at("hash").get<std::string>(), j.at("value").get<int>()}; },
    [](const ToyRow& r, const std::string& config) {
      return json{{"config", config}, {"id", r.id}, {"hash", r.hash}, {"value", r.value}}.dump();
    },
    [](const ToyRow& r) { return r.id; },
    [](const ToyRow& r) -> const std::string& { return r.hash; }};

using ToyFile = ResultsFile<ToyRow, std::string>;

std::string fresh(const char* name) {
  const std::string p = (fs::path(test::temp_dir("results_file")) / name).string();
  fs::remove(p);
  return p;
}
std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void write_all(const std::string& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

TEST(ResultsFile, AppendsOneFlushedLineAndResumes) {
  const std::string p = fresh("resume.jsonl");
  {
    ToyFile f(p, kToy, {"A"});
    EXPECT_TRUE(f.rows().empty());
    f.append({"x", "hx", 1});
    EXPECT_EQ(read_all(p), R"({"config":"A","hash":"hx","id":"x","value":1})" "\n");  // on disk at once
    f.append({"y", "hy", 2});
  }
  ToyFile g(p, kToy, {"A"});
  ASSERT_EQ(g.rows().size(), 2u);
  EXPECT_EQ(g.rows()[1].value, 2);
  EXPECT_TRUE(g.done("x", "hx", "toy x", "changed"));
  EXPECT_FALSE(g.done("z", "hz", "toy z", "changed"));
  ASSERT_NE(g.find("y"), nullptr);
  EXPECT_EQ(g.find("y")->hash, "hy");
}

TEST(ResultsFile, OtherConfigsStayInTheFileAndAreCounted) {
  const std::string p = fresh("configs.jsonl");
  {
    ToyFile a(p, kToy, {"A"});
    a.append({"x", "hx", 1});
  }
  ToyFile b(p, kToy, {"B"});
  EXPECT_TRUE(b.rows().empty());
  EXPECT_EQ(b.n_other_config(), 1);
  b.append({"x", "hx", 5});
  ToyFile every(p, kToy, {}, /*every_config=*/true);
  EXPECT_EQ(every.rows().size(), 1u);  // the same key twice: the first line counts
  EXPECT_EQ(every.rows()[0].value, 1);
  ToyFile both(p, kToy, {"A", "B"});
  EXPECT_EQ(both.n_other_config(), 0);
}

TEST(ResultsFile, ATornLastLineIsCutOffAndRunsAgain) {
  const std::string p = fresh("torn.jsonl");
  write_all(p, R"({"config":"A","hash":"hx","id":"x","value":1})" "\n" R"({"config":"A","hash":"hy","id")");
  ToyFile f(p, kToy, {"A"});
  EXPECT_EQ(f.rows().size(), 1u);
  EXPECT_EQ(f.n_dropped_torn(), 1);
  EXPECT_FALSE(f.done("y", "hy", "toy y", "changed"));
  f.append({"y", "hy", 2});
  ToyFile g(p, kToy, {"A"});
  EXPECT_EQ(g.rows().size(), 2u);
  EXPECT_EQ(g.n_dropped_torn(), 0);
}

TEST(ResultsFile, AChangedInputUnderTheSameKeyIsAnError) {
  const std::string p = fresh("changed.jsonl");
  {
    ToyFile f(p, kToy, {"A"});
    f.append({"x", "hx", 1});
  }
  ToyFile f(p, kToy, {"A"});
  const std::string msg = test::error_of([&] { (void)f.done("x", "other", "toy x", "was made from other data"); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("toy x was made from other data (hash hx, now other)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--toy-out"), std::string::npos) << msg;
}

TEST(ResultsFile, AMalformedLineIsAnErrorNamingItsLine) {
  const std::string p = fresh("bad.jsonl");
  write_all(p, R"({"config":"A","hash":"hx","id":"x","value":1})" "\n" R"({"config":"A","id":"y"})" "\n");
  const std::string msg = test::error_of([&] { ToyFile f(p, kToy, {"A"}); });
  EXPECT_NE(msg.find(p + ":2: not a toy results line"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--toy-out"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kvtrim::eval
