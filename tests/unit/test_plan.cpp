// The partition plan: shards, buckets, chunks and owners are pure functions of the table.
#define BOOST_TEST_MODULE plan
#include <boost/test/unit_test.hpp>

#include <cstdint>

#include <algorithm>
#include <numeric>

#include "plan/ownership.hpp"
#include "plan/plan.hpp"

using namespace zmuon;

namespace {

plan make(const std::vector<param_spec>& t, int world, int64_t bucket) {
  auto p = make_plan(t, world, bucket);
  BOOST_REQUIRE_MESSAGE(p, (p ? "" : p.err().to_string()));
  return *p;
}

}  // namespace

BOOST_AUTO_TEST_CASE(default_rule_reads_the_logical_shape) {
  auto pl = make({{"embed.weight", {100, 16}},
                  {"lm_head.weight", {100, 16}},
                  {"fc.weight", {16, 16}},
                  {"fc.bias", {16}},
                  {"conv.weight", {8, 3, 3, 3}},
                  {"forced", {16, 16}, param_group::adamw},
                  {"forced_muon", {4, 5}, param_group::muon}},
                 4, 1000);
  std::vector<bool> muon;
  for (auto& p : pl.params)
    muon.push_back(p.muon);
  BOOST_TEST(muon == (std::vector<bool>{false, false, true, false, true, false, true}));
  auto& conv = pl.params[pl.find("conv.weight")];
  BOOST_TEST(conv.rows == 8);
  BOOST_TEST(conv.cols == 27);  // [out, in*kh*kw]
}

BOOST_AUTO_TEST_CASE(shards_are_equal_padded_and_contiguous) {
  auto pl = make({{"a", {7, 3}}, {"b", {5}}, {"c", {4, 4}}}, 4, 1000);
  int64_t offset = 0;
  for (auto& p : pl.params) {
    BOOST_TEST(p.shard_len == (p.numel + 3) / 4);
    BOOST_TEST(p.shard_offset == offset);
    offset += p.shard_len;
    int64_t covered = 0;
    for (int q = 0; q < 4; ++q)
      covered += valid_len(p, q);
    BOOST_TEST(covered == p.numel);
  }
  BOOST_TEST(pl.shard_total == offset);
}

BOOST_AUTO_TEST_CASE(buckets_and_chunks_respect_the_size_and_never_drop_a_big_parameter) {
  auto pl = make({{"a", {10, 10}}, {"b", {10, 10}}, {"big", {40, 40}}, {"c", {10, 10}}}, 2, 250);
  BOOST_TEST(pl.buckets.size() == 3u);  // [a b] [big] [c]
  BOOST_TEST(pl.buckets[1].first_param == 2);
  BOOST_TEST(pl.buckets[1].end_param == 3);
  BOOST_TEST(pl.chunks.size() == 3u);
  for (auto& p : pl.params)
    BOOST_TEST(p.chunk >= 0);  // every Muon matrix is in some chunk, the 1600-element one too
  for (auto& c : pl.chunks)
    BOOST_TEST((c.full_elements <= 250 || c.params.size() == 1));
}

BOOST_AUTO_TEST_CASE(owners_balance_ns_cost_longest_first) {
  std::vector<param_spec> t{
      {"m1", {64, 64}}, {"m2", {32, 32}}, {"m3", {64, 64}}, {"m4", {16, 16}}, {"m5", {32, 32}}};
  auto pl = make(t, 2, 1 << 20);
  // LPT by hand: 64^3 -> r0, 64^3 -> r1, 32^3 -> r0, 32^3 -> r1, 16^3 -> r0.
  std::vector<int> owners;
  for (auto& p : pl.params)
    owners.push_back(p.owner);
  BOOST_TEST(owners == (std::vector<int>{0, 0, 1, 0, 1}));
  BOOST_TEST(pl.owner_cost[0] == 64.0 * 64 * 64 + 32.0 * 32 * 32 + 16.0 * 16 * 16);
  // Identical on every call (every rank computes it).
  auto again = make(t, 2, 1 << 20);
  for (size_t i = 0; i < pl.params.size(); ++i)
    BOOST_TEST(again.params[i].owner == pl.params[i].owner);
}

