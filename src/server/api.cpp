#include "server/api.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/strings.h"

#include "core/error.h"
#include "press/press.h"

namespace kvtrim::server {

using nlohmann::json;

namespace {

std::string error_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status == 429 || status == 503) return "server_overloaded";  // llama-server's type for 503
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

const json* field(const json& j, const char* name) {
  auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

double get_number(const json& j, const char* name, double lo, double hi) {
  const json* f = field(j, name);
  if (!f->is_number()) bad(name, strprintf("'%s' must be a number", name));
  const double v = f->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) bad(name, strprintf("'%s' must be in [%g, %g] (got %g)", name, lo, hi, v));
  return v;
}

int64_t get_integer(const json& j, const char* name, int64_t lo, int64_t hi) {
  const json* f = field(j, name);
  if (!f->is_number_integer()) bad(name, strprintf("'%s' must be an integer", name));
  // unsigned values past int64 (e.g. 2^64-1) are out of range, not wrapped
  if (f->is_number_unsigned() && f->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    bad(name, strprintf("'%s' is out of range [%lld, %lld]", name, static_cast<long long>(lo), static_cast<long long>(hi)));
  const int64_t v = f->get<int64_t>();
  if (v < lo || v > hi)
    bad(name, strprintf("'%s' must be in [%lld, %lld] (got %lld)", name, static_cast<long long>(lo),
                        static_cast<long long>(hi), static_cast<long long>(v)));
  return v;
}

std::string get_string(const json& j, const char* name) {
  const json* f = field(j, name);
  if (!f->is_string()) bad(name, strprintf("'%s' must be a string", name));
  return f->get<std::string>();
}

bool get_bool(const json& j, const char* name) {
  const json* f = field(j, name);
  if (!f->is_boolean()) bad(name, strprintf("'%s' must be true or false", name));
  return f->get<bool>();
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::string message_content(const json& c, size_t i) {
  const std::string p = strprintf("messages[%zu].content", i);
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(p, p + " must be a string or an array of text parts");
  std::string out;
  for (const json& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      bad(p, p + ": only {\"type\": \"text\", \"text\": ...} parts are supported");
    out += part["text"].get<std::string>();
  }
  return out;
}

KvDtype parse_cache_type(const json& j, const char* name) {
  const std::string s = get_string(j, name);
  try {
    return kv_dtype_from_name(s);
  } catch (const Error& e) {
    bad(name, strprintf("'%s': %s", name, e.what()));
  }
}

// A routing key travels in an HTTP header and an nginx hash key: printable, no spaces or quotes.
void check_conversation_key(const std::string& key, const char* param) {
  if (key.empty()) bad(param, strprintf("'%s' must not be empty", param));
  if (key.size() > kMaxConversationKey)
    bad(param, strprintf("'%s' is %zu characters; at most %zu are allowed", param, key.size(), kMaxConversationKey));
  for (const char c : key) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || std::strchr("._:@/+=-", c) != nullptr;
    if (!ok || c == 0)
      bad(param, strprintf("'%s' may hold only letters, digits and . _ : @ / + = - (found byte 0x%02x)", param,
                           static_cast<unsigned>(static_cast<unsigned char>(c))));
  }
}

}  // namespace

ConversationKey resolve_conversation_key(const CompletionRequest& r, const std::string& header) {
  if (!header.empty()) {
    check_conversation_key(header, "X-Conversation-Id");
    if (!r.prompt_cache_key.empty() && r.prompt_cache_key != header)
      bad("prompt_cache_key", strprintf("'prompt_cache_key' and the X-Conversation-Id header name different "
                                        "conversations ('%s' and '%s'); send one, or the same in both",
                                        r.prompt_cache_key.c_str(), header.c_str()));
    return {header, "header"};
  }
  if (!r.prompt_cache_key.empty()) return {r.prompt_cache_key, "body"};
  // derived: what the conversation's later turns repeat unchanged at their start
  // FNV-1a (core/strings.h): the derived key must be the same on every replica and across restarts
  uint64_t h = fnv1a64(r.endpoint == Endpoint::kChat ? "chat" : "completion");
  if (r.endpoint == Endpoint::kChat) {
    for (const ChatMessage& m : r.messages) {
      if (m.role != "system" && m.role != "user") continue;
      std::string tag(1, '\0');  // the role, fenced, so that moving text between messages changes the key
      tag += m.role;
      tag += '\0';
      h = fnv1a64(tag, h);
      h = fnv1a64(m.content, h);
      if (m.role == "user") break;  // the first user message ends it
    }
  } else if (r.has_prompt_tokens) {
    for (size_t i = 0; i < r.prompt_tokens.size() && i < 64; ++i) {
      std::string t = std::to_string(r.prompt_tokens[i]);
      t += ',';
      h = fnv1a64(t, h);
    }
  } else {
    h = fnv1a64(r.prompt.substr(0, 64), h);
  }
  return {strprintf("auto-%016llx", static_cast<unsigned long long>(h)), "derived"};
}

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)), status_(status), type_(error_type(status)),
      param_(std::move(param)), code_(std::move(code)) {}

