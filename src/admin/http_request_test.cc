#include "admin/http_request.h"

#include <string>

#include "gtest/gtest.h"

namespace kvpool::admin {
namespace {

HeadParse Parse(const std::string& text, HttpRequestHead* head = nullptr, size_t* used = nullptr,
                size_t max = 8192) {
  HttpRequestHead h;
  size_t n = 0;
  HeadParse r = ParseRequestHead(text, max, head ? head : &h, used ? used : &n);
  return r;
}

TEST(HttpRequestTest, ParsesMethodPathAndVersion) {
  HttpRequestHead h;
  size_t used = 0;
  const std::string req = "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\nrest";
  ASSERT_EQ(Parse(req, &h, &used), HeadParse::kComplete);
  EXPECT_EQ(h.method, "GET");
  EXPECT_EQ(h.path, "/metrics");
  EXPECT_EQ(h.minor_version, 1);
  EXPECT_EQ(used, req.size() - 4);
  ASSERT_EQ(Parse("HEAD / HTTP/1.0\r\n\r\n", &h), HeadParse::kComplete);
  EXPECT_EQ(h.method, "HEAD");
  EXPECT_EQ(h.path, "/");
  EXPECT_EQ(h.minor_version, 0);
}

TEST(HttpRequestTest, KeepsTheAuthorizationHeaderWhateverItsCase) {
  HttpRequestHead h;
  ASSERT_EQ(Parse("GET / HTTP/1.1\r\nHost: a\r\naUtHoRiZaTiOn:  Bearer abc def \t\r\n\r\n", &h),
            HeadParse::kComplete);
  EXPECT_EQ(h.authorization, "Bearer abc def");
  ASSERT_EQ(Parse("GET / HTTP/1.1\r\nX-Authorization: Bearer no\r\n\r\n", &h),
            HeadParse::kComplete);
  EXPECT_EQ(h.authorization, "");
}

TEST(HttpRequestTest, IncompleteUntilBlankLine) {
  EXPECT_EQ(Parse(""), HeadParse::kIncomplete);
  EXPECT_EQ(Parse("G"), HeadParse::kIncomplete);
  EXPECT_EQ(Parse("GET /healthz HTTP/1.1\r\nHost: a\r\n"), HeadParse::kIncomplete);
  EXPECT_EQ(Parse("GET /healthz HTTP/1.1\r\nHost: a\r\n\r"), HeadParse::kIncomplete);
}

TEST(HttpRequestTest, BoundedByMaxHeadBytes) {
  std::string big = "GET / HTTP/1.1\r\nX: " + std::string(100, 'a');
  EXPECT_EQ(Parse(big, nullptr, nullptr, 64), HeadParse::kTooLarge);
  // The blank line beyond the bound does not count.
  EXPECT_EQ(Parse(big + "\r\n\r\n", nullptr, nullptr, 64), HeadParse::kTooLarge);
  EXPECT_EQ(Parse(big + "\r\n\r\n", nullptr, nullptr, 8192), HeadParse::kComplete);
}

TEST(HttpRequestTest, RejectsMalformedHeads) {
  for (const std::string& bad : {
           std::string("GET\r\n\r\n"),
           std::string("GET  / HTTP/1.1\r\n\r\n"),
           std::string("get / HTTP/1.1\r\n\r\n"),
           std::string("GET healthz HTTP/1.1\r\n\r\n"),
           std::string("GET /a b HTTP/1.1\r\n\r\n"),
           std::string("GET /\x01 HTTP/1.1\r\n\r\n"),
           std::string("GET / HTTP/1.1 \r\n\r\n"),
           std::string("GET / HTTQ/1.1\r\n\r\n"),
           std::string("GET / HTTP/1.1\r\nNoColon\r\n\r\n"),
           std::string("GET / HTTP/1.1\r\n: empty name\r\n\r\n"),
           std::string("GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n"),
           std::string("GET / HTTP/1.1\r\nA: b\x01\r\n\r\n"),
           std::string("GET / HTTP/1.1\nHost: a\n\n"),
           std::string("GET /\0 HTTP/1.1", 16),
           std::string("VERYLONGMETHODNAME / HTTP/1.1\r\n\r\n"),
           "GET /" + std::string(3000, 'a') + " HTTP/1.1\r\n\r\n",
       }) {
    EXPECT_EQ(Parse(bad), HeadParse::kBad) << bad;
  }
}

TEST(HttpRequestTest, OtherVersionsAreRefusedAsSuch) {
  EXPECT_EQ(Parse("GET / HTTP/2.0\r\n\r\n"), HeadParse::kBadVersion);
  EXPECT_EQ(Parse("GET / HTTP/0.9\r\n\r\n"), HeadParse::kBadVersion);
}

// Every prefix and every single-byte change of a valid head parses to some
// outcome without reading past the buffer (run under ASan in the sanitizer
// build).
TEST(HttpRequestTest, PrefixesAndMutationsNeverMisparse) {
  const std::string req = "GET /api/v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nA: b\r\n\r\n";
  for (size_t n = 0; n < req.size(); ++n) {
    EXPECT_NE(Parse(req.substr(0, n)), HeadParse::kComplete) << n;
  }
  for (size_t i = 0; i < req.size(); ++i) {
    for (int b = 0; b < 256; b += 7) {
      std::string m = req;
      m[i] = static_cast<char>(b);
      HttpRequestHead h;
      size_t used = 0;
      if (Parse(m, &h, &used) == HeadParse::kComplete) {
        EXPECT_LE(used, m.size());
        EXPECT_EQ(h.path[0], '/');
      }
    }
  }
}

}  // namespace
}  // namespace kvpool::admin
