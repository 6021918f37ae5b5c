#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "base/coding.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "ferry/safetensors.h"

namespace ferry {

Result<SafetensorsHeader> read_safetensors_header(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno_status("open", path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_status("fstat", path, errno);
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  std::vector<std::byte> prefix(file_size < 8 ? file_size : 8);
  FERRY_RETURN_IF_ERROR(read_exact(fd.get(), prefix, path));
  if (file_size >= 8) {
    const std::uint64_t n = coding::Reader(prefix).u64();
    // Read the JSON only once its length is known to be sane; the parser reports the rest.
    if (n <= kSafetensorsMaxHeaderBytes && n <= file_size - 8) {
      prefix.resize(8 + n);
      FERRY_RETURN_IF_ERROR(read_exact(fd.get(), std::span(prefix).subspan(8), path));
    }
  }
  return parse_safetensors_header(prefix, file_size, path);
}

struct SafetensorsFile::Impl {
  MappedFile file;
  SafetensorsHeader header;
};

SafetensorsFile::SafetensorsFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto mapped = map_file_readonly(path);
  if (!mapped.ok()) return mapped.status();
  auto header = parse_safetensors_header(mapped->region.bytes(), mapped->region.size(), path);
  if (!header.ok()) return header.status();
  auto impl = std::make_unique<Impl>(Impl{std::move(*mapped), std::move(*header)});
  return SafetensorsFile(std::move(impl));
}

const std::string& SafetensorsFile::path() const { return impl_->file.path; }
const SafetensorsHeader& SafetensorsFile::header() const { return impl_->header; }

TensorView SafetensorsFile::view(const SafetensorsEntry& entry) const {
  const std::byte* base = impl_->file.region.data() + impl_->header.data_offset;
  return TensorView{entry.spec, {base + entry.begin, entry.end - entry.begin}};
}

Result<TensorView> SafetensorsFile::view(std::string_view name) const {
  const SafetensorsEntry* e = impl_->header.find(name);
  if (e == nullptr) return not_found(path() + ": no tensor named '" + std::string(name) + "'");
  return view(*e);
}

}  // namespace ferry
