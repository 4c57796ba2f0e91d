// Jinja's built-in filters and tests, the methods of str / dict / list values that templates
// call (message.content.strip(), dict.items(), ...), and transformers' tojson.
#pragma once
#include <string>

#include "model/jinja/value.h"

namespace kvtrim::jinja {

// Applies filter `name` to `subject` with `args` (positional after the subject, keywords).
// Throws Error naming an unknown filter or a bad argument.
Value apply_filter(const std::string& name, const Value& subject, const CallArgs& args);

// Whether a filter / test of that name exists (checked when a template is parsed, as jinja2
// checks them when it compiles one).
bool is_filter(const std::string& name);
bool is_test(const std::string& name);

// Runs test `name` ("defined", "string", "divisibleby", ...) on `subject`.
bool apply_test(const std::string& name, const Value& subject, const CallArgs& args);

// obj.name: a dict's key or its method (items, keys, values, get), a string's method (strip,
// split, startswith, ...), a namespace's attribute. Undefined when absent; Error on undefined.
Value get_attr(const Value& obj, const std::string& name);
// obj[key]: list / tuple / string by index (negative from the end), dict by key; undefined
// when absent (as jinja2); Error when obj is undefined.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step], with Python's rules (any part may be none / undefined).
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// json.dumps(v, ensure_ascii=False, indent=indent (<0: none), separators, sort_keys), as
// transformers' tojson filter.
std::string dump_json(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                      bool sort_keys);

// Python's str.strip(chars) family on code points; `chars` undefined / none: whitespace.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);

}  // namespace kvtrim::jinja
