#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/atomic_file.h"
#include "base/coding.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "ferry/safetensors.h"

namespace ferry {

Result<std::string> build_safetensors_header(const std::vector<TensorSpec>& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps tensors in the order given, as the data section lays them out.
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  if (!metadata.empty()) doc["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    if (t.name == "__metadata__") return invalid_argument("tensor name '__metadata__' is reserved");
    if (doc.contains(t.name)) return invalid_argument("tensor '" + t.name + "' is listed twice");
    auto checked = TensorSpec::make(t.name, t.dtype, t.shape);
    if (!checked.ok()) return checked.status();
    const std::uint64_t end = offset + t.bytes();
    doc[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                   {"shape", t.shape},
                   {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = doc.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kSafetensorsMaxHeaderBytes) {
    return invalid_argument("safetensors header of " + std::to_string(text.size()) +
                            " bytes exceeds the format's limit");
  }
  std::vector<std::byte> length;  // the format's u64 little-endian header length
  coding::put_u64(&length, text.size());
  return std::string(reinterpret_cast<const char*>(length.data()), length.size()) + text;
}

struct SafetensorsWriter::Impl {
  AtomicFile file;
  std::vector<TensorSpec> tensors;
  std::uint64_t total = 0;
  std::uint64_t written = 0;
  std::size_t next_tensor = 0;       // for write_tensor's order check
  std::uint64_t next_tensor_at = 0;  // data offset where tensors[next_tensor] starts
};

SafetensorsWriter::SafetensorsWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter::~SafetensorsWriter() = default;

Result<SafetensorsWriter> SafetensorsWriter::create(const std::string& path,
                                                    std::vector<TensorSpec> tensors,
                                                    std::map<std::string, std::string> metadata) {
  auto header = build_safetensors_header(tensors, metadata);
  if (!header.ok()) return header.status().with_context(path);
  auto file = AtomicFile::create(path);
  if (!file.ok()) return file.status();
  FERRY_RETURN_IF_ERROR(file->write(as_bytes(*header)));
  std::uint64_t total = 0;
  for (const TensorSpec& t : tensors) total += t.bytes();
  auto impl = std::make_unique<Impl>(Impl{std::move(*file), std::move(tensors), total, 0, 0, 0});
  return SafetensorsWriter(std::move(impl));
}

Status SafetensorsWriter::write(std::span<const std::byte> data) {
  if (data.size() > impl_->total - impl_->written) {
    return invalid_argument(impl_->file.path() + ": " + std::to_string(data.size()) +
                            " more bytes than the tensors hold (" +
                            std::to_string(impl_->total - impl_->written) + " left)");
  }
  FERRY_RETURN_IF_ERROR(impl_->file.write(data));
  impl_->written += data.size();
  return Status();
}

Status SafetensorsWriter::write_tensor(const TensorView& tensor) {
  Impl& m = *impl_;
  // Skip past tensors the caller streamed with write().
  while (m.next_tensor < m.tensors.size() && m.next_tensor_at < m.written) {
    m.next_tensor_at += m.tensors[m.next_tensor++].bytes();
  }
  if (m.next_tensor >= m.tensors.size() || m.next_tensor_at != m.written ||
      m.tensors[m.next_tensor] != tensor.spec || tensor.data.size() != tensor.spec.bytes()) {
    return invalid_argument(
        m.file.path() + ": tensor '" + tensor.spec.name +
        "' is not the next tensor of the header, or its bytes do not match its spec");
  }
  FERRY_RETURN_IF_ERROR(write(tensor.data));
  m.next_tensor_at += m.tensors[m.next_tensor++].bytes();
  return Status();
}

Status SafetensorsWriter::finish() {
  if (impl_->written != impl_->total) {
    return failed_precondition(impl_->file.path() + ": only " + std::to_string(impl_->written) +
                               " of " + std::to_string(impl_->total) + " data bytes were written");
  }
  return impl_->file.commit();
}

std::uint64_t SafetensorsWriter::bytes_written() const { return impl_->written; }
std::uint64_t SafetensorsWriter::bytes_total() const { return impl_->total; }

}  // namespace ferry
