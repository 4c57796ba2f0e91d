// The OpenAI-compatible wire format of `kvtrim serve`: request parsing with a check for every
// field a client can get wrong (ApiError: the HTTP status, the OpenAI error type, the offending
// parameter), and the JSON of completions, stream chunks, errors and the model list. No model
// or HTTP code here: the scheduler turns a parsed request into a job, http_server.cpp moves the
// bytes.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/context_question.h"
#include "engine/sampler.h"
#include "kv/kv_types.h"
#include "model/chat_options.h"
#include "model/tokenizer.h"

namespace kvtrim::server {

// A client error (4xx) or a refusal (503): rendered as {"error": {message, type, param, code}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {});
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string type_, param_, code_;
};

enum class Endpoint { kChat, kCompletion };

// What the server allows (from its command line), for validation.
struct RequestLimits {
  int64_t n_ctx = 0;            // a slot's context: prompt + max_tokens must fit
  int default_max_tokens = 256;  // when the request gives none (capped by the room left)
};

// The per-request cache settings (the extension fields kv_press, kv_press_protect,
// kv_cache_type[_k/_v]).
struct CacheChoice {
  std::optional<std::string> press;  // a press spec ("" = none); unset = the server's default
  std::optional<KvDtype> k, v;       // unset = the server's default
  // kv_press_protect: the prompt's last N tokens are not compressed before they are answered;
  // unset = "last_turn": a chat's last user turn and the generation prompt (on /v1/completions,
  // which has no turns: nothing, the whole prompt is compressed). In [0, n_ctx); a count past the
  // prompt's length is a 400 at submit.
  std::optional<int64_t> protect;
  // kv_press_max_loss: the quality guard's limit on the loss estimate, in [0, 1] (1 = off;
  // ContextCompressOptions::max_loss); unset = the server's --press-max-loss.
  std::optional<double> max_loss;
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  std::vector<ChatMessage> messages;  // chat
  ChatOptions chat;                   // chat: chat_template_kwargs (e.g. {"enable_thinking": false})
  std::string prompt;                 // completions: a string ...
  std::vector<int32_t> prompt_tokens;  // ... or token ids
  bool has_prompt_tokens = false;
  std::optional<int> max_tokens;      // unset: RequestLimits::default_max_tokens
  SamplerParams sampling;             // OpenAI defaults: temperature 1, top_p 1, no top-k
  bool has_seed = false;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  CacheChoice cache;
  // prompt_cache_key: the conversation's routing key (OpenAI's field; the X-Conversation-Id
  // header means the same, resolve_conversation_key() reconciles the two); "" = none given
  std::string prompt_cache_key;
};

// The routing key a replica serves a request under (docs/server.md "Scale-out"): what a load
// balancer hashes so that a conversation's turns reach the replica that holds its cache.
struct ConversationKey {
  std::string key;     // [A-Za-z0-9._:@/+=-], 1 to kMaxConversationKey characters
  std::string source;  // "header" (X-Conversation-Id), "body" (prompt_cache_key) or "derived"
};
constexpr size_t kMaxConversationKey = 128;
// The key of a request: the X-Conversation-Id header (`header`, "" = absent) or the body's
// prompt_cache_key (both given: they must be equal), else one derived from the request's first
// messages (chat: every system message and the first user message; completions: the prompt's
// first 64 bytes or tokens), "auto-" + 16 hex digits, stable across the conversation's turns.
// ApiError 400 for a key that is empty, too long, has other characters, or two keys that differ.
ConversationKey resolve_conversation_key(const CompletionRequest& r, const std::string& header);

// Parses and validates a request body (400 with the field named for anything wrong). The press
// spec is checked by building it (an unknown press or option is a 400 with the registry's text).
CompletionRequest parse_completion_request(const std::string& body, Endpoint ep, const RequestLimits& lim);

// {"error": {...}} for an ApiError (and a 500 body for anything else).
std::string error_body(const ApiError& e);
std::string error_body(int status, const std::string& message);

// What the job's press did to the prompt (the "compression" object of kvtrim's extension): the
// part before the protected tail (the conversation's history, a document) compressed, the tail
// prefilled after it whole.
struct CompressionReport {
  bool requested = false;  // the job has a press (else no "compression" object)
  bool applied = false;    // it ran (else `note` says why not)
  bool reused = false;     // it ran for an earlier job on this very context, reused from the cache
  std::string press, note;
  int64_t context_tokens = 0;    // positions of the compressed part
  double tokens_before = 0, tokens_after = 0;  // its tokens per (layer, kv head), mean
  size_t kv_bytes_before = 0, kv_bytes_after = 0;  // the cache's bytes
  int64_t protected_tokens = 0;  // positions after it, every one kept in every (layer, kv head)
  bool query_aware = false;      // the press scored with the protected tail's queries
  double max_loss = 1;           // the quality guard's limit (1 = off)
  PressLoss loss;                // the kept compression's loss estimate (measured false: none)
  std::vector<CompressAttempt> attempts;  // every compression tried (the guard's retries)
};
nlohmann::json compression_json(const CompressionReport& c);

// Usage and kvtrim's extension object reported with a finished completion.
struct CompletionStats {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  int slot = -1;
  int32_t n_past = 0;
  size_t kv_bytes = 0, kv_bytes_dense = 0;
  std::string press, kv_cache_type;
  double prefill_tps = 0, decode_tps = 0;
  CompressionReport compression;
  // set by the HTTP side: the routing key served (echoed as prompt_cache_key and in the kvtrim
  // object with its source) and this replica's id
  ConversationKey conversation;
  std::string replica;
};
nlohmann::json usage_json(const CompletionStats& s);
nlohmann::json kvtrim_json(const CompletionStats& s);

// A finished completion (non-streaming response).
std::string completion_body(Endpoint ep, const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const std::string& finish_reason, const CompletionStats& st);
// One SSE event "data: {...}\n\n" of a stream: a text delta (finish_reason empty), or the last
// chunk (finish_reason set, with usage and the kvtrim object); the first chat chunk carries the
// assistant role.
std::string stream_chunk(Endpoint ep, const std::string& id, int64_t created, const std::string& model,
                         const std::string& delta, bool first, const std::string& finish_reason,
                         const CompletionStats* st);
std::string stream_error_event(const ApiError& e);
std::string models_body(const std::string& model_id, int64_t created, int64_t n_ctx);

}  // namespace kvtrim::server
