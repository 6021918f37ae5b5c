// The FAQ's three logging layers: framework -> operators (CANN) -> communication.
#include "ferry/device.h"

namespace ferry::device {

std::vector<DebugVariable> debug_env(Platform platform) {
  std::vector<DebugVariable> vars = {
      {"framework", "VERL_LOGGING_LEVEL", "DEBUG",
       "verl's loggers (weight sync, scheduling) print debug lines; ferry follows it"},
      {"framework", "FERRY_LOG_LEVEL", "debug", "ferry's own log, overriding VERL_LOGGING_LEVEL"},
  };
  const bool ascend = platform == Platform::kAscend || platform == Platform::kCpu;
  const bool gpu = platform != Platform::kAscend;
  if (ascend) {
    vars.push_back({"cann", "ASCEND_GLOBAL_LOG_LEVEL", "0",
                    "CANN operator and runtime logs at DEBUG (0=DEBUG 1=INFO 2=WARNING 3=ERROR)"});
    vars.push_back({"cann", "ASCEND_SLOG_PRINT_TO_STDOUT", "1",
                    "CANN logs go to stdout instead of ~/ascend/log only"});
    vars.push_back({"communication", "HCCL_DEBUG", "INFO",
                    "HCCL collective-communication logs (multi-NPU hangs and errors)"});
  }
  if (gpu) {
    vars.push_back({"communication", "NCCL_DEBUG", "INFO",
                    "NCCL (and RCCL on ROCm) collective-communication logs"});
  }
  return vars;
}

}  // namespace ferry::device
