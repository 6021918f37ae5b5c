#include "ferry/version.h"

namespace ferry {

const char* version() { return FERRY_VERSION; }

}  // namespace ferry
