// The Jinja lexer: template text into tokens, with the whitespace control transformers renders
// chat templates with (jinja2 Environment(trim_blocks=True, lstrip_blocks=True),
// keep_trailing_newline=False):
//  - newlines normalised to "\n" and one trailing newline of the template dropped;
//  - trim_blocks: the first newline after a block tag "%}" or a comment "#}" is removed;
//  - lstrip_blocks: spaces and tabs from the start of a line up to a block or comment tag are
//    removed ("{%+" keeps them);
//  - "{%-" / "{{-" / "{#-" strip all whitespace before the tag, "-%}" / "-}}" / "-#}" all
//    whitespace after it;
//  - {% raw %}…{% endraw %} is text.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvtrim::jinja {

enum class Tok {
  kText,        // template text (after whitespace control)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,      // value: the literal's text with escapes resolved
  kInt,
  kFloat,
  kOp,          // value: the operator ("+", "//", "==", "(", ",", "|", ...)
  kEnd,         // end of template
};

struct Token {
  Tok type;
  std::string value;
  int line;
};

// Throws Error ("<name>:<line>: ...") on an unterminated tag, string or comment.
std::vector<Token> lex(const std::string& source, const std::string& name);

}  // namespace kvtrim::jinja
