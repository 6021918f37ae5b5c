#pragma once

#include <string>
#include <string_view>

namespace ferry::model {

// "Qwen2ForCausalLM" for "qwen2", and so on.
std::string architecture_for(std::string_view family);

}  // namespace ferry::model
