// Status and Result<T>: the one error vocabulary of kvpool.
//
// A Status is a code chosen by what the caller does next, plus a message with
// the detail. Result<T> is a value or a non-OK Status. Both are cheap to move;
// an OK Status allocates nothing. Thread-compatible (like an int).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "common/check.h"

namespace kvpool {

// Codes match the kvpool_status values of the C ABI one to one.
enum class StatusCode : int32_t {
  kOk = 0,
  kNotFound = 1,            // a miss: the key is not cached
  kAlreadyExists = 2,       // the key is committed already (first writer won)
  kInvalidArgument = 3,     // the request is malformed; do not retry it
  kUnavailable = 4,         // transient: retry this call
  kResourceExhausted = 5,   // out of space or over a limit
  kFailedPrecondition = 6,  // the system is not in a state to do this
  kAborted = 7,             // retry higher up (e.g. a whole transaction)
  kDeadlineExceeded = 8,    // the call ran out of time
  kCorruption = 9,          // stored data failed verification
  kIOError = 10,            // the device or the OS failed
  kInternal = 11,           // a bug
  kPermissionDenied = 12,   // the caller may not do this (credentials, tenant)
};
inline constexpr int32_t kMaxStatusCode = 12;
// Whether a code from the wire names a StatusCode other than kOk.
inline bool IsErrorStatusCode(int32_t code) { return code > 0 && code <= kMaxStatusCode; }

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string_view message);

  static Status Ok() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  std::string_view message() const { return rep_ ? std::string_view(rep_->message) : ""; }
  // "OK" or "NotFound: message".
  std::string ToString() const;

  Status(const Status& other) : rep_(other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr) {}
  Status& operator=(const Status& other) {
    rep_ = other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr;
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  // Marks a status as deliberately ignored.
  void IgnoreError() const {}

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<Rep> rep_;
};

inline Status NotFound(std::string_view m) { return Status(StatusCode::kNotFound, m); }
inline Status AlreadyExists(std::string_view m) { return Status(StatusCode::kAlreadyExists, m); }
inline Status InvalidArgument(std::string_view m) { return Status(StatusCode::kInvalidArgument, m); }
inline Status Unavailable(std::string_view m) { return Status(StatusCode::kUnavailable, m); }
inline Status ResourceExhausted(std::string_view m) {
  return Status(StatusCode::kResourceExhausted, m);
}
inline Status FailedPrecondition(std::string_view m) {
  return Status(StatusCode::kFailedPrecondition, m);
}
inline Status Aborted(std::string_view m) { return Status(StatusCode::kAborted, m); }
inline Status DeadlineExceeded(std::string_view m) {
  return Status(StatusCode::kDeadlineExceeded, m);
}
inline Status Corruption(std::string_view m) { return Status(StatusCode::kCorruption, m); }
inline Status IOError(std::string_view m) { return Status(StatusCode::kIOError, m); }
inline Status Internal(std::string_view m) { return Status(StatusCode::kInternal, m); }
inline Status PermissionDenied(std::string_view m) {
  return Status(StatusCode::kPermissionDenied, m);
}
// An IOError carrying strerror(err) after the context.
Status ErrnoStatus(std::string_view context, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    KVPOOL_CHECK(!std::get<Status>(v_).ok());
  }

  bool ok() const { return v_.index() == 0; }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  Status TakeStatus() && { return ok() ? Status() : std::move(std::get<Status>(v_)); }

  T& value() & {
    KVPOOL_CHECK(ok());
    return std::get<T>(v_);
  }
  const T& value() const& {
    KVPOOL_CHECK(ok());
    return std::get<T>(v_);
  }
  T&& value() && {
    KVPOOL_CHECK(ok());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvpool

#define KVPOOL_CONCAT_INNER(a, b) a##b
#define KVPOOL_CONCAT(a, b) KVPOOL_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if it is not OK.
#define KVPOOL_RETURN_IF_ERROR(expr)              \
  do {                                            \
    ::kvpool::Status _kvpool_st = (expr);         \
    if (!_kvpool_st.ok()) return _kvpool_st;      \
  } while (0)

// `KVPOOL_ASSIGN_OR_RETURN(auto x, MakeX());`
#define KVPOOL_ASSIGN_OR_RETURN(lhs, expr) \
  KVPOOL_ASSIGN_OR_RETURN_IMPL(KVPOOL_CONCAT(_kvpool_res_, __LINE__), lhs, expr)
#define KVPOOL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).TakeStatus(); \
  lhs = std::move(tmp).value()
