// Helpers the Jinja builtins share (access.cpp: attributes, items, str / dict methods;
// builtins.cpp: filters, tests, tojson): argument access and Python's str operations.
#pragma once
#include <cstdint>
#include <string>

#include "model/jinja/value.h"

namespace kvtrim::jinja::detail {

// Error "'<name>' is undefined" for an undefined value.
void require_defined(const Value& v);
// The argument at position i or named `name`, else `def` (a copy: values share their data).
Value arg(const CallArgs& a, size_t i, const char* name, const Value& def);
// The keyword argument `name`; nullptr if absent.
const Value* kwarg(const CallArgs& a, const char* name);
const std::string& need_string(const Value& v, const char* what);
int64_t need_int(const Value& v, const char* what);
// Python's str operations (upper / lower / title / capitalize on ASCII letters only).
std::string ascii_map(const std::string& s, int (*f)(int));
std::string title_case(const std::string& s);
std::string capitalize(const std::string& s);
std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count);
ValueList py_split(const std::string& s, const Value& sep, int64_t maxsplit);
size_t length_of(const Value& v);  // len(): code points of a string, items of a list / dict

}  // namespace kvtrim::jinja::detail
