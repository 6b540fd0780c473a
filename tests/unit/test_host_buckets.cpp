// engine::reduce's pool of host buffers for packed buckets (engine/host_buckets.hpp): a dropped
// buffer comes back for the same bucket, its old values zeroed only when asked; a bucket whose
// buffer is still in use gets a new one; one spare per bucket at most; buffers that outlive the
// pool are freed (the sanitizer runs of CI check that nothing leaks or is used after free).
#define BOOST_TEST_MODULE host_buckets
#include <boost/test/unit_test.hpp>

#include <algorithm>

#include "engine/host_buckets.hpp"

using namespace zmuon;

namespace {

bool all_zero(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; });
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_dropped_buffer_is_reused_for_its_bucket) {
  host_buckets pool(2);
  auto first = pool.take(0, 1000, false);
  BOOST_TEST(all_zero(*first));  // new: zero-filled
  const float* where = first->data();
  std::fill(first->begin(), first->end(), 3.0f);
  first.reset();
  BOOST_TEST(pool.spares() == 1u);
  auto again = pool.take(0, 1000, false);  // covered whole by the packing: not zeroed
  BOOST_TEST(again->data() == where);
  BOOST_TEST((*again)[999] == 3.0f);
  BOOST_TEST(pool.spares() == 0u);
  again.reset();
  auto zeroed = pool.take(0, 1000, true);  // the packing leaves gaps: zeroed
  BOOST_TEST(zeroed->data() == where);
  BOOST_TEST(all_zero(*zeroed));
  auto other = pool.take(1, 1000, false);  // another bucket never takes bucket 0's buffer
  BOOST_TEST(other->data() != where);
}

BOOST_AUTO_TEST_CASE(a_bucket_in_use_gets_a_new_buffer_and_one_spare_is_kept) {
  host_buckets pool(1);
  auto a = pool.take(0, 64, false);
  auto b = pool.take(0, 64, false);  // a is still in use (another micro-batch's)
  BOOST_TEST(a->data() != b->data());
  a.reset();
  b.reset();
  BOOST_TEST(pool.spares() == 1u);   // b was dropped while a's buffer was already kept
  auto c = pool.take(0, 32, false);  // another size: a new buffer
  BOOST_TEST(c->size() == 32u);
  BOOST_TEST(all_zero(*c));
}

BOOST_AUTO_TEST_CASE(a_buffer_that_outlives_its_pool_is_freed) {
  std::shared_ptr<std::vector<float>> kept;
  {
    host_buckets pool(1);
    kept = pool.take(0, 128, false);
  }
  (*kept)[0] = 1.0f;
  kept.reset();  // the pool is gone: freed, not returned
  BOOST_TEST(!kept);
}
