// Backing memory before a timed copy writes it.
#pragma once

#include <cstddef>

namespace ferry {

// Faults every page of [p, p + bytes) in writable and stores once into each page, keeping
// its contents. MADV_POPULATE_WRITE / MAP_POPULATE alone map the pages, but a hypervisor
// that backs guest memory lazily (Firecracker, a balloon's free page reporting) backs
// each one only at the guest's first store: measured, the first copy into a 2.5 GB
// buffer populated without the stores ran ~20x slower than the second.
// REQUIRES: the range is mapped readable and writable by this process.
void prefault_writable(void* p, std::size_t bytes);

}  // namespace ferry
