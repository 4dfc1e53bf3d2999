// CHECK: a broken invariant crashes with a message; it is never an error code.
#pragma once

namespace kvpool::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* expr);
}  // namespace kvpool::internal

#define KVPOOL_CHECK(cond)                                              \
  do {                                                                  \
    if (__builtin_expect(!(cond), 0))                                   \
      ::kvpool::internal::CheckFailed(__FILE__, __LINE__, #cond);       \
  } while (0)
