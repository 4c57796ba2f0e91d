// LimitError: what Session throws when a step would pass a limit (the context, the KV memory
// limit SessionParams::kv_mem_limit). It is raised before any work, so nothing was changed and
// a caller may retry differently (the server answers 503, and steps a batch's other sessions).
#pragma once
#include "core/error.h"

namespace kvtrim {

class LimitError : public Error {
 public:
  using Error::Error;
};

}  // namespace kvtrim
