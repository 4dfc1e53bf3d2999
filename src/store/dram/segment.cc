#include "store/dram/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "common/populate.h"

namespace kvpool::dram {
namespace {

constexpr uint64_t kHugePageBytes = 2ull << 20;

std::string ReadFile(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Logs what the segment's pages are, and how to get huge ones where it
// asked for them and got none.
void LogPages(uint64_t bytes, uint64_t huge_bytes, bool hugetlb, bool asked, bool prefaulted) {
  if (hugetlb) return;  // the node's serving line says so
  if (huge_bytes > 0) {
    LogInfo("dram: transparent huge pages back {} MiB of the segment's {} MiB", huge_bytes >> 20,
            bytes >> 20);
    return;
  }
  if (!asked || !prefaulted) return;
  const std::string thp = SelectedThpSetting(ReadFile(kShmemThpFile));
  LogWarn(
      "dram: the segment is on 4 KiB pages: no hugetlb pages are reserved and transparent huge "
      "pages for shared memory are {} ({}); as root, `echo advise > {}` gives the next start huge "
      "pages without reserving any (the packaged service unit does this), or reserve hugetlb pages "
      "(vm.nr_hugepages)",
      thp.empty() ? "unavailable" : "'" + thp + "'", kShmemThpFile, kShmemThpFile);
}

// Creates a sized memfd and maps it. Returns the errno-derived status of the
// first failing step; leaves nothing open on failure.
Status MapMemfd(uint64_t bytes, unsigned extra_flags, bool seal_writes, int* fd_out,
                uint8_t** base_out) {
  int fd = memfd_create("kvpool-dram", MFD_CLOEXEC | MFD_ALLOW_SEALING | extra_flags);
  if (fd < 0) return ErrnoStatus("memfd_create", errno);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus("ftruncate", err);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    close(fd);
    return ErrnoStatus("mmap", err);
  }
  // Clients get this fd: sealing its size means none of them can shrink the
  // segment under us (which would turn our accesses into SIGBUS). Sealing
  // future writes leaves our mapping writable but lets no one map it
  // writable again, write(2) to it or punch holes in it.
  if (seal_writes) {
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) !=
        0) {
      int err = errno;
      munmap(p, bytes);
      close(fd);
      return ErrnoStatus("sealing the segment against client writes (F_SEAL_FUTURE_WRITE)", err);
    }
    // Some kernels accept the seal on hugetlb memfds without enforcing it:
    // a writable mapping must fail now, or the segment is not handed out.
    const uint64_t probe_bytes = (extra_flags & MFD_HUGETLB) != 0 ? kHugePageBytes : 4096;
    void* probe = mmap(nullptr, probe_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (probe != MAP_FAILED) {
      munmap(probe, probe_bytes);
      munmap(p, bytes);
      close(fd);
      return FailedPrecondition(
          "this kernel does not enforce F_SEAL_FUTURE_WRITE on this memfd: clients could write "
          "the segment (--writable-segment runs without read-only clients)");
    }
  } else if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    LogWarn("dram: cannot seal the segment's size: {}", ErrnoStatus("fcntl", errno).ToString());
  }
  *fd_out = fd;
  *base_out = static_cast<uint8_t*>(p);
  return Status::Ok();
}

}  // namespace

uint64_t PmdMappedBytes(std::string_view smaps, uintptr_t base) {
  char head[24];
  const auto [end, ec] = std::to_chars(head, head + sizeof(head) - 1, base, 16);
  if (ec != std::errc()) return 0;
  *end = '-';
  const std::string_view want(head, static_cast<size_t>(end - head) + 1);
  bool in = false;
  uint64_t kib = 0;
  while (!smaps.empty()) {
    const size_t nl = smaps.find('\n');
    std::string_view line = smaps.substr(0, nl);
    smaps = nl == std::string_view::npos ? std::string_view() : smaps.substr(nl + 1);
    // A mapping's first line starts with its address (lowercase hex); its
    // fields start with a capital letter.
    const bool header =
        !line.empty() && ((line[0] >= '0' && line[0] <= '9') || (line[0] >= 'a' && line[0] <= 'f'));
    if (header) {
      if (in) break;
      in = line.starts_with(want);
      continue;
    }
    if (!in) continue;
    for (std::string_view field : {"ShmemPmdMapped:", "FilePmdMapped:"}) {
      if (!line.starts_with(field)) continue;
      std::string_view v = line.substr(field.size());
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      uint64_t n = 0;
      if (std::from_chars(v.data(), v.data() + v.size(), n).ec == std::errc()) kib += n;
    }
  }
  return kib << 10;
}

std::string SelectedThpSetting(std::string_view text) {
  const size_t open = text.find('[');
  const size_t close = open == std::string_view::npos ? open : text.find(']', open);
  if (close == std::string_view::npos) return {};
  return std::string(text.substr(open + 1, close - open - 1));
}

Result<std::unique_ptr<Segment>> Segment::Create(const SegmentOptions& options) {
  if (options.bytes == 0) return InvalidArgument("segment of 0 bytes");
  int fd = -1;
  uint8_t* base = nullptr;
  bool huge = false;
  if (options.huge_pages) {
    if (options.bytes % kHugePageBytes != 0) {
      LogInfo("dram: {} bytes is not a multiple of 2 MiB; using 4 KiB pages", options.bytes);
    } else {
      // With no hugetlb pages reserved, mmap fails with ENOMEM here rather
      // than SIGBUS later, because hugetlb mappings reserve at mmap time.
      Status st = MapMemfd(options.bytes, MFD_HUGETLB, options.seal_writes, &fd, &base);
      if (st.ok()) {
        huge = true;
      } else {
        LogInfo("dram: hugetlb pages unavailable ({}); asking for transparent huge pages",
                st.ToString());
      }
    }
  }
  if (!huge) {
    KVPOOL_RETURN_IF_ERROR(MapMemfd(options.bytes, 0, options.seal_writes, &fd, &base));
    // Transparent huge pages for shmem, where the admin allows it
    // (shmem_enabled=advise); harmless otherwise.
    if (options.huge_pages) madvise(base, options.bytes, MADV_HUGEPAGE);
  }
  std::unique_ptr<Segment> seg(new Segment(fd, base, options.bytes, huge));
  if (options.prefault) {
    auto t0 = std::chrono::steady_clock::now();
    if (!PopulateForWrite(base, options.bytes)) {
      // Older kernel: touch one byte per page (writes, so the page is
      // allocated, not mapped to the zero page).
      const uint64_t page = huge ? kHugePageBytes : 4096;
      for (uint64_t off = 0; off < options.bytes; off += page) {
        reinterpret_cast<volatile uint8_t*>(base)[off] = 0;
      }
    }
    seg->prefault_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    LogInfo("dram: pre-faulted {} MiB in {:.3f} s", options.bytes >> 20, seg->prefault_seconds_);
  }
  // Without a pre-fault the pages come later, and there is nothing to read.
  if (huge) {
    seg->huge_page_bytes_ = options.bytes;
  } else if (options.prefault) {
    seg->huge_page_bytes_ =
        PmdMappedBytes(ReadFile("/proc/self/smaps"), reinterpret_cast<uintptr_t>(base));
  }
  LogPages(options.bytes, seg->huge_page_bytes_, huge, options.huge_pages, options.prefault);
  return seg;
}

Segment::~Segment() {
  munmap(base_, bytes_);
  close(fd_);
}

}  // namespace kvpool::dram
