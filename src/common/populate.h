// PopulateForWrite: the page tables of a range built for writing in one
// call, instead of one page fault per page at its first write. Where page
// faults are dear (a guest's faults exit to its host), a buffer that is
// written once and kept, such as a replay buffer filling up, costs its
// writer several times the bytes' copy in faults alone.
#pragma once

#include <cstddef>

namespace kvpool {

// Builds the page tables of every page [p, p + n) touches, writable; the
// bytes are left as they are (MADV_POPULATE_WRITE), so a page shared with
// other data is safe to name. Returns false where the kernel cannot (before
// Linux 5.14): the pages then fault in as they are written.
bool PopulateForWrite(void* p, size_t n);

}  // namespace kvpool
