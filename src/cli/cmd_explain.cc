// ferry explain: cause and fix for the errors verl's FAQ lists.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "ferry/device.h"

namespace ferry::cli {
namespace {

struct ExplainArgs {
  std::vector<std::string> text;
  std::string file;
  std::string data_dir;
  bool json = false;
};

Result<std::string> read_log(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errno_status("open", path, errno);
  // istream::read turns a read error (a folder: EISDIR) into badbit; istreambuf_iterator
  // would let the exception escape.
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) text.append(chunk, in.gcount());
  if (in.bad()) return errno_status("read", path, errno);
  return text;
}

Result<std::string> input_text(const ExplainArgs& a) {
  if (!a.file.empty()) return read_log(a.file);
  if (!a.text.empty() && !(a.text.size() == 1 && a.text[0] == "-")) {
    std::string joined;
    for (const std::string& t : a.text) joined += (joined.empty() ? "" : " ") + t;
    return joined;
  }
  if (a.text.empty() && ::isatty(STDIN_FILENO)) {
    return invalid_argument("give an error text, --file LOG, or pipe the log on stdin");
  }
  return std::string(std::istreambuf_iterator<char>(std::cin), {});
}

int run_explain(const ExplainArgs& a) {
  auto text = input_text(a);
  if (!text.ok()) {
    return text.status().code() == Code::kInvalidArgument ? usage_error(text.status())
                                                          : report_error(text.status());
  }
  auto found = device::explain(*text, device::data_path(a.data_dir));
  if (!found.ok()) return report_error(found.status());
  if (a.json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const auto& e : *found) {
      j.push_back({{"id", e.id},
                   {"title", e.title},
                   {"matched", e.matched},
                   {"cause", e.cause},
                   {"fix", e.fix}});
    }
    std::cout << j.dump(2) << "\n";
  } else {
    for (const auto& e : *found) {
      std::printf("[%s] %s\n  seen:  %s\n  cause: %s\n  fix:\n", e.id.c_str(), e.title.c_str(),
                  e.matched.c_str(), e.cause.c_str());
      for (const std::string& f : e.fix) std::printf("    %s\n", f.c_str());
    }
  }
  if (found->empty()) {
    std::fprintf(stderr, "ferry explain: no known error in the text (patterns: %s)\n",
                 a.data_dir.empty() ? "built-in" : a.data_dir.c_str());
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

void add_explain_command(CLI::App& app, Dispatch& dispatch) {
  auto args = std::make_shared<ExplainArgs>();
  CLI::App* cmd = add_command(
      app, dispatch, "explain", "Explain a verl / NPU error message: its cause and the exact fix",
      "ferry explain \"torch_npu detected, but NPU device is not available or visible\"\n"
      "  ferry explain --file train.log\n  python train.py 2>&1 | ferry explain",
      [args] { return run_explain(*args); });
  cmd->add_option("text", args->text, "Error text ('-' or nothing: read stdin)");
  cmd->add_option("--file", args->file, "Read the error text from a log file");
  cmd->add_option(
      "--data-dir", args->data_dir,
      "Folder with explain_patterns.json (default: $FERRY_DATA_DIR, installed, built-in)");
  cmd->add_flag("--json", args->json, "Print JSON");
}

}  // namespace ferry::cli
