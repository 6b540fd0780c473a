// The log: the level filters, the sink gets each message whole and one call at a time (threads
// logging at once), a sink that throws or logs itself neither escapes nor deadlocks, and an empty
// sink restores stderr.
#define BOOST_TEST_MODULE log
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/log.hpp"

namespace {

using zmuon::log_level;

struct captured {
  std::vector<std::pair<log_level, std::string>> lines;
};

// Installs a sink that records every message; restores the default and info afterwards.
struct capture_fixture {
  captured got;
  capture_fixture() {
    zmuon::set_log_sink([this](log_level level, std::string_view msg) {
      got.lines.emplace_back(level, std::string(msg));
    });
  }
  ~capture_fixture() {
    zmuon::set_log_sink({});
    zmuon::set_log_level(log_level::info);
  }
};

}  // namespace

BOOST_FIXTURE_TEST_CASE(the_level_filters, capture_fixture) {
  zmuon::set_log_level(log_level::warn);
  BOOST_TEST((zmuon::current_log_level() == log_level::warn));
  ZMUON_LOG_ERROR("e");
  ZMUON_LOG_WARN("w");
  ZMUON_LOG_INFO("i");
  ZMUON_LOG_TRACE("t");
  BOOST_REQUIRE_EQUAL(got.lines.size(), 2u);
  BOOST_TEST((got.lines[0] == std::pair{log_level::error, std::string("e")}));
  BOOST_TEST((got.lines[1] == std::pair{log_level::warn, std::string("w")}));
  zmuon::set_log_level(log_level::trace);
  ZMUON_LOG_TRACE("t");
  BOOST_TEST(got.lines.size() == 3u);
}

BOOST_AUTO_TEST_CASE(a_message_below_the_level_is_not_built) {
  zmuon::set_log_level(log_level::error);
  int built = 0;
  auto text = [&] {
    ++built;
    return std::string("x");
  };
  ZMUON_LOG_DEBUG(text());
  BOOST_TEST(built == 0);
  zmuon::set_log_level(log_level::info);
}

BOOST_AUTO_TEST_CASE(levels_have_names) {
  for (auto level :
       {log_level::error, log_level::warn, log_level::info, log_level::debug, log_level::trace})
    BOOST_TEST((zmuon::parse_log_level(zmuon::to_string(level)) == level));
  BOOST_TEST((zmuon::parse_log_level("WARN") == log_level::warn));
  BOOST_TEST(!zmuon::parse_log_level("warning"));
  BOOST_TEST(!zmuon::parse_log_level(""));
}

BOOST_AUTO_TEST_CASE(the_sink_runs_one_call_at_a_time) {
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  int calls = 0;  // unsynchronized on purpose: the log's mutex guards it
  zmuon::set_log_sink([&](log_level, std::string_view msg) {
    if (inside.fetch_add(1) != 0)
      ++overlaps;
    ++calls;
    if (msg.size() != 4)
      ++overlaps;  // a message arrives whole
    std::this_thread::yield();
    inside.fetch_sub(1);
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < 500; ++i)
        ZMUON_LOG_WARN("abcd");
    });
  for (auto& t : threads)
    t.join();
  zmuon::set_log_sink({});
  BOOST_TEST(overlaps.load() == 0);
  BOOST_TEST(calls == 8 * 500);
}

BOOST_AUTO_TEST_CASE(a_sink_that_throws_or_logs_stays_inside) {
  int calls = 0;
  zmuon::set_log_sink([&](log_level, std::string_view) {
    ++calls;
    ZMUON_LOG_ERROR("logged by the sink: to stderr, not back into the sink");
    throw std::runtime_error("sink failure");
  });
  BOOST_CHECK_NO_THROW(ZMUON_LOG_ERROR("first"));
  BOOST_CHECK_NO_THROW(ZMUON_LOG_ERROR("second"));
  BOOST_TEST(calls == 2);  // the sink stays in place
  zmuon::set_log_sink({});
}
