// Fuzz target "eval_data": the readers of evaluation data and of results files being resumed
// (src/eval/jsonl.h, mc.h, ruler.h). Byte 0 picks the reader, the rest is the file's text:
//   0 RULER-style samples JSONL      1 HellaSwag (6 lines per item)   2 PIQA (jsonl \n--\n labels)
//   3 CSV                            4 MMLU CSV                       5 a RULER task list
//   6 a results JSONL being resumed (read_results_rows over a file, torn last line included)
//   7 GSM8K test.jsonl (src/eval/gsm8k.h), then the answer extraction over the same text
// Readers either return items or throw Error "<source>:<line>: <problem>"; what they return
// must be well formed (a sample has a context and questions, a multiple-choice item a gold
// index inside its choices).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "eval/gsm8k.h"
#include "eval/jsonl.h"
#include "eval/mc.h"
#include "eval/ruler.h"
#include "fuzz_util.h"

using namespace kvtrim;
using namespace kvtrim::eval;

namespace {

void check_items(const std::vector<McItem>& items) {
  for (const McItem& it : items)
    KVTRIM_FUZZ_ASSERT(it.gold >= 0 && it.gold < static_cast<int>(it.choices.size()), "gold %d of %zu choices",
                       it.gold, it.choices.size());
}

void run(int which, const std::string& text) {
  switch (which) {
    case 0: {
      for (const EvalSample& s : parse_samples_jsonl(text, "fuzz.jsonl"))
        KVTRIM_FUZZ_ASSERT(!s.questions.empty(), "a sample without questions");
      break;
    }
    case 1:
      check_items(parse_hellaswag(text, "fuzz.txt"));
      break;
    case 2: {
      const auto f = fuzz::split_fields(text);
      check_items(parse_piqa(f[0], "valid.jsonl", f.size() > 1 ? f[1] : "", "valid-labels.lst"));
      break;
    }
    case 3:
      (void)parse_csv(text, "fuzz.csv");
      break;
    case 4:
      for (const MmluQuestion& q : parse_mmlu_csv(text, "fuzz.csv"))
        KVTRIM_FUZZ_ASSERT(q.answer >= 0 && q.answer < 4, "answer %d", q.answer);
      break;
    case 5:
      for (const std::string& t : parse_task_list(text)) (void)ruler_task(t);
      break;
    case 7: {
      const auto a = gsm8k_extract_answer(text);  // any text is a model output
      KVTRIM_FUZZ_ASSERT(!a || !a->empty(), "an empty extracted answer");
      const double m = number_match(text, {"18"});
      KVTRIM_FUZZ_ASSERT(m == 0 || m == 100, "number_match %g", m);
      for (const Gsm8kItem& it : parse_gsm8k(text, "test.jsonl")) {
        KVTRIM_FUZZ_ASSERT(!it.question.empty() && !it.answer.empty(), "an item without question or answer");
        KVTRIM_FUZZ_ASSERT(it.solution.find("<<") == std::string::npos || it.solution.find(">>") == std::string::npos ||
                               it.solution.find("<<") > it.solution.rfind(">>"),
                           "an annotation left in the solution");
      }
      break;
    }
    default: {
      static const std::string path = "/tmp/kvtrim_fuzz_results_" + std::to_string(::getpid()) + ".jsonl";
      {
        std::ofstream o(path, std::ios::binary | std::ios::trunc);
        o << text;
      }
      int64_t n_other = 0;
      bool torn = false;
      read_results_rows(
          path, "fuzz", "results row", "--out", [](const std::string& c) { return c == "a"; },
          [](const nlohmann::json& row) { (void)row.at("score").get<double>(); }, &n_other, &torn);
      std::remove(path.c_str());
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    run(data[0] % 8, text);
  } catch (const Error& e) {
    fuzz::check_error_message(e);
  }
  return 0;
}
