// kvtrim's Jinja interpreter against transformers + jinja2 (tests/data/chat_template_refs.json,
// made by scripts/ref/make_chat_template_refs.py): the published chat templates of Llama 3.1 /
// 3.2, Qwen2.5 (+ Coder), Qwen3, Gemma 2 / 3, Phi-3.5, Mistral, Mistral-Nemo, SmolLM2 / 3,
// DeepSeek-R1 and kvtrim's features.jinja, each over the same conversations: byte-identical
// prompts, and an error wherever transformers raised one (with raise_exception's message).
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/jinja/jinja.h"

namespace kvtrim::jinja {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(JinjaRefs, PublishedTemplatesRenderAsTransformers) {
  const auto doc = nlohmann::ordered_json::parse(slurp(std::string(KVTRIM_TEST_DATA_DIR) + "/chat_template_refs.json"));
  RenderOptions opt;
  opt.now = doc.at("strftime_now_epoch").get<std::time_t>();
  std::map<std::string, Template> templates;
  size_t n_rendered = 0, n_errors = 0;
  std::map<std::string, int> per_template;
  for (const auto& c : doc.at("cases")) {
    const std::string name = c.at("template");
    auto it = templates.find(name);
    if (it == templates.end()) {
      const std::string path = std::string(KVTRIM_TEST_DATA_DIR) + "/chat_templates/" + name + ".jinja";
      it = templates.emplace(name, Template(slurp(path), name)).first;
    }
    Dict vars;
    vars.set("messages", Value::from_json(c.at("messages")));
    vars.set("tools", Value::from_json(c.at("tools")));
    vars.set("documents", Value::none());
    vars.set("add_generation_prompt", Value(c.at("add_generation_prompt").get<bool>()));
    for (auto kv = c.at("vars").begin(); kv != c.at("vars").end(); ++kv) vars.set(kv.key(), Value::from_json(kv.value()));
    const std::string label = name + "/" + c.at("case").get<std::string>();
    ++per_template[name];
    if (c.contains("rendered")) {
      std::string got;
      try {
        got = it->second.render(vars, opt);
      } catch (const Error& e) {
        ADD_FAILURE() << label << ": kvtrim raised " << e.what();
        continue;
      }
      EXPECT_EQ(got, c.at("rendered").get<std::string>()) << label;
      ++n_rendered;
    } else {
      try {
        const std::string got = it->second.render(vars, opt);
        ADD_FAILURE() << label << ": transformers raised '" << c.at("error").get<std::string>()
                      << "', kvtrim rendered:\n" << got;
      } catch (const Error& e) {
        if (c.at("raised").get<bool>()) {  // raise_exception(message): the message is kept
          EXPECT_EQ(std::string(e.what()), name + ": " + c.at("error").get<std::string>()) << label;
        }
        ++n_errors;
      }
    }
  }
  EXPECT_EQ(templates.size(), 16u);
  EXPECT_GE(n_rendered, 110u);
  EXPECT_GE(n_errors, 15u);
  for (const auto& [name, n] : per_template) EXPECT_GE(n, 9) << name;
}

}  // namespace
}  // namespace kvtrim::jinja
