#include "base/prefault.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

namespace ferry {
namespace {

// Pages of [p, p + bytes) mincore reports resident.
std::size_t resident_pages(void* p, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((bytes + page - 1) / page);
  EXPECT_EQ(::mincore(p, bytes, in.data()), 0);
  std::size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}

TEST(PrefaultTest, EveryPageOfAFreshMappingIsResidentAfterward) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t bytes = 64 * page;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(resident_pages(p, bytes), 0u);
  prefault_writable(p, bytes);
  EXPECT_EQ(resident_pages(p, bytes), 64u);
  ::munmap(p, bytes);
}

TEST(PrefaultTest, EveryPageOfAReadOnlyMappingIsResidentAfterward) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t bytes = 64 * page;
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(resident_pages(p, bytes), 0u);
  prefault_readable(p, bytes);  // must not store: a store here would be SIGSEGV
  EXPECT_EQ(resident_pages(p, bytes), 64u);
  ::munmap(p, bytes);
}

// The stores that back each page must not clobber what the memory already holds.
TEST(PrefaultTest, KeepsTheBytesAlreadyThere) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t bytes = 8 * page + 100;  // a partial last page too
  std::vector<unsigned char> data(bytes);
  for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
  const std::vector<unsigned char> want = data;
  prefault_writable(data.data(), bytes);
  EXPECT_EQ(data, want);
}

TEST(PrefaultTest, AnEmptyRangeIsANoOp) {
  prefault_writable(nullptr, 0);
  prefault_readable(nullptr, 0);
  unsigned char b = 42;
  prefault_writable(&b, 0);
  EXPECT_EQ(b, 42);
}

}  // namespace
}  // namespace ferry
