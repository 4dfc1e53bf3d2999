#include "common/status.h"

#include <gtest/gtest.h>

namespace kvpool {
namespace {

Result<int> Half(int v) {
  if (v % 2 != 0) return InvalidArgument("odd");
  return v / 2;
}

Status UseHalf(int v, int* out) {
  KVPOOL_ASSIGN_OR_RETURN(*out, Half(v));
  return Status::Ok();
}

TEST(StatusTest, OkIsCheapAndPrintsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, CarriesCodeAndMessage) {
  Status s = NotFound("key abc");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NotFound: key abc");
  Status copy = s;
  EXPECT_EQ(copy.ToString(), "NotFound: key abc");
}

TEST(StatusTest, ResultAndMacros) {
  int out = 0;
  EXPECT_TRUE(UseHalf(8, &out).ok());
  EXPECT_EQ(out, 4);
  Status s = UseHalf(3, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd");
}

TEST(StatusTest, CodesMatchTheCAbi) {
  // kvpool.h's values are part of the ABI; they must not drift.
  EXPECT_EQ(static_cast<int>(StatusCode::kNotFound), 1);
  EXPECT_EQ(static_cast<int>(StatusCode::kResourceExhausted), 5);
  EXPECT_EQ(static_cast<int>(StatusCode::kInternal), 11);
  EXPECT_EQ(static_cast<int>(StatusCode::kPermissionDenied), 12);
  EXPECT_EQ(kMaxStatusCode, 12);
  EXPECT_FALSE(IsErrorStatusCode(0));
  EXPECT_TRUE(IsErrorStatusCode(12));
  EXPECT_FALSE(IsErrorStatusCode(13));
  EXPECT_EQ(StatusCodeName(StatusCode::kDeadlineExceeded), "DeadlineExceeded");
}

}  // namespace
}  // namespace kvpool
