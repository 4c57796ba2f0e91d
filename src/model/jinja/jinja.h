// A Jinja interpreter for chat templates: the subset of Jinja2 that Hugging Face chat templates
// use, rendered the way transformers' apply_chat_template renders them (jinja2's
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols; globals
// raise_exception, strftime_now, namespace, dict, range; transformers' tojson). Checked byte for
// byte against transformers + jinja2 on the published templates of Llama 3.x, Qwen2.5, Qwen3,
// Gemma 2/3, Phi-3.5, Mistral, SmolLM2/3, DeepSeek-R1 (tests/model/jinja_refs_test.cpp).
//
// Not supported (a clear error at parse or render time, never a silent difference): template
// inheritance and includes, call blocks, recursive loops, chained comparisons, string %
// formatting, *args / **kwargs. Python's str.upper/lower/title/capitalize change ASCII letters
// only.
#pragma once
#include <ctime>
#include <memory>
#include <string>

#include "model/jinja/value.h"

namespace kvtrim::jinja {

struct Node;

struct RenderOptions {
  // The time strftime_now() formats, as seconds since the epoch (local time); 0: the current time.
  std::time_t now = 0;
  // Statements and loop iterations a render may run: a template is data (from a file or a
  // request), and one that loops for ever is an error, not a hang. Real chat templates run a few
  // dozen per message.
  int64_t max_steps = 5'000'000;
};

class Template {
 public:
  // Parses the template; throws Error "<name>:<line>: <what>" on a syntax error.
  Template(const std::string& source, std::string name);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `vars` as the template's variables (messages, add_generation_prompt,
  // bos_token, ...). Throws Error "<name>: <message>" when the template calls
  // raise_exception(message), and "<name>:<line>: <what>" on any other runtime error.
  std::string render(const Dict& vars, const RenderOptions& opt = {}) const;

  const std::string& name() const { return name_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string name_;
};

}  // namespace kvtrim::jinja
