// The values a chat template computes with, with Python's semantics where Jinja inherits them
// (jinja2 runs on Python objects): truthiness, str() and repr() of every type, == between
// int / float / bool, floor division and modulo, strings indexed and sliced by code point.
// Lists and dicts are shared by reference as in Python (a template cannot mutate them: the
// sandbox transformers renders in forbids it); a namespace() object is the one mutable value.
// Undefined is jinja2's default Undefined: prints as "", is false, iterates as empty, and
// raises an error when used in arithmetic or subscripted.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/utf8.h"  // utf8_chars: a str's characters

namespace kvtrim::jinja {

class Value;
using ValueList = std::vector<Value>;

// An ordered dict with string keys (insertion order, as Python's dict).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

// Arguments of a call: positional, then keyword (name = value).
struct CallArgs {
  ValueList pos;
  std::vector<std::pair<std::string, Value>> kw;
  // The argument at position i or named `name`; nullptr if absent.
  const Value* get(size_t i, const char* name) const;
};

using NativeFn = std::function<Value(const CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kNamespace, kFunction };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  static Value none();
  Value(bool b);             // NOLINT: implicit, as Python literals
  Value(int v);              // NOLINT
  Value(int64_t v);          // NOLINT
  Value(double v);           // NOLINT
  Value(const char* s);      // NOLINT
  Value(std::string s);      // NOLINT
  static Value list(ValueList items);
  static Value tuple(ValueList items);
  static Value dict(Dict d);
  static Value ns(Dict d);  // a mutable namespace()
  static Value function(std::string name, NativeFn fn);
  // From JSON (objects keep their key order); numbers stay int when integral in the JSON.
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return b_; }
  int64_t as_int() const;     // int or bool (Python's int is a bool's base)
  double as_double() const;   // int, float or bool
  const std::string& str_ref() const { return *s_; }  // kString only
  const ValueList& items() const { return *list_; }   // kList / kTuple only
  const Dict& dict_ref() const { return *dict_; }     // kDict / kNamespace only
  Dict& ns_mut() const { return *dict_; }             // kNamespace only
  const NativeFn& fn() const { return *fn_; }         // kFunction only
  const std::string& hint() const { return *s_; }     // kUndefined / kFunction: a name for messages

  bool truthy() const;                 // Python's bool()
  std::string to_str() const;          // Python's str() ("" for undefined), as {{ x }} prints
  std::string repr() const;            // Python's repr()
  std::string type_name() const;       // Python's type name, for messages
  // Iteration as a for loop sees it: list / tuple items, a dict's keys, a string's code
  // points; undefined is empty. Error for other types.
  ValueList iterate() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_ = std::make_shared<const std::string>();
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const NativeFn> fn_;
};

// Python's == (1 == 1.0 == True; lists and dicts element-wise; undefined equals only undefined).
bool equals(const Value& a, const Value& b);
// Python's <: numbers with numbers, strings with strings (by code point), sequences
// lexicographically. Error for other pairs, naming both types.
bool less(const Value& a, const Value& b);

// 64-bit integer arithmetic that Python would do on big integers: an overflow is an Error
// ("integer overflow"), never a wrapped value.
int64_t checked_add(int64_t a, int64_t b);
int64_t checked_mul(int64_t a, int64_t b);

// Python's repr() of a float ("1.0", "0.1", "1e-05", "inf").
std::string python_float_repr(double v);
// Python's str.isspace() for one code point given as UTF-8.
bool is_python_space(const std::string& ch);

}  // namespace kvtrim::jinja
