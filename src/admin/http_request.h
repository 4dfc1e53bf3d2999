// HTTP/1.x request-head parsing for the admin endpoint.
//
// A strict, bounded parser: it looks at no more than max_head_bytes, keeps
// only what the admin server routes on (method, path), and rejects anything
// it does not understand rather than guessing. It never allocates more than
// the method and path it returns. Thread-safe (a pure function).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvpool::admin {

struct HttpRequestHead {
  std::string method;  // e.g. "GET"; uppercase token
  std::string path;    // request target up to '?' (the query is ignored)
  int minor_version = 1;  // HTTP/1.<minor_version>
  // The value of the Authorization header (empty when absent; the last one
  // when repeated), with surrounding blanks removed.
  std::string authorization;
  // Content-Length (-1: absent). A head with Transfer-Encoding, a repeated
  // or malformed Content-Length is kBad: only sized bodies are read.
  int64_t content_length = -1;
};

enum class HeadParse {
  kIncomplete,  // no blank line yet; read more (if the bound allows)
  kComplete,    // *head and *head_bytes are set
  kBad,         // malformed: answer 400 and close
  kTooLarge,    // no end of head within max_head_bytes: answer 431 and close
  kBadVersion,  // not HTTP/1.0 or HTTP/1.1: answer 505 and close
};

// Parses the request head at the start of `buf`. *head_bytes is the length
// of the head including its blank line.
HeadParse ParseRequestHead(std::string_view buf, size_t max_head_bytes, HttpRequestHead* head,
                           size_t* head_bytes);

}  // namespace kvpool::admin
