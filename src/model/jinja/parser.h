// The Jinja parser: tokens into a syntax tree, with jinja2's grammar and operator precedence
// (loosest first): "x if c else y", or, and, not, comparisons (== != < > <= >= in, not in),
// + -, ~, * / // %, **, unary - +, then postfix .attr [key] [a:b:c] (args) | filter, is test.
// Statements: if/elif/else, for (tuple targets, "if" filter, else), set (names, tuples,
// namespace attributes, blocks), macro, filter blocks, break/continue (loopcontrols),
// generation (transformers' extension: renders its body).
#pragma once
#include <string>
#include <vector>

#include "model/jinja/ast.h"
#include "model/jinja/lexer.h"

namespace kvtrim::jinja {

// Throws Error ("<name>:<line>: ...") on a syntax error or a tag kvtrim does not support
// (extends, include, import, call blocks, do).
Body parse(const std::vector<Token>& tokens, const std::string& name);

}  // namespace kvtrim::jinja
