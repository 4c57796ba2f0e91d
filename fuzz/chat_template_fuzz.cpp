// Fuzz target "chat_template": the chat templates (model/chat_template.cpp): the Jinja
// interpreter (model/jinja/) on an arbitrary template, and the built-ins.
// Input fields (separated by "\n--\n"): a selector, template text, then role / content
// pairs. The selector's first byte decides add_generation_prompt (bit 0) and the template: a
// selector starting with "chatml" or "gemma" picks that built-in (the template text is ignored),
// anything else runs the template text as Jinja.
// Properties: anything but a clean render or a kvtrim::Error is a failure (no crash, no hang:
// loops are bounded by their data, range() by a cap); a built-in's render contains every user
// message's text (trimmed, for Gemma's, which trims) and ends with the generation prompt when
// asked for one.
#include <cctype>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "model/tokenizer_vocab.h"

using namespace kvtrim;

namespace {
std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto fields = fuzz::split_fields(std::string_view(reinterpret_cast<const char*>(data), size));
  if (fields.size() < 2) return 0;
  const std::string& sel = fields[0];
  const std::string& tmpl = fields[1];
  const bool gen = !sel.empty() && (sel[0] & 1);
  const bool builtin = sel.rfind("chatml", 0) == 0 || sel.rfind("gemma", 0) == 0;
  std::vector<ChatMessage> msgs;
  for (size_t i = 2; i + 1 < fields.size(); i += 2) msgs.push_back({fields[i], fields[i + 1]});
  std::string out;
  try {
    const ChatTemplate t = builtin ? ChatTemplate::builtin(sel.rfind("chatml", 0) == 0 ? "chatml" : "gemma")
                                   : ChatTemplate::from_jinja(tmpl, "fuzz", "<s>", "</s>");
    out = t.render(msgs, gen);
  } catch (const Error& e) {
    fuzz::check_error_message(e);
    return 0;
  }
  if (!builtin) return 0;
  for (const ChatMessage& m : msgs) {
    if (m.role != "user") continue;
    KVTRIM_FUZZ_ASSERT(out.find(trim(m.content)) != std::string::npos, "a user message is missing from the render");
  }
  if (gen) {
    const bool ends = out.ends_with("<|im_start|>assistant\n") || out.ends_with("<start_of_turn>model\n");
    KVTRIM_FUZZ_ASSERT(ends, "no generation prompt at the end");
  }
  return 0;
}
