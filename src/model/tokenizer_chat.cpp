// Chat templates. kvtrim does not run Jinja; it recognises the template families of the
// supported models and renders them the way their templates do:
//  - ChatML (SmolLM2, Qwen2): "<|im_start|>{role}\n{content}<|im_end|>\n" per message and
//    "<|im_start|>assistant\n" as the generation prompt. When the GGUF template carries a
//    default system prompt (SmolLM2: "You are a helpful AI assistant named SmolLM, trained by
//    Hugging Face"; Qwen2.5: "You are Qwen, created by Alibaba Cloud. You are a helpful
//    assistant."), it is read from the template text and inserted when the first message is
//    not a system message. Qwen's template wraps "tool" messages in <tool_response> inside a
//    user turn.
//  - Gemma (no template in the GGUF, or one using <start_of_turn>): llama.cpp's built-in
//    "gemma" template: "<start_of_turn>{user|model}\n{trimmed content}<end_of_turn>\n", system
//    messages folded into the next user turn as "{system}\n\n{user}", generation prompt
//    "<start_of_turn>model\n". No BOS text: encode(add_bos=true) adds the BOS token.
#include <cctype>

#include "core/error.h"
#include "model/tokenizer_vocab.h"

namespace kvtrim {

namespace {

bool contains(const std::string& s, const char* what) {
  return s.find(what) != std::string::npos;
}

std::string trim_ascii(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// The default system prompt of a ChatML template: the literal X in
// "<|im_start|>system\nX<|im_end|>" (newline written raw or as "\n" in a Jinja string),
// where X is plain text (no quotes or Jinja syntax). "" if the template has none.
std::string default_system_prompt(const std::string& tmpl) {
  static const std::string kHead = "<|im_start|>system";
  for (size_t at = tmpl.find(kHead); at != std::string::npos; at = tmpl.find(kHead, at + 1)) {
    size_t p = at + kHead.size();
    if (tmpl.compare(p, 1, "\n") == 0) {
      p += 1;
    } else if (tmpl.compare(p, 2, "\\n") == 0) {
      p += 2;
    } else {
      continue;
    }
    const size_t end = tmpl.find("<|im_end|>", p);
    if (end == std::string::npos) continue;
    const std::string x = tmpl.substr(p, end - p);
    if (x.empty() || x.find_first_of("'\"{}+\\") != std::string::npos) continue;
    return x;
  }
  return {};
}

void check_role(const std::string& source, const ChatMessage& m) {
  KVTRIM_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool",
               "%s: chat message role '%s' is not one of system, user, assistant, tool",
               source.c_str(), m.role.c_str());
}

std::string render_chatml(const std::string& source, const std::string& tmpl,
                          const std::vector<ChatMessage>& msgs, bool add_generation_prompt) {
  const std::string def_system = default_system_prompt(tmpl);
  const bool qwen_tools = contains(tmpl, "<tool_response>");
  std::string out;
  if (!msgs.empty() && msgs[0].role != "system" && !def_system.empty()) {
    out += "<|im_start|>system\n" + def_system + "<|im_end|>\n";
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    check_role(source, m);
    if (m.role == "tool" && qwen_tools) {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == msgs.size() || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
      continue;
    }
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_gemma(const std::string& source, const std::vector<ChatMessage>& msgs,
                         bool add_generation_prompt) {
  std::string out, system;
  for (const ChatMessage& m : msgs) {
    check_role(source, m);
    if (m.role == "system") {
      system += trim_ascii(m.content);
      continue;
    }
    const std::string role = m.role == "assistant" ? "model" : m.role;
    out += "<start_of_turn>" + role + "\n";
    if (!system.empty() && role != "model") {
      out += system + "\n\n";
      system.clear();
    }
    out += trim_ascii(m.content) + "<end_of_turn>\n";
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

}  // namespace

std::string render_chat(const std::string& source, const std::string& arch, const std::string& tmpl,
                        const std::vector<ChatMessage>& msgs, bool add_generation_prompt) {
  if (contains(tmpl, "<|im_start|>"))
    return render_chatml(source, tmpl, msgs, add_generation_prompt);
  if (contains(tmpl, "<start_of_turn>") || (tmpl.empty() && arch.rfind("gemma", 0) == 0)) {
    return render_gemma(source, msgs, add_generation_prompt);
  }
  if (tmpl.empty() && (arch == "qwen2" || arch == "qwen3")) {
    return render_chatml(source, tmpl, msgs, add_generation_prompt);
  }
  if (tmpl.empty()) {
    fail(
        "%s: no tokenizer.chat_template in the metadata and no built-in template for architecture "
        "'%s'",
        source.c_str(), arch.c_str());
  }
  fail(
      "%s: unsupported chat template (kvtrim knows ChatML and Gemma templates); template starts "
      "with '%.60s'",
      source.c_str(), tmpl.c_str());
}

}  // namespace kvtrim
