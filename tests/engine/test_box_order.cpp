// A Muon matrix the host holds in boxes (engine::set_box_order: tensor parallel's row-parallel
// weight under FSDP2), end to end through the engine (real actors, caf comm, host backend): the
// engine given the boxes back to back must step exactly as an engine given the natural matrix,
// with a natural matrix of the same shape and an AdamW parameter beside it in the same chunk.
#define BOOST_TEST_MODULE box_order
#include "support/engine_fixture.hpp"

#include <filesystem>

using namespace zmuon;
using namespace zmuon::test;

namespace {

constexpr int64_t kRows = 24, kCols = 40;

// The 2 x 2 grid of [12, 20] boxes, held out of order; world 4 cuts one box a rank.
const std::vector<matrix_box> kGrid{
    {12, 12, 20, 20}, {0, 12, 0, 20}, {12, 12, 0, 20}, {0, 12, 20, 20}};
// Three column stripes of unequal width: world 3's even cut of 320 elements crosses them.
const std::vector<matrix_box> kStripes{{0, 24, 26, 14}, {0, 24, 0, 13}, {0, 24, 13, 13}};

const std::vector<param_spec> kTable{{"w", {kRows, kCols}}, {"v", {kRows, kCols}}, {"b", {kCols}}};

engine_options exact_options(int world) {
  auto o = options(world);
  o.muon.ns = ns_options{};  // standard NS5
  o.muon.transport = muon_transport::fp32;
  o.muon.weight_decay = 0.05f;
  o.reduce_bucket_size = 1 << 20;  // one chunk: "w" and "v" batch in one NS call
  return o;
}

std::string code_of(const error& err) {
  return to_string(err.code());
}

struct run_result {
  tensor_map params;  // "w" in its natural order
  std::vector<float> moments;
};

// `steps` steps of kTable at options `o`; with `boxes`, "w" is handed to the engine in their
// order (its initial values, its gradients) and set_box_order tells it unless `untold`.
run_result run(const engine_options& o, const std::vector<matrix_box>& boxes, int steps,
               bool untold = false) {
  auto eng = make_engine(o);
  for (size_t i = 0; i < kTable.size(); ++i) {
    auto init = random_values(numel(kTable[i]), 77 + i, 0.1f);
    if (kTable[i].name == "w" && !boxes.empty())
      init = to_boxes(init, kCols, boxes);
    auto err = eng->add_parameter(kTable[i], init);
    BOOST_REQUIRE_MESSAGE(!err, err.to_string());
  }
  if (!boxes.empty() && !untold) {
    auto err = eng->set_box_order("w", boxes);
    BOOST_REQUIRE_MESSAGE(!err, err.to_string());
  }
  for (int s = 1; s <= steps; ++s) {
    for (int r = 0; r < o.world; ++r) {
      auto g = random_grads(kTable, 5, s, r, 0);
      if (!boxes.empty())
        g["w"] = to_boxes(g["w"], kCols, boxes);
      reduce_ok(*eng, r, g);
    }
    step_ok(*eng);
  }
  run_result out{params_of(*eng), {}};
  if (!boxes.empty())
    out.params["w"] = from_boxes(out.params["w"], kCols, boxes);
  if (o.muon.variant == muon_variant::normuon)
    for (int r = 0; r < o.world; ++r) {
      auto rows = snapshot_of(*eng, r).row_moments;
      out.moments.insert(out.moments.end(), rows.begin(), rows.end());
    }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_matrix_in_boxes_steps_as_its_natural_matrix) {
  for (const auto* boxes : {&kGrid, &kStripes}) {
    const int world = boxes == &kGrid ? 4 : 3;
    auto o = exact_options(world);
    const auto want = run(o, {}, 3);
    const auto got = run(o, *boxes, 3);
    const double diff = rel_diff(got.params, want.params);
    BOOST_TEST_MESSAGE((boxes == &kGrid ? "2 x 2 grid, world 4" : "3 stripes, world 3")
                       << ": weights after 3 steps against the natural order " << diff);
    BOOST_TEST(diff <= 1e-6);
    // Without set_box_order the engine orthogonalizes the boxes as if they were rows.
    const auto untold = run(o, *boxes, 3, true);
    const double wrong = rel_diff(untold.params, want.params);
    BOOST_TEST_MESSAGE("  the same values untold: " << wrong);
    BOOST_TEST(wrong >= 1e-3);
  }
}

BOOST_AUTO_TEST_CASE(normuon_and_bf16_transport_see_the_natural_rows) {
  auto o = exact_options(4);
  o.muon.variant = muon_variant::normuon;
  o.muon.normuon_beta2 = 0.9f;
  for (auto transport : {muon_transport::fp32, muon_transport::bf16}) {
    o.muon.transport = transport;
    const auto want = run(o, {}, 3);
    const auto got = run(o, kGrid, 3);
    const double diff = rel_diff(got.params, want.params);
    const double moments = rel_diff(got.moments, want.moments);
    BOOST_TEST_MESSAGE("NorMuon, " << (transport == muon_transport::bf16 ? "bf16" : "fp32")
                                   << " transport, 2 x 2 grid at world 4: weights " << diff
                                   << ", row moments " << moments);
    BOOST_TEST(diff <= 1e-6);
    BOOST_TEST(moments <= 1e-6);
  }
}

BOOST_AUTO_TEST_CASE(a_bad_box_order_is_refused_by_name_and_changes_nothing) {
  auto eng = make_engine(exact_options(2));
  register_table(*eng, kTable, 3);
  BOOST_REQUIRE(!eng->add_parameter({"experts", {2, 8, 8}}, {}));
  BOOST_REQUIRE(!eng->add_parameter({"heads", {8, 8}, param_group::automatic, 2}, {}));
  auto refused = [&](const std::string& name, const std::vector<matrix_box>& boxes,
                     const std::string& words) {
    auto err = eng->set_box_order(name, boxes);
    BOOST_TEST_MESSAGE(err.to_string());
    BOOST_TEST(code_of(err) == to_string(errc::invalid_argument));
    BOOST_TEST(err.message().find(words) != std::string::npos, err.message());
  };
  refused("w", {{0, 24, 0, 20}, {0, 24, 20, 21}}, "outside the [24, 40] matrix");
  refused("w", {{0, 24, 0, 20}}, "cover 480 elements");
  refused("w", {{0, 24, 0, 20}, {0, 12, 10, 20}, {12, 12, 20, 20}}, "overlap");
  refused("experts", {{0, 16, 0, 8}}, "expert stack");
  refused("heads", {{0, 8, 0, 8}}, "heads or split blocks");
  refused("b", {{0, 40, 0, 1}}, "need a matrix");
  BOOST_TEST(code_of(eng->set_box_order("nothing", kGrid)) == to_string(errc::unknown_parameter));
  // MuonClip's query and key keep their rows in order, whichever call comes first.
  BOOST_REQUIRE(!eng->add_parameter({"q", {8, 8}}, {}));
  BOOST_REQUIRE(!eng->add_parameter({"k", {8, 8}}, {}));
  const std::vector<matrix_box> halves{{0, 8, 4, 4}, {0, 8, 0, 4}};
  BOOST_REQUIRE(!eng->set_box_order("k", halves));
  auto err = eng->add_qk_clip("q", "k", 2, 2);
  BOOST_TEST_MESSAGE(err.to_string());
  BOOST_TEST(err.message().find("'k' is held in boxes") != std::string::npos);
  BOOST_REQUIRE(!eng->set_box_order("k", {}));
  BOOST_REQUIRE(!eng->add_qk_clip("q", "k", 2, 2));
  refused("q", halves, "MuonClip query or key");
  refused("k", halves, "MuonClip query or key");
  // Nothing changed: the table steps in its natural order.
  BOOST_REQUIRE(!eng->set_box_order("w", kGrid));
  BOOST_REQUIRE(!eng->set_box_order("w", {}));  // back to row-major
  for (int r = 0; r < 2; ++r)
    reduce_ok(*eng, r, random_grads(kTable, 5, 1, r, 0));
  step_ok(*eng);
  BOOST_TEST(code_of(eng->set_box_order("w", kGrid)) == to_string(errc::bad_state));
}

BOOST_AUTO_TEST_CASE(the_engines_checkpoint_refuses_a_matrix_in_boxes) {
  auto eng = make_engine(exact_options(2));
  register_table(*eng, kTable, 3);
  BOOST_REQUIRE(!eng->set_box_order("w", kGrid));
  const auto dir = std::filesystem::temp_directory_path() / "zmuon-box-order-ckpt";
  std::filesystem::remove_all(dir);
  auto err = eng->save_checkpoint(dir.string(), "{}");
  BOOST_TEST_MESSAGE(err.to_string());
  BOOST_TEST(code_of(err) == to_string(errc::unsupported));
  BOOST_TEST(err.message().find("'w' is held in boxes") != std::string::npos);
  BOOST_TEST(!std::filesystem::exists(dir));
  BOOST_TEST(code_of(eng->load_checkpoint(dir.string()).err()) == to_string(errc::unsupported));
}
