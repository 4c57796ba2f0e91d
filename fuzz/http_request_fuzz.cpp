// Fuzz target "http_request": the request bodies of `kvtrim serve` (POST /v1/chat/completions
// and /v1/completions; src/server/api.cpp) over arbitrary bytes. Byte 0 picks the endpoint,
// the rest is the body. Properties: a request either parses or is refused with an ApiError
// whose status is 4xx or 503 and whose error body is valid JSON naming the problem; a parsed
// request respects the server's limits (max_tokens within the context, a chat with messages,
// sampling parameters in range).
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_util.h"
#include "server/api.h"

using namespace kvtrim;
using namespace kvtrim::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Endpoint ep = (data[0] & 1) ? Endpoint::kCompletion : Endpoint::kChat;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  RequestLimits lim;
  lim.n_ctx = 2048;
  lim.default_max_tokens = 256;
  CompletionRequest r;
  try {
    r = parse_completion_request(body, ep, lim);
  } catch (const ApiError& e) {
    KVTRIM_FUZZ_ASSERT((e.status() >= 400 && e.status() < 500) || e.status() == 503, "status %d", e.status());
    const std::string eb = error_body(e);
    const auto j = nlohmann::json::parse(eb, nullptr, /*allow_exceptions=*/false);
    KVTRIM_FUZZ_ASSERT(!j.is_discarded() && j.contains("error") && j["error"].contains("message"),
                       "error body is not an OpenAI error object: %s", eb.c_str());
    KVTRIM_FUZZ_ASSERT(!std::string(e.what()).empty(), "empty error message");
    return 0;
  }
  KVTRIM_FUZZ_ASSERT(r.endpoint == ep, "endpoint changed");
  if (ep == Endpoint::kChat) KVTRIM_FUZZ_ASSERT(!r.messages.empty(), "a chat request without messages");
  if (r.max_tokens) KVTRIM_FUZZ_ASSERT(*r.max_tokens >= 0 && *r.max_tokens <= lim.n_ctx, "max_tokens %d", *r.max_tokens);
  KVTRIM_FUZZ_ASSERT(r.sampling.temperature >= 0 && r.sampling.top_p >= 0 && r.sampling.top_p <= 1,
                     "sampling out of range (temperature %g, top_p %g)", r.sampling.temperature, r.sampling.top_p);
  for (int32_t t : r.prompt_tokens) KVTRIM_FUZZ_ASSERT(t >= 0, "negative prompt token %d", t);
  return 0;
}
