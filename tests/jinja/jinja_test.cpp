// The Jinja interpreter's errors and bounds, and the semantics the reference comparison
// (jinja_refs_test.cpp) does not reach: every expected string here is what jinja2 3.1 with
// trim_blocks + lstrip_blocks prints for the same template (checked by hand in Python).
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/jinja/jinja.h"

namespace kvtrim::jinja {
namespace {

std::string render(const std::string& src, Dict vars = {}) { return Template(src, "t").render(vars); }

std::string error_of(const std::string& src, Dict vars = {}) {
  try {
    render(src, std::move(vars));
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, WhitespaceControl) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indentation before it
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  // {{ }} keeps both; "-" strips all whitespace on its side; "+" keeps the indentation
  EXPECT_EQ(render("x  {{ 1 }}  \ny"), "x  1  \ny");
  EXPECT_EQ(render("x \n {{- 1 -}} \n y"), "x1y");
  EXPECT_EQ(render("  {%+ if true %}k{% endif %}"), "  k");
  // one trailing newline of the template is dropped (keep_trailing_newline=False); \r\n -> \n
  EXPECT_EQ(render("a\r\nb\n"), "a\nb");
  EXPECT_EQ(render("{# note #}\nz"), "z");
}

TEST(Jinja, ScopesAndNamespaces) {
  // a set inside a loop is gone after it; a namespace carries state out
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = i %}{% endfor %}{{ ns.x }}"), "2");
  // if blocks share the enclosing scope
  EXPECT_EQ(render("{% if true %}{% set y = 3 %}{% endif %}{{ y }}"), "3");
  // a macro does not see the caller's loop variable, and its sets stay inside it
  EXPECT_EQ(render("{% macro m() %}[{{ i }}]{% set z = 1 %}{% endmacro %}{% for i in [5] %}{{ m() }}{% endfor %}{{ z }}"),
            "[]");
}

TEST(Jinja, PythonValueSemantics) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 2.5] }}"), "[1, 'a', None, True, 2.5]");
  EXPECT_EQ(render("{{ \"it's\" }} {{ [\"it's\"] }} {{ ['a\\nb'] }}"), "it's [\"it's\"] ['a\\nb']");
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ true == 1 }} {{ [1, 2] == [1, 2] }} {{ 'a' < 'b' }}"), "True True True True");
  EXPECT_EQ(render("{{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 1 / 4 }} {{ 2 ** -1 }}"), "-4 2 -2 0.25 0.5");
  EXPECT_EQ(render("{{ 1e16 }} {{ 123456789.0 }} {{ 0.0001 }} {{ 1.5e-7 }}"), "1e+16 123456789.0 0.0001 1.5e-07");
  EXPECT_EQ(render("{{ 'héllo'[1] }} {{ 'héllo' | length }} {{ 'héllo'[::-1] }}"), "é 5 olléh");
  EXPECT_EQ(render("{{ undefined_name }}|{{ undefined_name is defined }}|{{ none }}"), "|False|None");
  Dict v;
  v.set("m", Value::from_json(nlohmann::ordered_json::parse(R"({"role": "user", "items": 3})")));
  // attribute access tries the dict's method first (jinja2's getattr), subscript the key
  EXPECT_EQ(render("{{ m.role }} {{ m['items'] }} {{ m.items() | length }}", v), "user 3 2");
}

TEST(Jinja, RaiseExceptionCarriesTheMessage) {
  EXPECT_EQ(error_of("a{{ raise_exception('Roles must alternate') }}"), "t: Roles must alternate");
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  EXPECT_NE(error_of("ok\n{% if x %}\nno end").find("t:3: unexpected end of template, expected 'elif'"),
            std::string::npos)
      << error_of("ok\n{% if x %}\nno end");
  EXPECT_NE(error_of("{{ 1 + }}").find("t:1: unexpected '}}'"), std::string::npos) << error_of("{{ 1 + }}");
  EXPECT_NE(error_of("{% include 'x' %}").find("unknown or unsupported tag 'include'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc }}").find("unterminated string"), std::string::npos);
  EXPECT_NE(error_of("{# open").find("unterminated comment"), std::string::npos);
  EXPECT_NE(error_of("{{ x").find("unterminated '{{'"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 < 2 < 3 }}").find("chained comparisons"), std::string::npos);
  EXPECT_NE(error_of("{% for x in y recursive %}{% endfor %}").find("recursive"), std::string::npos);
}

TEST(Jinja, RuntimeErrorsNameTheLine) {
  EXPECT_NE(error_of("\n{{ missing + 1 }}").find("t:2: 'missing' is undefined"), std::string::npos)
      << error_of("\n{{ missing + 1 }}");
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("unsupported operand type(s) for +: 'str' and 'int'"), std::string::npos);
  // unknown filters and tests fail when the template is parsed, even in a branch never taken
  EXPECT_NE(error_of("{% if false %}{{ x | nosuchfilter }}{% endif %}").find("t:1: no filter named 'nosuchfilter'"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 1 is nosuchtest }}").find("no test named 'nosuchtest'"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 // 0 }}").find("division or modulo by zero"), std::string::npos);
  EXPECT_NE(error_of("{{ missing.attr }}").find("'missing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ '%s' % 1 }}").find("string % formatting is not supported"), std::string::npos);
  EXPECT_NE(error_of("{% set x = 1 %}{% set x.a = 2 %}").find("non-namespace"), std::string::npos);
}

TEST(Jinja, BoundsStopRunawayTemplates) {
  // deep nesting, recursion, unbounded work and huge values are errors, not a crash or a hang
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("nested too deeply"), std::string::npos);
  RenderOptions few;
  few.max_steps = 100000;
  try {
    Template("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "t").render({}, few);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runs too long (more than 100000 steps)"), std::string::npos) << e.what();
  }
  EXPECT_NE(error_of("{{ 'x' * 1000000000 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                     "{% endfor %}")
                .find("passes 64 MiB"),
            std::string::npos);
}

TEST(Jinja, StrftimeNowUsesTheGivenTime) {
  RenderOptions opt;
  opt.now = 1785067200;  // 2026-07-26 12:00 UTC
  EXPECT_EQ(Template("{{ strftime_now('%Y') }}", "t").render({}, opt), "2026");
}

}  // namespace
}  // namespace kvtrim::jinja