CompletionRequest parse_completion_request(const std::string& body, Endpoint ep, const RequestLimits& lim) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number past double
    throw ApiError(400, std::string("malformed JSON body: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  CompletionRequest r;
  r.endpoint = ep;
  // OpenAI's defaults (not the CLI's): temperature 1, top_p 1, no top-k cut.
  r.sampling.temperature = 1.f;
  r.sampling.top_p = 1.f;
  r.sampling.top_k = 0;
  if (field(j, "model")) r.model = get_string(j, "model");

  if (ep == Endpoint::kChat) {
    const json* m = field(j, "messages");
    if (!m) bad("messages", "'messages' is required");
    if (!m->is_array() || m->empty()) bad("messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < m->size(); ++i) {
      const json& msg = (*m)[i];
      const std::string p = strprintf("messages[%zu]", i);
      if (!msg.is_object()) bad(p, p + " must be an object");
      if (!msg.contains("role") || !msg["role"].is_string()) bad(p + ".role", p + ".role must be a string");
      ChatMessage cm;
      cm.role = msg["role"].get<std::string>();
      if (cm.role == "developer") cm.role = "system";  // OpenAI's newer name for it
      if (cm.role != "system" && cm.role != "user" && cm.role != "assistant")
        bad(p + ".role", strprintf("%s.role '%s' is not one of system, user, assistant", p.c_str(), cm.role.c_str()));
      if (!msg.contains("content") || msg["content"].is_null()) bad(p + ".content", p + ".content is required");
      cm.content = message_content(msg["content"], i);
      r.messages.push_back(std::move(cm));
    }
    // Extra variables of the model's Jinja chat template, as llama.cpp's and vLLM's servers take them.
    if (const json* kw = field(j, "chat_template_kwargs")) {
      if (!kw->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      for (auto it = kw->begin(); it != kw->end(); ++it) {
        if (it.key() == "messages" || it.key() == "add_generation_prompt" || it.key() == "tools")
          bad("chat_template_kwargs", "chat_template_kwargs." + it.key() + " is set by the server");
      }
      r.chat.vars = nlohmann::ordered_json::parse(kw->dump());
    }
  } else {
    const json* p = field(j, "prompt");
    if (!p) bad("prompt", "'prompt' is required");
    if (p->is_string()) {
      r.prompt = p->get<std::string>();
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
      r.prompt = (*p)[0].get<std::string>();
    } else if (p->is_array() && !p->empty() && (*p)[0].is_number_integer()) {
      r.has_prompt_tokens = true;
      for (const json& t : *p) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
          bad("prompt", "'prompt' token ids must be non-negative integers");
        r.prompt_tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
    } else {
      bad("prompt", "'prompt' must be a string or an array of token ids (one prompt per request)");
    }
    if (field(j, "echo") && get_bool(j, "echo")) bad("echo", "'echo' is not supported");
  }

  if (field(j, "n") && get_integer(j, "n", 1, 1) != 1) bad("n", "'n' must be 1");
  const char* mt = field(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (field(j, mt)) {
    const int64_t v = get_integer(j, mt, 1, std::numeric_limits<int32_t>::max());
    if (v >= lim.n_ctx)
      bad(mt, strprintf("'%s' %lld does not fit the server's context of %lld tokens per conversation", mt,
                        static_cast<long long>(v), static_cast<long long>(lim.n_ctx)));
    r.max_tokens = static_cast<int>(v);
  }
  if (field(j, "temperature")) r.sampling.temperature = static_cast<float>(get_number(j, "temperature", 0, 2));
  if (field(j, "top_p")) {
    r.sampling.top_p = static_cast<float>(get_number(j, "top_p", 0, 1));
    if (r.sampling.top_p <= 0) bad("top_p", "'top_p' must be in (0, 1]");
  }
  if (field(j, "top_k")) r.sampling.top_k = static_cast<int>(get_integer(j, "top_k", 0, 1 << 20));
  if (field(j, "seed")) {
    r.sampling.seed = static_cast<uint64_t>(get_integer(j, "seed", std::numeric_limits<int64_t>::min(),
                                                        std::numeric_limits<int64_t>::max()));
    r.has_seed = true;
  }
  if (const json* s = field(j, "stop")) {
    if (s->is_string()) {
      r.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > 4) bad("stop", "'stop' takes at most 4 sequences");
      for (const json& x : *s) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of strings");
    }
    for (const auto& x : r.stop)
      if (x.empty()) bad("stop", "'stop' sequences must not be empty");
  }
  if (field(j, "stream")) r.stream = get_bool(j, "stream");
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    if (field(*so, "include_usage")) r.include_usage = get_bool(*so, "include_usage");
  }
  if (field(j, "logprobs") && get_bool(j, "logprobs")) bad("logprobs", "'logprobs' is not supported");
  if (field(j, "tools")) bad("tools", "'tools' (function calling) is not supported");

  // kvtrim's extension fields
  if (field(j, "kv_press")) {
    std::string spec = get_string(j, "kv_press");
    if (spec != "" && spec != "none") {
      try {
        spec = make_press(spec)->spec();
      } catch (const Error& e) {
        bad("kv_press", strprintf("'kv_press': %s", e.what()));
      }
    } else {
      spec.clear();
    }
    r.cache.press = spec;
  }
  if (const json* pp = field(j, "kv_press_protect")) {
    if (pp->is_string()) {
      if (pp->get<std::string>() != "last_turn")
        bad("kv_press_protect", strprintf("'kv_press_protect' must be a token count or \"last_turn\" (got \"%s\")",
                                          pp->get<std::string>().c_str()));
    } else if (pp->is_number_integer()) {
      r.cache.protect = get_integer(j, "kv_press_protect", 0,
                                    lim.n_ctx > 0 ? lim.n_ctx - 1 : std::numeric_limits<int32_t>::max());
    } else {
      bad("kv_press_protect", "'kv_press_protect' must be a token count or \"last_turn\"");
    }
  }
  if (field(j, "kv_press_max_loss")) r.cache.max_loss = get_number(j, "kv_press_max_loss", 0, 1);
  if (field(j, "prompt_cache_key")) {
    r.prompt_cache_key = get_string(j, "prompt_cache_key");
    check_conversation_key(r.prompt_cache_key, "prompt_cache_key");
  }
  if (field(j, "kv_cache_type")) r.cache.k = r.cache.v = parse_cache_type(j, "kv_cache_type");
  if (field(j, "kv_cache_type_k")) r.cache.k = parse_cache_type(j, "kv_cache_type_k");
  if (field(j, "kv_cache_type_v")) r.cache.v = parse_cache_type(j, "kv_cache_type_v");
  return r;
}

std::string error_body(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type()}, {"code", e.status()}};
  err["param"] = e.param().empty() ? json(nullptr) : json(e.param());
  if (!e.code().empty()) err["code"] = e.code();
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string error_body(int status, const std::string& message) { return error_body(ApiError(status, message)); }

