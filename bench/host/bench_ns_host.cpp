// zmuon-bench-ns-host: the host backend's (fp32, OpenBLAS) Newton-Schulz variants per shape:
// standard and Gram (restart 3), NS5 and Polar Express; median wall time of --reps calls (input
// restored before each, untimed) and the orthogonality error ||O O^T - I||_F / sqrt(m).
//
//   zmuon-bench-ns-host [--reps N] [--shapes RxC,RxC,...]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/compute.hpp"
#include "kernels/ns_variants.hpp"
#include "support/ns_accuracy.hpp"

namespace {

struct shape {
  int64_t rows, cols;
};

std::vector<shape> parse_shapes(const std::string& text) {
  std::vector<shape> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const size_t x = item.find('x');
    if (x == std::string::npos)
      return {};
    const long long r = std::atoll(item.substr(0, x).c_str());
    const long long c = std::atoll(item.substr(x + 1).c_str());
    if (r <= 0 || c <= 0)
      return {};
    out.push_back({r, c});
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char* argv[]) {
  int reps = 3;
  std::vector<shape> shapes = {{256, 256}, {256, 1024}, {768, 768}, {768, 3072}, {3072, 768}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--shapes" && i + 1 < argc) {
      shapes = parse_shapes(argv[++i]);
      if (shapes.empty()) {
        std::fprintf(stderr, "zmuon-bench-ns-host: --shapes: expected RxC[,RxC...]\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: zmuon-bench-ns-host [--reps N] [--shapes RxC,RxC,...]\n");
      return 2;
    }
  }
  auto made = zmuon::make_compute_backend("host");
  if (!made) {
    std::fprintf(stderr, "zmuon-bench-ns-host: %s\n", made.err().to_string().c_str());
    return 1;
  }
  auto& be = **made;
  zmuon::ns_options ns5;
  zmuon::ns_options pe;
  pe.schedule = zmuon::polar_express_schedule(pe.steps);
  struct method {
    const char* name;
    zmuon::ns_options ns;
  };
  std::vector<method> methods = {{"NS5", ns5}, {"PE", pe}};
  for (auto base : {ns5, pe}) {
    base.variant = zmuon::ns_variant::gram;
    methods.push_back({base.schedule.empty() ? "Gram(NS5)" : "Gram(PE)", base});
  }
  std::printf("host newton_schulz (fp32, OpenBLAS), median of %d; gram restart 3\n", reps);
  std::printf("%-11s %-10s %10s %14s\n", "shape", "method", "ms", "orthogonality");
  for (const shape& s : shapes) {
    const int64_t n = s.rows * s.cols;
    std::mt19937 gen(7);
    std::normal_distribution<float> normal;
    std::vector<float> input(static_cast<size_t>(n));
    for (float& v : input)
      v = normal(gen);
    zmuon::device_buffer x = be.allocate(n);
    for (const method& m : methods) {
      std::vector<double> times;
      for (int r = 0; r < reps; ++r) {
        be.copy_from_host(x.data(), input.data(), n);
        const auto start = std::chrono::steady_clock::now();
        be.newton_schulz(x.data(), 1, s.rows, s.cols, m.ns);
        times.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
      }
      std::sort(times.begin(), times.end());
      std::vector<float> out(static_cast<size_t>(n));
      be.copy_to_host(out.data(), x.data(), n);
      const bool gram = zmuon::ns_uses_gram(m.ns, s.rows, s.cols, zmuon::kHostAutomaticVariant);
      const std::string label =
          std::string(m.name) + (m.ns.variant == zmuon::ns_variant::gram && !gram ? "*" : "");
      std::printf("%5lldx%-5lld %-10s %10.1f %14.4g\n", static_cast<long long>(s.rows),
                  static_cast<long long>(s.cols), label.c_str(), times[times.size() / 2],
                  zmuon::ns_accuracy::orthogonality_error(out, s.rows, s.cols));
    }
  }
  std::printf("(* near-square: the Gram variant runs the standard iteration)\n");
  return 0;
}