BOOST_AUTO_TEST_CASE(ownership_groups_same_shapes_for_batching) {
  auto pl = make(
      {{"q", {32, 16}, param_group::automatic, 4}, {"x", {8, 16}}, {"y", {16, 16}}, {"z", {8, 16}}},
      1, 1 << 20);
  auto own = make_ownership(pl, 0);
  BOOST_REQUIRE_EQUAL(own.size(), 1u);
  // q's head blocks are [8, 16], like x and z: one group of 4 + 1 + 1 blocks, then y.
  BOOST_REQUIRE_EQUAL(own[0].groups.size(), 2u);
  BOOST_TEST(own[0].groups[0].batch == 6);
  BOOST_TEST(own[0].groups[0].rows == 8);
  BOOST_TEST(own[0].groups[1].batch == 1);
  BOOST_TEST(own[0].full_size == 32 * 16 + 8 * 16 + 16 * 16 + 8 * 16);
}

BOOST_AUTO_TEST_CASE(bad_tables_are_named) {
  auto dup = make_plan({{"a", {2, 2}}, {"a", {3}}}, 2, 100);
  BOOST_REQUIRE(!dup);
  BOOST_TEST(dup.err().message().find("'a' is registered twice") != std::string::npos);
  auto zero = make_plan({{"z", {0, 4}}}, 2, 100);
  BOOST_REQUIRE(!zero);
  BOOST_TEST(zero.err().message().find("zero-size") != std::string::npos);
  auto heads = make_plan({{"h", {10, 4}, param_group::automatic, 3}}, 2, 100);
  BOOST_REQUIRE(!heads);
  BOOST_TEST(heads.err().message().find("heads=3 do not divide rows=10") != std::string::npos);
  auto world = make_plan({{"a", {2}}}, 0, 100);
  BOOST_REQUIRE(!world);
  // Dimensions whose product wraps around int64_t (2^32 x 2^32 is 0 there) or passes 2^40.
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{int64_t{1} << 32, int64_t{1} << 32},
        std::vector<int64_t>{INT64_MAX, 2}, std::vector<int64_t>{int64_t{1} << 20, 1 << 20, 2}}) {
    auto big = make_plan({{"big", shape}}, 2, 100);
    BOOST_REQUIRE(!big);
    BOOST_TEST((big.err().code() == errc::invalid_argument));
    BOOST_TEST(big.err().message().find("'big' has more than 2^40 elements") != std::string::npos,
               big.err().message());
  }
  BOOST_TEST(static_cast<bool>(make_plan({{"edge", {int64_t{1} << 20, 1 << 20}}}, 2, 100)));
}

BOOST_AUTO_TEST_CASE(expert_stacks_and_split_sizes_are_blocks_with_owners_of_their_own) {
  param_spec qkv{"qkv", {40, 8}};
  qkv.split_sizes = {16, 8, 16};
  qkv.split_heads = {4, 1, 0};
  param_spec conv{"conv", {6, 2, 3, 3}};  // 4-D: stays one [6, 18] matrix
  param_spec flat{"flat", {3, 4, 5}};
  flat.view = matrix_view::flatten;
  auto pl = make({{"experts", {4, 8, 16}}, qkv, conv, flat}, 4, 1 << 20);
  const auto& e = pl.params[0];
  BOOST_TEST(e.rows == 32);
  BOOST_TEST(e.cols == 16);
  BOOST_REQUIRE_EQUAL(e.blocks.size(), 4u);
  std::vector<int> owners;
  for (int b = 0; b < 4; ++b) {
    BOOST_TEST(e.blocks[b].row0 == 8 * b);
    BOOST_TEST(e.blocks[b].rows == 8);
    owners.push_back(e.blocks[b].owner);
  }
  std::sort(owners.begin(), owners.end());
  BOOST_TEST(owners == (std::vector<int>{0, 1, 2, 3}));  // the four experts on four ranks
  const auto& s = pl.params[1];
  BOOST_REQUIRE_EQUAL(s.blocks.size(), 3u);
  BOOST_TEST(s.blocks[1].row0 == 16);
  BOOST_TEST(s.blocks[0].heads == 4);
  BOOST_TEST(s.blocks[2].rows == 16);
  BOOST_TEST(s.heads == 4 + 1 + 1);  // NS matrices
  BOOST_TEST(pl.params[2].blocks.size() == 1u);
  BOOST_TEST(pl.params[2].cols == 18);
  BOOST_TEST(pl.params[3].blocks.size() == 1u);
  BOOST_TEST(pl.params[3].cols == 20);
  // Every element of every Muon parameter is in exactly one block; the owned blocks of all
  // ranks together cover every block once.
  int64_t owned = 0;
  for (int r = 0; r < 4; ++r)
    for (const auto& c : make_ownership(pl, r))
      owned += c.full_size;
  int64_t muon = 0;
  for (const auto& p : pl.params)
    muon += p.muon ? p.numel : 0;
  BOOST_TEST(owned == muon);
}

