// Backing memory before a timed copy writes it.
#pragma once

#include <cstddef>

namespace ferry {

// Faults every page of [p, p + bytes) in writable and stores once into each page, keeping
// its contents. MADV_POPULATE_WRITE / MAP_POPULATE alone map the pages, but a hypervisor
// that shadows or lazily backs guest memory (seen on a PVM guest) pays its own fault at
// each page's first access from each process: measured, the first copy into a buffer
// populated without the stores ran ~20x slower than the second.
// REQUIRES: the range is mapped readable and writable by this process.
void prefault_writable(void* p, std::size_t bytes);

// The same for a read-only mapping: faults every page in and loads once from each page.
// REQUIRES: the range is mapped readable by this process.
void prefault_readable(const void* p, std::size_t bytes);

}  // namespace ferry
