// The syntax tree of a Jinja template: expressions and statements, as parser.cpp builds them
// and interp.cpp runs them.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/jinja/value.h"

namespace kvtrim::jinja {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args: the items
    kTuple,    // args: the items
    kDict,     // args: key0, value0, key1, value1, ...
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (absent parts are null)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is [not] name(args[1..]); negated for "is not"
    kUnary,    // name ("-", "+", "not") args[0]
    kBinary,   // args[0] name args[1]: + - * / // % ** ~ and or == != < > <= >= in notin
    kCond,     // args[0] if args[1] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprP> args;
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negated = false;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (condition, body)...; else_body
    kFor,       // for targets in expr [if cond]: body; else_body
    kSet,       // {% set targets = expr %}; a target "ns.attr" is stored as (ns, attr)
    kSetBlock,  // {% set target %}body{% endset %} (filters: applied to the body's text)
    kMacro,     // {% macro name(params) %}body{% endmacro %}
    kFilterBlock,  // {% filter f %}body{% endfilter %}: filters in `filters`
    kBreak,
    kContinue,
    kBlock,     // a body rendered in place ({% generation %})
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprP expr;
  ExprP cond;
  std::vector<std::string> targets;  // for / set names; set "ns.attr" has targets {ns} and attr
  std::string attr;
  std::vector<std::pair<ExprP, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::pair<std::string, ExprP>> params;  // macro parameters with defaults (null: none)
  std::vector<ExprP> filters;  // kFilterBlock / kSetBlock: kFilter exprs whose args[0] is null
};

}  // namespace kvtrim::jinja
