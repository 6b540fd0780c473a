// Newton-Schulz variants shared by both backends, the config and the tests (header-only, so that
// zmuon_cuda and zmuon_config use it without linking zmuon_kernels): the Polar Express coefficient
// schedule, the per-step coefficient lookup and the Gram variant's dispatch rule.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "zmuon/options.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

/// Polar Express (Amsel, Persson, Musco, Gower 2025, "The Polar Express: Optimal Matrix Sign
/// Methods and Their Application to the Muon Algorithm", arXiv:2505.16932), Appendix A,
/// Implementation 1: the degree-5 polynomials p_t(x) = a x + b x^3 + c x^5 of its greedy minimax
/// construction (Implementation 2, l = 1e-3, u = 1, cushion 0.02407327424182761), as published.
/// The eighth and every later one equal (15/8, -10/8, 3/8) numerically.
inline constexpr std::array<std::array<double, 3>, 8> kPolarExpressPublished = {{
    {8.28721201814563, -23.595886519098837, 17.300387312530933},
    {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
    {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
    {3.3184196573706015, -2.488488024314874, 0.51004894012372},
    {2.300652019954817, -1.6689039845747493, 0.4188073119525673},
    {1.891301407787398, -1.2679958271945868, 0.37680408948524835},
    {1.8750014808534479, -1.2500016453999487, 0.3750001645474248},
    {1.875, -1.25, 0.375},
}};

/// The paper's finite-precision safety factor (its Section 3.4): every published polynomial but
/// the last becomes p(x / 1.01), i.e. (a/1.01, b/1.01^3, c/1.01^5), and the input is normalized
/// by 1.01 ||X||_F instead of ||X||_F.
inline constexpr double kPolarExpressSafety = 1.01;

/// The Polar Express schedule for `steps` iterations, for ns_options::schedule: the published
/// polynomials with the safety factor applied as in the paper's Implementation 1, the last one
/// repeated past the eighth step. zmuon normalizes by ||X||_F + eps (docs/DESIGN.md §2), so the
/// paper's extra 1/1.01 on the input is folded into step 0: p_0(x / 1.01) has the coefficients
/// (a/1.01, b/1.01^3, c/1.01^5) — the same polynomial of X, exact up to the eps term.
inline std::vector<std::array<float, 3>> polar_express_schedule(int steps) {
  std::vector<std::array<float, 3>> schedule;
  const auto last = kPolarExpressPublished.size() - 1;
  for (int t = 0; t < steps; ++t) {
    const auto i = std::min(static_cast<size_t>(t), last);
    auto [a, b, c] = kPolarExpressPublished[i];
    // Safety on all but the last published polynomial; the input's 1.01 on step 0.
    const double s = (i < last ? kPolarExpressSafety : 1.0) * (t == 0 ? kPolarExpressSafety : 1.0);
    a /= s;
    b /= s * s * s;
    c /= s * s * s * s * s;
    schedule.push_back({static_cast<float>(a), static_cast<float>(b), static_cast<float>(c)});
  }
  return schedule;
}

/// The (a, b, c) of iteration `step`: the schedule's entry when there is one, else coefficients.
inline const std::array<float, 3>& ns_coefficients_at(const ns_options& ns, int step) {
  return ns.schedule.empty() ? ns.coefficients
                             : ns.schedule[static_cast<size_t>(step) % ns.schedule.size()];
}

/// The Gram variant pays off once the long side exceeds this multiple of the short one. Per
/// block of L steps on a wide [m, n] X (n = alpha*m), counting m^3 multiply-adds: the standard
/// iteration costs L(2 alpha + 1); the Gram one 2 alpha (X X^T, Q X) + L (Z = bR + cR^2) +
/// (L - 1) (Q = (aI + Z) Q) + 2(L - 1) (R = P R P), i.e. 2 alpha + 4L - 3: less iff alpha > 1.5,
/// whatever L (the bound of the paper's Appendix J, 1.5 T/(T-1), is for its costlier R update).
inline constexpr double kGramMinAspect = 1.5;

/// ns_variant::automatic runs Gram on the GPU only for batches with enough work that its extra
/// launches (the Gram path is not graph-captured) do not dominate: batch·m²·n at least this
/// (m <= n the sides). Below it standard wins or the two are even; docs/DECISIONS.md has the
/// figures.
inline constexpr double kGramAutoMinWork = 1e10;

/// What ns_variant::automatic means on the GPU for `batch` [rows, cols] matrices.
inline ns_variant gpu_automatic_variant(int64_t batch, int64_t rows, int64_t cols) {
  const auto m = static_cast<double>(std::min(rows, cols));
  const auto n = static_cast<double>(std::max(rows, cols));
  return static_cast<double>(batch) * m * m * n >= kGramAutoMinWork ? ns_variant::gram
                                                                    : ns_variant::standard;
}

/// What ns_variant::automatic means on the host: Gram wherever its aspect pays (ns_uses_gram),
/// since the host has no launches to amortize (GPT-2's step: docs/PERFORMANCE.md).
inline constexpr ns_variant kHostAutomaticVariant = ns_variant::gram;

/// Whether a [rows, cols] matrix runs the Gram variant under `ns` on a backend whose
/// ns_variant::automatic means `automatic_is` (on cuda gpu_automatic_variant, on the host
/// kHostAutomaticVariant).
inline bool ns_uses_gram(const ns_options& ns, int64_t rows, int64_t cols,
                         ns_variant automatic_is) {
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  const ns_variant v = ns.variant == ns_variant::automatic ? automatic_is : ns.variant;
  return v == ns_variant::gram && ns.steps > 0
         && static_cast<double>(n) > kGramMinAspect * static_cast<double>(m);
}

/// The longest Gram block (restart interval) that bf16 arithmetic survives. Measured with
/// bench/dev/ns_variants_bf16.py (256x1024, singular values over [1e-3, 1] and [1e-6, 1]): blocks
/// of up to 3 steps match the standard bf16 iteration's accuracy; 4 steps of Polar Express reach an
/// orthogonality error of 7-19 and 5 steps diverge for NS5 too. The engine refuses longer blocks
/// (and 0, one block of all steps) on the cuda backend.
inline constexpr int kGramMaxBlockBf16 = 3;

/// The most Newton-Schulz steps a call may run (ns_steps, and the Gram restart interval): 5 to 10
/// are used; a billion would make one optimizer step run for ever.
inline constexpr int kMaxNsSteps = 100;

/// Why `ns` cannot run on compute backend `backend` ("host" or "cuda"), or no error: what the
/// engine's options check and the standalone orthogonalizer (zmuon/orthogonalize.hpp) both refuse.
inline error check_ns_options(const ns_options& ns, const std::string& backend) {
  auto bad = [](const std::string& what) { return error{errc::invalid_argument, what}; };
  if (ns.steps < 1 || ns.steps > kMaxNsSteps)
    return bad("ns_steps must be in [1, " + std::to_string(kMaxNsSteps) + "], got "
               + std::to_string(ns.steps));
  if (!ns.schedule.empty() && static_cast<int>(ns.schedule.size()) != ns.steps)
    return bad("ns coefficient schedule has " + std::to_string(ns.schedule.size())
               + " entries but ns_steps is " + std::to_string(ns.steps));
  if (ns.gram_restart < 0 || ns.gram_restart > kMaxNsSteps)
    return bad("ns_gram_restart must be in [0, " + std::to_string(kMaxNsSteps)
               + "] (0 = never restart), got " + std::to_string(ns.gram_restart));
  if (ns.variant != ns_variant::standard && backend == "cuda"
      && (ns.gram_restart == 0 || ns.gram_restart > kGramMaxBlockBf16))
    return bad("ns_gram_restart " + std::to_string(ns.gram_restart) + " with ns_variant "
               + (ns.variant == ns_variant::gram ? "gram" : "auto (gram)")
               + " on the cuda backend: bf16 Gram blocks of more than "
               + std::to_string(kGramMaxBlockBf16)
               + " steps lose orthogonality on ill-conditioned gradients; use 1.."
               + std::to_string(kGramMaxBlockBf16));
  return {};
}

/// Steps of one Gram block: the restart interval, or all of the remaining steps when 0.
inline int gram_block_steps(const ns_options& ns, int remaining) {
  return ns.gram_restart > 0 ? std::min(ns.gram_restart, remaining) : remaining;
}

}  // namespace zmuon
