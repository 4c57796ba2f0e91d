// The extra inputs of a chat template, as the keyword arguments of transformers'
// apply_chat_template (ChatTemplate::render, model/chat_template.h).
#pragma once
#include <nlohmann/json.hpp>

namespace kvtrim {

struct ChatOptions {
  nlohmann::ordered_json tools;                                     // null: none (the `tools` variable is none)
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();  // e.g. {"enable_thinking": false}
};

}  // namespace kvtrim
