// ChatTemplate: the file's Jinja chat template or a named built-in (see chat_template.h);
// apply_chat_template / split_chat_prompt / encode_prompt over it.
#include "model/chat_template.h"

#include "model/chat_options.h"

#include <fstream>
#include <sstream>
#include <sys/stat.h>

#include "core/error.h"
#include "model/gguf.h"
#include "model/jinja/jinja.h"

namespace kvtrim {

namespace {

// The text of special token `key` (tokenizer.ggml.bos_token_id ...) in the file, "" if none.
std::string token_text(const GgufFile& f, const char* key) {
  const int64_t id = f.get_int(key, -1);
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  if (id < 0 || tokens == nullptr) return "";
  const GgufArray& arr = f.get_array("tokenizer.ggml.tokens");
  if (static_cast<uint64_t>(id) >= arr.values.size() || arr.elem_type != GgufValueType::STRING) return "";
  return arr.values[static_cast<size_t>(id)].as_string();
}

bool is_regular_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVTRIM_CHECK(in.good(), "cannot read chat template file '%s'", path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

const std::vector<std::string>& ChatTemplate::builtin_names() {
  static const std::vector<std::string> kNames = {"chatml", "gemma"};
  return kNames;
}

ChatTemplate ChatTemplate::builtin(const std::string& name) {
  bool known = false;
  for (const auto& n : builtin_names()) known = known || n == name;
  KVTRIM_CHECK(known, "unknown built-in chat template '%s' (chatml, gemma, or a Jinja file's path)", name.c_str());
  ChatTemplate t;
  t.builtin_ = name;
  t.description_ = "built-in " + name;
  return t;
}

ChatTemplate ChatTemplate::from_jinja(const std::string& source, const std::string& name, std::string bos_token,
                                      std::string eos_token) {
  ChatTemplate t;
  t.bos_ = std::move(bos_token);
  t.eos_ = std::move(eos_token);
  t.description_ = name;
  try {
    t.jinja_ = std::make_shared<const jinja::Template>(source, name);
  } catch (const Error& e) {
    t.error_ = strprintf("the chat template does not parse: %s (choose another with --chat-template chatml|gemma|FILE)",
                         e.what());
  }
  return t;
}

ChatTemplate ChatTemplate::from_gguf(const GgufFile& f, const std::string& spec) {
  const std::string bos = token_text(f, "tokenizer.ggml.bos_token_id");
  const std::string eos = token_text(f, "tokenizer.ggml.eos_token_id");
  if (!spec.empty()) {
    if (is_regular_file(spec)) return from_jinja(read_text_file(spec), "chat template file " + spec, bos, eos);
    bool known = false;
    for (const auto& n : builtin_names()) known = known || n == spec;
    KVTRIM_CHECK(known, "--chat-template '%s' is neither a built-in template (chatml, gemma) nor a file",
                 spec.c_str());
    return builtin(spec);
  }
  const std::string tmpl = f.get_string("tokenizer.chat_template", "");
  if (!tmpl.empty()) {
    ChatTemplate t = from_jinja(tmpl, f.path() + " tokenizer.chat_template", bos, eos);
    t.description_ = "the file's Jinja template";
    return t;
  }
  const std::string arch = f.get_string("general.architecture", "");
  std::string name;
  if (arch.rfind("gemma", 0) == 0) name = "gemma";
  if (arch == "qwen2" || arch == "qwen3" || arch == "qwen3moe") name = "chatml";
  ChatTemplate t;
  if (name.empty()) {
    t.error_ = strprintf(
        "%s: no tokenizer.chat_template in the file and no built-in template for architecture '%s' (give one with "
        "--chat-template chatml|gemma|FILE)",
        f.path().c_str(), arch.c_str());
    t.description_ = "none (the file has no template)";
    return t;
  }
  t = builtin(name);
  t.description_ += " (the file has no template)";
  return t;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) const {
  return render(msgs, add_generation_prompt, ChatOptions{});
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt,
                                 const ChatOptions& opt) const {
  if (!error_.empty()) throw Error(error_);
  if (jinja_ == nullptr) {
    KVTRIM_CHECK(opt.tools.is_null(), "%s: the built-in chat templates take no tools", description_.c_str());
    return render_builtin_chat(builtin_, description_, msgs, add_generation_prompt);
  }
  jinja::Dict vars;
  jinja::ValueList list;
  for (const ChatMessage& m : msgs) {
    jinja::Dict d;
    d.set("role", jinja::Value(m.role));
    d.set("content", jinja::Value(m.content));
    list.push_back(jinja::Value::dict(std::move(d)));
  }
  vars.set("messages", jinja::Value::list(std::move(list)));
  vars.set("tools", jinja::Value::from_json(opt.tools));
  vars.set("documents", jinja::Value::none());
  vars.set("add_generation_prompt", jinja::Value(add_generation_prompt));
  if (!bos_.empty()) vars.set("bos_token", jinja::Value(bos_));
  if (!eos_.empty()) vars.set("eos_token", jinja::Value(eos_));
  KVTRIM_CHECK(opt.vars.is_object(), "chat template variables must be a JSON object");
  for (auto it = opt.vars.begin(); it != opt.vars.end(); ++it) {
    KVTRIM_CHECK(it.key() != "messages" && it.key() != "add_generation_prompt",
                 "chat template variable '%s' is set by kvtrim itself", it.key().c_str());
    vars.set(it.key(), jinja::Value::from_json(it.value()));
  }
  return jinja_->render(vars);
}

std::string apply_chat_template(const GgufFile& f, const std::vector<ChatMessage>& msgs, bool add_generation_prompt) {
  return ChatTemplate::from_gguf(f).render(msgs, add_generation_prompt);
}

ChatPromptSplit split_chat_prompt(const ChatTemplate& t, const std::vector<ChatMessage>& msgs, bool add_generation_prompt,
                                  size_t into) {
  return split_chat_prompt(t, msgs, add_generation_prompt, into, ChatOptions{});
}

ChatPromptSplit split_chat_prompt(const ChatTemplate& t, const std::vector<ChatMessage>& msgs, bool add_generation_prompt,
                                  size_t into, const ChatOptions& opt) {
  size_t last = msgs.size();
  for (size_t i = msgs.size(); i-- > 0;)
    if (msgs[i].role == "user") {
      last = i;
      break;
    }
  KVTRIM_CHECK(last < msgs.size(), "%s: no user message to protect in the chat prompt", t.description().c_str());
  KVTRIM_CHECK(into <= msgs[last].content.size(), "split_chat_prompt: %zu bytes into a user message of %zu", into,
               msgs[last].content.size());
  const std::string real = t.render(msgs, add_generation_prompt, opt);
  static const std::string kMark = "\x01KVTRIM_LAST_USER\x01";
  std::vector<ChatMessage> marked = msgs;
  marked[last].content = kMark;
  const std::string m = t.render(marked, add_generation_prompt, opt);
  const size_t at = m.find(kMark);
  KVTRIM_CHECK(at != std::string::npos && real.compare(0, at, m, 0, at) == 0 &&
                   real.compare(at, into, msgs[last].content, 0, into) == 0,
               "%s: cannot find where the last user message starts in the rendered chat template",
               t.description().c_str());
  return ChatPromptSplit{real.substr(0, at + into), real.substr(at + into)};
}

std::vector<int32_t> encode_prompt(const Tokenizer& tok, std::string_view text) {
  bool add = tok.add_bos();
  if (add && tok.bos() >= 0) {
    const std::string piece = tok.token_to_piece(tok.bos());
    if (!piece.empty() && text.substr(0, piece.size()) == piece) add = false;
  }
  return tok.encode(text, add, true);
}

}  // namespace kvtrim
