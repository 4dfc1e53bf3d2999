#include "store/ssd/file_device.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include "common/log.h"

namespace kvpool {
namespace {

constexpr unsigned kRingDepth = 32;

// Every errno becomes a Status here and nowhere else in the SSD tier.
// A full disk is ResourceExhausted (the store pauses writes and retries);
// anything else is an IOError.
Status IoErr(const char* what, const std::string& path, uint64_t off, int err) {
  std::string ctx = fmt::format("{} {} at {}", what, path, off);
  if (err == ENOSPC || err == EDQUOT) return ResourceExhausted(ctx + ": no space left on device");
  return ErrnoStatus(ctx, err);
}

class FileDevice final : public Device {
 public:
  FileDevice(std::string path, int fd, uint64_t size, bool direct, const FileDeviceOptions& o)
      : path_(std::move(path)), fd_(fd), size_(size), direct_(direct), opts_(o) {
    if (o.use_io_uring) {
      for (int i = 0; i < std::max(1, o.rings); ++i) {
        auto r = std::make_unique<Ring>();
        int rc = io_uring_queue_init(kRingDepth, &r->ring, 0);
        if (rc < 0) {
          LogWarn("ssd: io_uring_queue_init failed for {} ({}); using pread/pwrite", path_,
                  std::strerror(-rc));
          rings_.clear();
          break;
        }
        r->ok = true;
        rings_.push_back(std::move(r));
      }
    }
    LogInfo("ssd: {} opened with {} ({} bytes)", path_, kind(), size_);
  }

  ~FileDevice() override {
    for (auto& r : rings_) io_uring_queue_exit(&r->ring);
    ::close(fd_);
  }

  uint64_t size() const override { return size_; }

  Status Read(uint64_t offset, void* buf, uint64_t len) override {
    KVPOOL_CHECK(offset % kDeviceBlock == 0 && len % kDeviceBlock == 0 && offset + len <= size_);
    return rings_.empty() ? SyncIo(false, offset, buf, len)
                          : RingIo(false, offset, static_cast<uint8_t*>(buf), len);
  }

  Status Write(uint64_t offset, const void* buf, uint64_t len) override {
    KVPOOL_CHECK(offset % kDeviceBlock == 0 && len % kDeviceBlock == 0 && offset + len <= size_);
    auto* p = const_cast<uint8_t*>(static_cast<const uint8_t*>(buf));
    return rings_.empty() ? SyncIo(true, offset, p, len) : RingIo(true, offset, p, len);
  }

  Status WriteV(uint64_t offset, std::span<const Piece> pieces) override {
    if (rings_.empty()) return Device::WriteV(offset, pieces);
    std::vector<Span> spans;
    spans.reserve(pieces.size());
    for (const Piece& p : pieces) {
      KVPOOL_CHECK(offset % kDeviceBlock == 0 && p.len % kDeviceBlock == 0 &&
                   reinterpret_cast<uintptr_t>(p.buf) % kDeviceBlock == 0);
      spans.push_back({offset, const_cast<uint8_t*>(static_cast<const uint8_t*>(p.buf)), p.len});
      offset += p.len;
    }
    KVPOOL_CHECK(offset <= size_);
    return RingIo(true, spans, opts_.write_chunk_bytes);
  }

  Status Sync() override {
    if (::fdatasync(fd_) != 0) return IoErr("fdatasync", path_, 0, errno);
    return Status::Ok();
  }

  std::string kind() const override {
    return std::string(rings_.empty() ? "pread" : "io_uring") + (direct_ ? "+direct" : "+buffered");
  }

 private:
  struct Ring {
    std::mutex mu;
    io_uring ring;
    bool ok = false;
  };

  Status SyncIo(bool write, uint64_t off, void* buf, uint64_t len) {
    auto* p = static_cast<uint8_t*>(buf);
    while (len > 0) {
      ssize_t n = write ? ::pwrite(fd_, p, len, off) : ::pread(fd_, p, len, off);
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoErr(write ? "pwrite" : "pread", path_, off, errno);
      }
      if (n == 0) return IoErr(write ? "pwrite" : "pread", path_, off, write ? ENOSPC : EIO);
      p += n;
      off += n;
      len -= n;
    }
    return Status::Ok();
  }

  struct Span {
    uint64_t off;
    uint8_t* p;
    uint64_t len;
  };

  // One span: submitted as up to kRingDepth chunks at once.
  Status RingIo(bool write, uint64_t off, uint8_t* buf, uint64_t len) {
    uint64_t chunk = write ? std::max<uint64_t>(opts_.write_chunk_bytes, kDeviceBlock) : len;
    chunk = std::max<uint64_t>(chunk, (len + kRingDepth - 1) / kRingDepth);
    const Span one{off, buf, len};
    return RingIo(write, std::span<const Span>(&one, 1), chunk);
  }