// Elements of parameter p's blocks that their owners lack before NS (what the gather moves).
int64_t gathered_elements(const param_layout& p) {
  int64_t n = 0;
  for (const auto& b : p.blocks) {
    auto [begin, end] = block_elements(p, b);
    auto [first, last] = shard_part(p, b.owner, begin, end);
    n += (end - begin) - (last - first);
  }
  return n;
}

// Expert parallelism with FSDP2 leaves each expert whole on one rank: its NS runs there. Dense
// matrices first in the table, which longest-processing-time first alone would place on the
// experts' ranks.
BOOST_AUTO_TEST_CASE(an_expert_whole_in_one_rank_shard_is_orthogonalized_there_with_no_gather) {
  const std::vector<param_spec> table{
      {"fc", {64, 32}}, {"out", {32, 64}}, {"up", {4, 64, 32}}, {"down", {4, 32, 64}}};
  for (auto layout : {shard_layout::rows, shard_layout::flat}) {
    auto pl = make_plan(table, 4, 1 << 20, true, layout);
    BOOST_REQUIRE(pl);
    for (int i : {2, 3}) {
      const auto& p = pl->params[i];
      for (int b = 0; b < 4; ++b)
        BOOST_TEST(p.blocks[b].owner == b);
      BOOST_TEST(gathered_elements(p) == 0);
    }
    // Ten blocks of equal cost on four ranks: at most three each.
    BOOST_TEST(*std::max_element(pl->owner_cost.begin(), pl->owner_cost.end())
               == 3 * ns_cost(64, 32));
  }
  // FSDP2's rows of four 2-expert stacks on 8 ranks: ranks 0 and 1 hold four experts each,
  // keep one each (their share), and the six others go to the six idle ranks.
  auto many =
      make_plan({{"a", {2, 16, 16}}, {"b", {2, 16, 16}}, {"c", {2, 16, 16}}, {"d", {2, 16, 16}}}, 8,
                1 << 20, true, shard_layout::rows);
  BOOST_REQUIRE(many);
  BOOST_TEST(many->params[0].blocks[0].owner == 0);
  BOOST_TEST(many->params[0].blocks[1].owner == 1);
  for (double c : many->owner_cost)
    BOOST_TEST(c == ns_cost(16, 16));
  // World 3, flat: experts 0 and 3 lie whole in shards 0 and 2; 1 and 2 straddle two shards.
  auto pl = make_plan(table, 3, 1 << 20, true, shard_layout::flat);
  BOOST_REQUIRE(pl);
  const auto& up = pl->params[2];
  BOOST_TEST(up.blocks[0].owner == 0);
  BOOST_TEST(up.blocks[3].owner == 2);
  BOOST_TEST(holder_of(2048, 4096, up.shard_len) == -1);
  BOOST_TEST(gathered_elements(up) > 0);
}

