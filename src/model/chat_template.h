// How a conversation becomes a prompt: the model file's own Jinja chat template
// (tokenizer.chat_template), run by kvtrim's Jinja interpreter (model/jinja/) exactly as
// transformers' apply_chat_template renders it; for a file without one, a named built-in
// (chat_template_builtin.cpp): "gemma" (llama.cpp's built-in Gemma template: Gemma 3 GGUFs carry
// none) and "chatml" (Qwen files without a template). `--chat-template NAME|FILE` overrides the
// choice, as llama.cpp's flag does.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace kvtrim {

class GgufFile;
namespace jinja {
class Template;
}

struct ChatOptions;  // model/chat_options.h: a template's extra inputs (kept out of this header: JSON)

class ChatTemplate {
 public:
  // The file's template; spec "" = its tokenizer.chat_template, else the built-in of its family
  // (gemma* -> "gemma", qwen2 / qwen3 -> "chatml"); spec a built-in name or a Jinja file's path.
  // A template that does not parse is kept as an error that render() throws (the model still
  // loads for everything but chat). bos_token / eos_token: the text of the file's BOS / EOS.
  static ChatTemplate from_gguf(const GgufFile& f, const std::string& spec = "");
  // Jinja source (tests, fuzzing); `name` names it in messages.
  static ChatTemplate from_jinja(const std::string& source, const std::string& name, std::string bos_token = "",
                                 std::string eos_token = "");
  // A built-in: "chatml" or "gemma". Throws Error for another name.
  static ChatTemplate builtin(const std::string& name);
  static const std::vector<std::string>& builtin_names();

  // The prompt for `msgs`. Throws Error naming the template when it cannot render (its
  // raise_exception message, an unsupported construct, a role it refuses).
  std::string render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) const;
  std::string render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt, const ChatOptions& opt) const;

  // "the file's Jinja template", "built-in gemma (the file has no template)", "file T.jinja".
  const std::string& description() const { return description_; }
  bool is_jinja() const { return jinja_ != nullptr; }
  // false: render() throws (no template, a parse error); error() says why.
  bool usable() const { return error_.empty(); }
  const std::string& error() const { return error_; }

 private:
  std::shared_ptr<const jinja::Template> jinja_;
  std::string builtin_;       // when not Jinja
  std::string error_;         // why this template cannot render (no template, a parse error): render() throws it
  std::string bos_, eos_;
  std::string description_;
};

// The model file's template (ChatTemplate::from_gguf(f)) rendered: for tests and tools that
// hold a GgufFile; a Model has its (possibly overridden) template in Model::chat_template().
std::string apply_chat_template(const GgufFile& f, const std::vector<ChatMessage>& msgs, bool add_generation_prompt);

// The rendered chat prompt cut in two where the content of the last user message starts, plus
// `into` bytes of that content (the question after a document): head + tail ==
// t.render(msgs, add_generation_prompt) exactly. Found by rendering the messages again with that
// content replaced by a marker: the renders agree up to the marker (a template writes earlier
// messages before later ones), and the real render must hold the content's first `into` bytes
// there (Gemma trims a message's content: give content without leading spaces). Throws Error
// when there is no user message or the template does not show its content there.
struct ChatPromptSplit {
  std::string head;  // the conversation before the last user turn's content (+ `into` bytes of it)
  std::string tail;  // the rest: the last user content, its end of turn, the generation prompt
};
ChatPromptSplit split_chat_prompt(const ChatTemplate& t, const std::vector<ChatMessage>& msgs,
                                  bool add_generation_prompt, size_t into = 0);
ChatPromptSplit split_chat_prompt(const ChatTemplate& t, const std::vector<ChatMessage>& msgs,
                                  bool add_generation_prompt, size_t into, const ChatOptions& opt);

// The built-in templates (chat_template_builtin.cpp). source names the caller in messages.
std::string render_builtin_chat(const std::string& name, const std::string& source,
                                const std::vector<ChatMessage>& msgs, bool add_generation_prompt);

}  // namespace kvtrim
