// The request limits the API tests parse with: a 256-token context, every other limit default.
#pragma once
#include "server/api.h"

namespace kvtrim::server::test_api {

inline RequestLimits limits() {
  RequestLimits l;
  l.n_ctx = 256;
  return l;
}

}  // namespace kvtrim::server::test_api
