// apply_chat_template: picks the template family from the GGUF metadata
// (general.architecture, tokenizer.chat_template) and renders it (tokenizer_chat.cpp).
#include "core/error.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/tokenizer_vocab.h"

namespace kvtrim {

std::string apply_chat_template(const GgufFile& f, const std::vector<ChatMessage>& msgs,
                                bool add_generation_prompt) {
  return render_chat(f.path(), f.get_string("general.architecture", ""),
                     f.get_string("tokenizer.chat_template", ""), msgs, add_generation_prompt);
}

ChatPromptSplit split_chat_prompt(const GgufFile& f, const std::vector<ChatMessage>& msgs, bool add_generation_prompt,
                                  size_t into) {
  size_t last = msgs.size();
  for (size_t i = msgs.size(); i-- > 0;)
    if (msgs[i].role == "user") {
      last = i;
      break;
    }
  KVTRIM_CHECK(last < msgs.size(), "%s: no user message to protect in the chat prompt", f.path().c_str());
  KVTRIM_CHECK(into <= msgs[last].content.size(), "split_chat_prompt: %zu bytes into a user message of %zu", into,
               msgs[last].content.size());
  const std::string real = apply_chat_template(f, msgs, add_generation_prompt);
  static const std::string kMark = "\x01KVTRIM_LAST_USER\x01";
  std::vector<ChatMessage> marked = msgs;
  marked[last].content = kMark;
  const std::string m = apply_chat_template(f, marked, add_generation_prompt);
  const size_t at = m.find(kMark);
  KVTRIM_CHECK(at != std::string::npos && real.compare(0, at, m, 0, at) == 0 &&
                   real.compare(at, into, msgs[last].content, 0, into) == 0,
               "%s: cannot find where the last user message starts in the rendered chat template",
               f.path().c_str());
  return ChatPromptSplit{real.substr(0, at + into), real.substr(at + into)};
}

}  // namespace kvtrim
