// One version source: meson's project version (passed in as CO2_PROJECT_VERSION), co2.h's
// CO2_VERSION_* macros and co2_get_version() must all agree. Also: co2_status_string gives a
// distinct, non-empty text for every status and one generic text for unknown values, and
// co2_last_error_message is thread-local.
#include <co2/co2.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#ifndef CO2_PROJECT_VERSION
#error "CO2_PROJECT_VERSION must be defined by the build (meson.project_version())"
#endif

namespace {

const std::vector<co2_status_t> kAllStatuses = {
    CO2_OK,
    CO2_ERR_INVALID_ARGUMENT,
    CO2_ERR_INVALID_STATE,
    CO2_ERR_UNSUPPORTED,
    CO2_ERR_INVALID_CONFIG,
    CO2_ERR_UNKNOWN_ENUM,
    CO2_ERR_DUPLICATE_TENSOR,
    CO2_ERR_OUT_OF_MEMORY,
    CO2_ERR_NONFINITE,
    CO2_ERR_LAYOUT_MISMATCH,
    CO2_ERR_ANCHOR_MISMATCH,
    CO2_ERR_CHECKPOINT_CORRUPT,
    CO2_ERR_CHECKPOINT_MISMATCH,
    CO2_ERR_CALLBACK,
    CO2_ERR_TIMEOUT,
    CO2_ERR_PEER_LOST,
    CO2_ERR_PEER_TIMEOUT,
    CO2_ERR_COLLECTIVE_MISMATCH,
    CO2_ERR_ABORTED,
    CO2_ERR_TRANSPORT,
    CO2_ERR_RENDEZVOUS,
    CO2_ERR_INTERNAL,
};

TEST(Version, MacrosMatchMesonProjectVersion) {
  int major = -1, minor = -1, patch = -1;
  ASSERT_EQ(std::sscanf(CO2_PROJECT_VERSION, "%d.%d.%d", &major, &minor, &patch), 3)
      << "meson project version '" << CO2_PROJECT_VERSION << "' is not MAJOR.MINOR.PATCH";
  EXPECT_EQ(major, CO2_VERSION_MAJOR);
  EXPECT_EQ(minor, CO2_VERSION_MINOR);
  EXPECT_EQ(patch, CO2_VERSION_PATCH);
}

TEST(Version, GetVersionMatchesHeader) {
  int major = -1, minor = -1, patch = -1;
  ASSERT_EQ(co2_get_version(&major, &minor, &patch), CO2_OK);
  EXPECT_EQ(major, CO2_VERSION_MAJOR);
  EXPECT_EQ(minor, CO2_VERSION_MINOR);
  EXPECT_EQ(patch, CO2_VERSION_PATCH);
  const std::string joined =
      std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  EXPECT_EQ(joined, CO2_PROJECT_VERSION);
}

TEST(Version, GetVersionRejectsNullOutputs) {
  int a = 42, b = 43;
  EXPECT_EQ(co2_get_version(nullptr, &a, &b), CO2_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(co2_get_version(&a, nullptr, &b), CO2_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(co2_get_version(&a, &b, nullptr), CO2_ERR_INVALID_ARGUMENT);
  // Outputs are written only on success.
  EXPECT_EQ(a, 42);
  EXPECT_EQ(b, 43);
  EXPECT_STRNE(co2_last_error_message(), "");
}

TEST(StatusString, DistinctAndNonEmptyForEveryStatus) {
  std::set<std::string> seen;
  for (co2_status_t s : kAllStatuses) {
    const char* text = co2_status_string(s);
    ASSERT_NE(text, nullptr) << "status " << s;
    EXPECT_GT(std::string(text).size(), 3u) << "status " << s;
    EXPECT_TRUE(seen.insert(text).second) << "status " << s << " repeats text: " << text;
  }
  EXPECT_EQ(seen.size(), kAllStatuses.size());
}

TEST(StatusString, GenericTextForUnknownValues) {
  std::set<std::string> known;
  for (co2_status_t s : kAllStatuses) known.insert(co2_status_string(s));
  const co2_status_t unknown[] = {-1, 8, 19, 26, 39, 41, 99, 106, 150, 198, 200, 1000,
                                  INT32_MAX, INT32_MIN};
  const char* first = co2_status_string(unknown[0]);
  ASSERT_NE(first, nullptr);
  EXPECT_STRNE(first, "");
  EXPECT_EQ(known.count(first), 0u) << "unknown status reuses a known status's text: " << first;
  for (co2_status_t s : unknown) {
    const char* text = co2_status_string(s);
    ASSERT_NE(text, nullptr) << s;
    EXPECT_STREQ(text, first) << "unknown status " << s;
  }
}

TEST(StatusString, StaticStorage) {
  // The pointer stays valid and unchanged across calls (a static string, not a thread buffer).
  const char* a = co2_status_string(CO2_ERR_TIMEOUT);
  (void)co2_status_string(CO2_ERR_INTERNAL);
  const char* b = co2_status_string(CO2_ERR_TIMEOUT);
  EXPECT_EQ(a, b);
}

TEST(LastErrorMessage, EmptyOnAFreshThreadAndThreadLocal) {
  std::string fresh = "unset";
  std::string after_error;
  std::string other_thread = "unset";
  std::thread t([&] {
    const char* m = co2_last_error_message();
    fresh = m ? m : "(null)";
    int x = 0;
    (void)co2_get_version(nullptr, &x, &x);  // fails, sets this thread's message
    const char* e = co2_last_error_message();
    after_error = e ? e : "(null)";
    std::thread u([&] {
      const char* o = co2_last_error_message();
      other_thread = o ? o : "(null)";
    });
    u.join();
  });
  t.join();
  EXPECT_EQ(fresh, "");
  EXPECT_NE(after_error, "");
  EXPECT_NE(after_error, "(null)");
  EXPECT_EQ(other_thread, "") << "the message leaked to another thread";
}

}  // namespace