BOOST_AUTO_TEST_CASE(bad_blocks_and_qk_pairs_are_named) {
  auto error_of = [](const std::vector<param_spec>& t) {
    auto p = make_plan(t, 2, 1 << 20);
    BOOST_REQUIRE(!p);
    return p.err().message();
  };
  param_spec s{"qkv", {40, 8}};
  s.split_sizes = {16, 8, 8};
  BOOST_TEST(error_of({s}).find("split_sizes sum to 32, not the matrix's rows=40")
             != std::string::npos);
  s.split_sizes = {16, 8, 16};
  s.split_heads = {3, 1, 0};
  BOOST_TEST(error_of({s}).find("split_heads[0]=3 do not divide the block's rows=16")
             != std::string::npos);
  s.split_heads = {1, 1};
  BOOST_TEST(error_of({s}).find("split_heads has 2 entries for 3 split_sizes")
             != std::string::npos);
  param_spec e{"experts", {4, 6, 5}, param_group::automatic, 4};
  BOOST_TEST(error_of({e}).find("heads=4 do not divide an expert's rows=6") != std::string::npos);
  param_spec two{"m", {4, 6}};
  two.view = matrix_view::expert_stack;
  BOOST_TEST(error_of({two}).find("an expert stack needs ndim >= 3") != std::string::npos);
  param_spec q{"q", {8, 4}};
  q.qk_clip_key = "k";
  q.qk_clip_heads = 4;
  q.qk_clip_key_heads = 3;
  BOOST_TEST(error_of({q, {"k", {6, 4}}}).find("key heads 3") != std::string::npos);
  q.qk_clip_key_heads = 2;
  BOOST_TEST(error_of({q, {"k", {5, 4}}}).find("2 heads do not divide the key's rows")
             != std::string::npos);
  q.qk_clip_key = "nope";
  BOOST_TEST(error_of({q}).find("key 'nope' is not a registered parameter") != std::string::npos);
  // A good pair: the plan lists it with its values' offset.
  q.qk_clip_key = "k";
  auto pl = make({{"k", {4, 4}}, q}, 2, 1 << 20);
  BOOST_REQUIRE_EQUAL(pl.qk_pairs.size(), 1u);
  BOOST_TEST(pl.qk_pairs[0].query == 1);
  BOOST_TEST(pl.qk_pairs[0].key == 0);
  BOOST_TEST(pl.qk_values == 4);
}

BOOST_AUTO_TEST_CASE(row_moments_lie_per_block_with_its_owner_and_saving_owners_are_recomputed) {
  // An expert stack (4 blocks of 8 rows), a split matrix (blocks of 16, 8, 16 rows), a plain
  // matrix and a bias, at world 3.
  param_spec qkv{"qkv", {40, 24}};
  qkv.split_sizes = {16, 8, 16};
  auto pl = make({{"experts", {4, 8, 24}}, qkv, {"w", {24, 24}}, {"b", {24}}}, 3, 1 << 20);
  const auto offsets = row_moment_offsets(pl);
  BOOST_REQUIRE_EQUAL(offsets.size(), 4u);
  BOOST_TEST(offsets[3].empty());  // AdamW
  // Each rank's buffer: its blocks' rows back to back, in table and row order, nothing else.
  for (int r = 0; r < 3; ++r) {
    int64_t next = 0;
    for (size_t j = 0; j < 3; ++j) {
      const auto& p = pl.params[j];
      BOOST_REQUIRE_EQUAL(offsets[j].size(), p.blocks.size());
      for (size_t k = 0; k < p.blocks.size(); ++k)
        if (p.blocks[k].owner == r) {
          BOOST_TEST(offsets[j][k] == next);
          next += p.blocks[k].rows;
        }
    }
    BOOST_TEST(row_moment_total(pl, r) == next);
  }
  int64_t total = 0;
  for (int r = 0; r < 3; ++r)
    total += row_moment_total(pl, r);
  BOOST_TEST(total == 32 + 40 + 24);  // one per row of every Muon matrix view
  // owners_at_world at the plan's own world gives the plan's owners; at another world the
  // owners that plan would have.
  for (int world : {1, 2, 3, 5}) {
    auto other = make({{"experts", {4, 8, 24}}, qkv, {"w", {24, 24}}, {"b", {24}}}, world, 1 << 20);
    const auto owners = owners_at_world(pl, world, pl.layout);
    for (size_t j = 0; j < 3; ++j)
      for (size_t k = 0; k < pl.params[j].blocks.size(); ++k)
        BOOST_TEST(owners[j][k] == other.params[j].blocks[k].owner);
    BOOST_TEST(owners[3].empty());
  }
}
