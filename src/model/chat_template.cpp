// apply_chat_template: picks the template family from the GGUF metadata
// (general.architecture, tokenizer.chat_template) and renders it (tokenizer_chat.cpp).
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/tokenizer_vocab.h"

namespace kvtrim {

std::string apply_chat_template(const GgufFile& f, const std::vector<ChatMessage>& msgs,
                                bool add_generation_prompt) {
  return render_chat(f.path(), f.get_string("general.architecture", ""),
                     f.get_string("tokenizer.chat_template", ""), msgs, add_generation_prompt);
}

}  // namespace kvtrim