json usage_json(const CompletionStats& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.completion_tokens},
          {"total_tokens", s.prompt_tokens + s.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", s.cached_tokens}}}};
}

namespace {
json loss_json(const PressLoss& l) {
  json j = {{"estimate", l.rel_err},
            {"max_layer_estimate", l.rel_err_max},
            {"max_layer", l.max_layer},
            {"window_queries", l.n_queries},
            {"queries", loss_queries_name(l.queries)}};
  if (l.tokens_removed > 0) j["evicted_attention_mass"] = l.evicted_mass;
  return j;
}
}  // namespace

json compression_json(const CompressionReport& c) {
  json j = {{"press", c.press},
            {"applied", c.applied},
            {"context_tokens", c.context_tokens},
            {"compressed_tokens_before", c.tokens_before},
            {"compressed_tokens_after", c.tokens_after},
            {"kv_bytes_before", c.kv_bytes_before},
            {"kv_bytes_after", c.kv_bytes_after},
            {"protected_tokens", c.protected_tokens},
            {"query_aware", c.query_aware}};
  if (c.reused) j["reused"] = true;
  if (!c.note.empty()) j["note"] = c.note;
  if (c.loss.measured) j["loss"] = loss_json(c.loss);
  if (c.max_loss < 1) j["max_loss"] = c.max_loss;
  if (c.max_loss < 1 || c.attempts.size() > 1) {
    json a = json::array();
    for (const CompressAttempt& t : c.attempts) {
      json e = {{"press", t.press}, {"accepted", t.accepted}};
      e["ratio"] = t.ratio >= 0 ? json(t.ratio) : json(nullptr);
      if (t.loss.measured) e["loss"] = loss_json(t.loss);
      a.push_back(std::move(e));
    }
    j["attempts"] = std::move(a);
  }
  return j;
}

