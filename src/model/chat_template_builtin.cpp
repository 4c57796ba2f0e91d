// The built-in chat templates, for files without tokenizer.chat_template (or chosen with
// --chat-template NAME):
//  - "gemma": llama.cpp's built-in Gemma template (Gemma 3 GGUFs carry no template):
//    "<start_of_turn>{user|model}\n{trimmed content}<end_of_turn>\n", system messages folded
//    into the next user turn as "{system}\n\n{user}", generation prompt "<start_of_turn>model\n".
//    No BOS text: encode_prompt adds the BOS token.
//  - "chatml": "<|im_start|>{role}\n{content}<|im_end|>\n" per message and
//    "<|im_start|>assistant\n" as the generation prompt (no default system prompt).
#include <cctype>

#include "core/error.h"
#include "model/chat_template.h"

namespace kvtrim {

namespace {

std::string trim_ascii(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

void check_role(const std::string& source, const ChatMessage& m) {
  KVTRIM_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool",
               "%s: chat message role '%s' is not one of system, user, assistant, tool",
               source.c_str(), m.role.c_str());
}

std::string render_chatml(const std::string& source, const std::vector<ChatMessage>& msgs, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    check_role(source, m);
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

std::string render_builtin_chat(const std::string& name, const std::string& source,
                                const std::vector<ChatMessage>& msgs, bool add_generation_prompt) {
  if (name == "chatml") return render_chatml(source, msgs, add_generation_prompt);
  if (name == "gemma") return render_gemma(source, msgs, add_generation_prompt);
  fail("%s: unknown built-in chat template '%s' (chatml, gemma)", source.c_str(), name.c_str());
}

}  // namespace kvtrim