  // Cuts the spans into chunks of at most `chunk` bytes, submits them
  // kRingDepth at a time, waits for each wave, and finishes short
  // transfers synchronously (rare: signals, end of file).
  Status RingIo(bool write, std::span<const Span> spans, uint64_t chunk) {
    chunk = AlignUpBlock(std::max<uint64_t>(chunk, kDeviceBlock));
    // Spread threads over rings; a busy ring is skipped when another is free.
    static std::atomic<unsigned> next{0};
    thread_local unsigned home = next.fetch_add(1);
    Ring* ring = nullptr;
    std::unique_lock<std::mutex> lock;
    for (size_t i = 0; i < rings_.size() && ring == nullptr; ++i) {
      Ring* r = rings_[(home + i) % rings_.size()].get();
      std::unique_lock<std::mutex> l(r->mu, std::try_to_lock);
      if (l.owns_lock()) {
        ring = r;
        lock = std::move(l);
      }
    }
    if (ring == nullptr) {
      ring = rings_[home % rings_.size()].get();
      lock = std::unique_lock<std::mutex>(ring->mu);
    }
    struct Piece {
      uint64_t off, len;
      uint8_t* p;
      int64_t res = 0;
    };
    std::vector<Piece> pieces;
    for (const Span& s : spans) {
      for (uint64_t done = 0; done < s.len; done += chunk) {
        pieces.push_back({s.off + done, std::min(chunk, s.len - done), s.p + done});
      }
    }
    for (size_t first = 0; first < pieces.size(); first += kRingDepth) {
      const size_t n = std::min<size_t>(kRingDepth, pieces.size() - first);
      for (size_t i = first; i < first + n; ++i) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring->ring);
        KVPOOL_CHECK(sqe != nullptr);  // n <= kRingDepth and the ring is drained
        if (write) {
          io_uring_prep_write(sqe, fd_, pieces[i].p, pieces[i].len, pieces[i].off);
        } else {
          io_uring_prep_read(sqe, fd_, pieces[i].p, pieces[i].len, pieces[i].off);
        }
        io_uring_sqe_set_data64(sqe, i);
      }
      size_t pending = n;
      int rc = io_uring_submit(&ring->ring);
      if (rc < 0 || static_cast<size_t>(rc) != n) {
        // Not submitted at all (the ring is unusable): drain what went and
        // fall back for this wave.
        LogWarn("ssd: io_uring_submit on {} returned {}; using pread/pwrite for this I/O", path_,
                rc);
        pending = rc > 0 ? rc : 0;
        for (size_t i = first; i < first + n; ++i) pieces[i].res = -EAGAIN;
      }
      while (pending > 0) {
        io_uring_cqe* cqe = nullptr;
        int w = io_uring_wait_cqe(&ring->ring, &cqe);
        if (w == -EINTR) continue;
        KVPOOL_CHECK(w == 0);  // only fails for a broken ring
        pieces[io_uring_cqe_get_data64(cqe)].res = cqe->res;
        io_uring_cqe_seen(&ring->ring, cqe);
        --pending;
      }
    }
    lock.unlock();
    for (auto& p : pieces) {
      if (p.res < 0 && p.res != -EAGAIN && p.res != -EINTR) {
        return IoErr(write ? "write" : "read", path_, p.off, static_cast<int>(-p.res));
      }
      uint64_t got = p.res < 0 ? 0 : static_cast<uint64_t>(p.res);
      if (got < p.len) KVPOOL_RETURN_IF_ERROR(SyncIo(write, p.off + got, p.p + got, p.len - got));
    }
    return Status::Ok();
  }

  static uint64_t AlignUpBlock(uint64_t v) { return (v + kDeviceBlock - 1) / kDeviceBlock * kDeviceBlock; }

  const std::string path_;
  const int fd_;
  const uint64_t size_;
  const bool direct_;
  const FileDeviceOptions opts_;
  std::vector<std::unique_ptr<Ring>> rings_;
};

Result<std::unique_ptr<Device>> OpenFileDevice(const FileDeviceOptions& o, const std::string& path,
                                               uint64_t size) {
  if (size == 0 || size % kDeviceBlock != 0) return InvalidArgument("device size not block-aligned");
  bool direct = o.direct_io;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0 && direct && errno == EINVAL) {
    LogWarn("ssd: {} refuses O_DIRECT; using buffered I/O", path);
    direct = false;
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  }
  if (fd < 0) return ErrnoStatus("open " + path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return ErrnoStatus("fstat " + path, e);
  }
  // Allocate every block now so later writes cannot fail for space. Where
  // that is impossible (no space, or unsupported), size the file sparsely:
  // writes may then fail with ENOSPC, which the store handles.
  int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(size));
  if (rc != 0) {
    int e = errno;
    if (e == ENOSPC) {
      LogWarn("ssd: cannot preallocate {} bytes for {} (no space); file is sparse, writes may "
              "fail until space frees",
              size, path);
    } else if (e != EOPNOTSUPP) {
      LogWarn("ssd: fallocate {} failed: {}; file is sparse", path, std::strerror(e));
    }
    if (static_cast<uint64_t>(st.st_size) < size && ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      e = errno;
      ::close(fd);
      return ErrnoStatus("ftruncate " + path, e);
    }
  }
  return std::unique_ptr<Device>(new FileDevice(path, fd, size, direct, o));
}

}  // namespace

DeviceFactory FileDeviceFactory(const FileDeviceOptions& options) {
  return [options](const std::string& path, uint64_t size) {
    return OpenFileDevice(options, path, size);
  };
}

DeviceFactory FileDeviceFactory() { return FileDeviceFactory(FileDeviceOptions{}); }

}  // namespace kvpool