json kvtrim_json(const CompletionStats& s) {
  json j = {{"slot", s.slot},
          {"n_past", s.n_past},
          {"kv_bytes", s.kv_bytes},
          {"kv_bytes_dense", s.kv_bytes_dense},
          {"press", s.press},
          {"kv_cache_type", s.kv_cache_type},
          {"cached_tokens", s.cached_tokens},
          {"prefill_tps", s.prefill_tps},
          {"decode_tps", s.decode_tps}};
  if (s.compression.requested) j["compression"] = compression_json(s.compression);
  if (!s.conversation.key.empty()) {
    j["conversation_key"] = s.conversation.key;
    j["conversation_key_source"] = s.conversation.source;
  }
  if (!s.replica.empty()) j["replica"] = s.replica;
  return j;
}

namespace {
json base_object(Endpoint ep, bool chunk, const std::string& id, int64_t created, const std::string& model) {
  const char* object = ep == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}
// Model text may end inside a UTF-8 sequence only at a stream's cut; replace rather than throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
}  // namespace

std::string completion_body(Endpoint ep, const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const std::string& finish_reason, const CompletionStats& st) {
  json j = base_object(ep, false, id, created, model);
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
  if (ep == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(st);
  if (!st.conversation.key.empty()) j["prompt_cache_key"] = st.conversation.key;
  j["kvtrim"] = kvtrim_json(st);
  return dump(j);
}

std::string stream_chunk(Endpoint ep, const std::string& id, int64_t created, const std::string& model,
                         const std::string& delta, bool first, const std::string& finish_reason,
                         const CompletionStats* st) {
  json j = base_object(ep, true, id, created, model);
  json choice = {{"index", 0}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  if (ep == Endpoint::kChat) {
    json d = json::object();
    if (first) d["role"] = "assistant";
    if (!delta.empty() || finish_reason.empty()) d["content"] = delta;
    choice["delta"] = d;
  } else {
    choice["text"] = delta;
  }
  j["choices"] = json::array({choice});
  if (st) {
    j["usage"] = usage_json(*st);
    if (!st->conversation.key.empty()) j["prompt_cache_key"] = st->conversation.key;
    j["kvtrim"] = kvtrim_json(*st);
  }
  return "data: " + dump(j) + "\n\n";
}

std::string stream_error_event(const ApiError& e) { return "data: " + error_body(e) + "\n\n"; }

std::string models_body(const std::string& model_id, int64_t created, int64_t n_ctx) {
  json m = {{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "kvtrim"},
            {"meta", {{"n_ctx", n_ctx}}}};
  return dump(json{{"object", "list"}, {"data", json::array({m})}});
}

}  // namespace kvtrim::server
