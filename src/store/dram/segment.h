// Segment: the shared-memory segment of the DRAM tier, a memfd mapped
// MAP_SHARED into this process. Its fd is handed to client processes, which
// map it themselves. Optionally backed by huge pages and pre-faulted.
//
// Thread-compatible: immutable after Create. Owns the fd and the mapping.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvpool::dram {

struct SegmentOptions {
  uint64_t bytes = 0;
  // Try MFD_HUGETLB first; fall back (logged) to 4 KiB pages + MADV_HUGEPAGE.
  bool huge_pages = false;
  // Fault in every page now (first touch costs ~14 µs per 4 KiB page on our VMs).
  bool prefault = true;
  // Seal the fd against writes (F_SEAL_FUTURE_WRITE): processes it is
  // handed to can map it read-only only. Create fails when the kernel
  // cannot.
  bool seal_writes = false;
};

class Segment {
 public:
  static Result<std::unique_ptr<Segment>> Create(const SegmentOptions& options);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int fd() const { return fd_; }
  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  // True when backed by hugetlbfs pages (MFD_HUGETLB succeeded).
  bool huge_pages() const { return huge_pages_; }
  // Bytes of the mapping on 2 MiB pages once created: all of it with
  // hugetlbfs pages, else what transparent huge pages back (read from
  // /proc/self/smaps after the pre-fault; 0 without a pre-fault, whose
  // pages come later).
  uint64_t huge_page_bytes() const { return huge_page_bytes_; }
  // Seconds spent pre-faulting (0 when not asked to).
  double prefault_seconds() const { return prefault_seconds_; }

 private:
  Segment(int fd, uint8_t* base, uint64_t bytes, bool huge)
      : fd_(fd), base_(base), bytes_(bytes), huge_pages_(huge) {}

  int fd_;
  uint8_t* base_;
  uint64_t bytes_;
  bool huge_pages_;
  uint64_t huge_page_bytes_ = 0;
  double prefault_seconds_ = 0;
};

// The host's setting for transparent huge pages of shared memory.
inline constexpr const char* kShmemThpFile = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

// Bytes of the mapping that starts at `base`, in /proc/PID/smaps text,
// mapped with 2 MiB page table entries (ShmemPmdMapped + FilePmdMapped);
// 0 when the mapping is not listed.
uint64_t PmdMappedBytes(std::string_view smaps, uintptr_t base);
// The selected value of a transparent_hugepage setting file's text
// ("always within_size advise [never] deny force" -> "never"); empty when
// none is selected.
std::string SelectedThpSetting(std::string_view text);

}  // namespace kvpool::dram
