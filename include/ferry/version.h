#pragma once

#include "ferry/export.h"

namespace ferry {

// The library's version, "MAJOR.MINOR.PATCH".
FERRY_EXPORT const char* version();

}  // namespace ferry
