#include "admin/http_request.h"

namespace kvpool::admin {
namespace {

constexpr size_t kMaxMethodBytes = 16;
constexpr size_t kMaxTargetBytes = 2048;

bool IsTokenUpper(char ch) { return ch >= 'A' && ch <= 'Z'; }

// Visible ASCII: a request target with spaces, controls or bytes >= 0x80
// is not one a conforming client sends.
bool IsTargetChar(char ch) { return ch > 0x20 && ch < 0x7f; }

// Header lines are not interpreted, only checked: "name: value", with a
// token name and no control bytes but tab in the value.
bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

bool ValidHeaderLine(std::string_view line) {
  size_t colon = line.find(':');
  if (colon == 0 || colon == std::string_view::npos) return false;
  for (size_t i = 0; i < colon; ++i) {
    char ch = line[i];
    if (ch <= 0x20 || ch >= 0x7f) return false;
  }
  for (size_t i = colon + 1; i < line.size(); ++i) {
    unsigned char ch = static_cast<unsigned char>(line[i]);
    if ((ch < 0x20 && ch != '\t') || ch == 0x7f) return false;
  }
  return true;
}

// A header value without the blanks around it.
std::string_view TrimBlanks(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return v;
}

}  // namespace

HeadParse ParseRequestHead(std::string_view buf, size_t max_head_bytes, HttpRequestHead* head,
                           size_t* head_bytes) {
  std::string_view window = buf.substr(0, max_head_bytes);
  size_t end = window.find("\r\n\r\n");
  if (end == std::string_view::npos) {
    // A bare LF or a NUL is never part of a well-formed head: fail early
    // instead of waiting for the bound.
    for (size_t i = 0; i < window.size(); ++i) {
      if (window[i] == '\0') return HeadParse::kBad;
      if (window[i] == '\n' && (i == 0 || window[i - 1] != '\r')) return HeadParse::kBad;
    }
    return window.size() >= max_head_bytes ? HeadParse::kTooLarge : HeadParse::kIncomplete;
  }
  std::string_view text = window.substr(0, end + 2);  // every line ends with CRLF

  size_t eol = text.find("\r\n");
  std::string_view line = text.substr(0, eol);
  size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos || sp1 == 0 || sp1 > kMaxMethodBytes) return HeadParse::kBad;
  size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || sp2 == sp1 + 1) return HeadParse::kBad;
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  for (char ch : method) {
    if (!IsTokenUpper(ch)) return HeadParse::kBad;
  }
  if (target.size() > kMaxTargetBytes || target[0] != '/') return HeadParse::kBad;
  for (char ch : target) {
    if (!IsTargetChar(ch)) return HeadParse::kBad;
  }
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/") return HeadParse::kBad;
  if (version == "HTTP/1.1") {
    head->minor_version = 1;
  } else if (version == "HTTP/1.0") {
    head->minor_version = 0;
  } else {
    return HeadParse::kBadVersion;
  }

  size_t pos = eol + 2;
  head->authorization.clear();
  head->content_length = -1;
  while (pos < text.size()) {
    size_t next = text.find("\r\n", pos);
    std::string_view header = text.substr(pos, next - pos);
    // Obsolete line folding (a line starting with space) is refused, as
    // RFC 9112 allows, rather than unfolded.
    if (header.empty() || header[0] == ' ' || header[0] == '\t' || !ValidHeaderLine(header)) {
      return HeadParse::kBad;
    }
    size_t colon = header.find(':');
    if (EqualsIgnoreCase(header.substr(0, colon), "authorization")) {
      head->authorization.assign(TrimBlanks(header.substr(colon + 1)));
    } else if (EqualsIgnoreCase(header.substr(0, colon), "content-length")) {
      std::string_view value = TrimBlanks(header.substr(colon + 1));
      if (head->content_length >= 0 || value.empty() || value.size() > 12) return HeadParse::kBad;
      int64_t n = 0;
      for (char ch : value) {
        if (ch < '0' || ch > '9') return HeadParse::kBad;
        n = n * 10 + (ch - '0');
      }
      head->content_length = n;
    } else if (EqualsIgnoreCase(header.substr(0, colon), "transfer-encoding")) {
      return HeadParse::kBad;
    }
    pos = next + 2;
  }

  head->method.assign(method);
  head->path.assign(target.substr(0, target.find('?')));
  *head_bytes = end + 4;
  return HeadParse::kComplete;
}

}  // namespace kvpool::admin
