// Fuzz target "chat_template": the chat-template renderer (kvtrim recognises the template
// families of the supported models rather than running Jinja; model/tokenizer_chat.cpp).
// Input fields (separated by "\n--\n"): architecture, template text, then role / content
// pairs; the first byte of the architecture field's value also decides add_generation_prompt.
// Properties: a rendered conversation contains every user message's text (trimmed, for
// Gemma's template, which trims), and ends with the generation prompt when asked for one.
#include <cctype>
#include <string>
#include <vector>

#include "fuzz_util.h"
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
  const std::string& arch = fields[0];
  const std::string& tmpl = fields[1];
  const bool gen = !arch.empty() && (arch[0] & 1);
  std::vector<ChatMessage> msgs;
  for (size_t i = 2; i + 1 < fields.size(); i += 2) msgs.push_back({fields[i], fields[i + 1]});
  std::string out;
  try {
    out = render_chat("fuzz", arch, tmpl, msgs, gen);
  } catch (const Error& e) {
    fuzz::check_error_message(e);
    return 0;
  }
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
