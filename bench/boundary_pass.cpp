// Benchmark: the fused co2 boundary pass against memcpy of the same bytes, and the cost of a
// non-boundary co2_engine_step. Prints tables (docs/benchmarks.md records them).
//
//   build/bench/boundary_pass [--max-millions 64] [--repeats 5]
//
// The parameter dtype table runs the training thread's passes (fused, apply, eager) with fp32,
// bf16 and fp16 parameters over the fp32 outer state: the parameters are read widened and
// written rounded, 4 bytes less per element.
//
// The co2 pass (update + momentum + delta) reads p, a, m, c and writes a, m, c, p: 32 bytes per
// element. memcpy of 16 bytes per element (the same bytes the pass reads) also moves 32 bytes
// per element (16 read + 16 written). Both run on one thread, back to back, in the same process.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "co2/co2.h"
#include "runtime/outer/boundary_pass.hpp"
#include "runtime/base/buffer.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

template <typename F>
double best_of(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    f();
    best = std::min(best, seconds_since(start));
  }
  return best;
}

void fill(co2::FloatBuffer& b, float base) {
  for (size_t i = 0; i < b.size(); ++i) b.data()[i] = base + 1e-3f * float(i % 1000);
}

// p, a, m, c of n elements and the coefficients of a momentum update.
struct PassInputs {
  co2::FloatBuffer p, a, m, c;
  co2::OuterCoefficients k;
  explicit PassInputs(size_t n) : p(n), a(n), m(n), c(n) {
    fill(p, 1.0f);
    fill(a, 1.1f);
    fill(m, 0.01f);
    fill(c, 0.001f);
    k.alpha = 0.7f;
    k.beta = 0.9f;
    k.lambda = 0.5f;
  }
};

void pass_table(size_t max_millions, int repeats) {
  std::printf("\nFused boundary pass vs memcpy (1 thread; GB/s = bytes read + written per second)\n");
  std::printf("%10s %12s %12s %12s %12s %8s\n", "N", "pass ms", "pass GB/s", "memcpy ms", "memcpy GB/s",
              "ratio");
  for (size_t millions = 1; millions <= max_millions; millions *= 4) {
    const size_t n = millions << 20;
    PassInputs x(n);
    co2::FloatBuffer src(4 * n), dst(4 * n);
    fill(src, 2.0f);
    const co2::PassFlags flags{true, true, false, false, true};
    const double pass_s = best_of(repeats, [&] {
      co2::run_boundary_pass(flags, x.p.data(), x.a.data(), x.m.data(), x.c.data(), n, x.k);
    });
    const double copy_s = best_of(repeats, [&] {
      std::memcpy(dst.data(), src.data(), 4 * n * sizeof(float));
    });
    const double bytes = 32.0 * double(n);
    std::printf("%9zuM %12.2f %12.2f %12.2f %12.2f %8.2f\n", millions << 0, pass_s * 1e3, bytes / pass_s / 1e9,
                copy_s * 1e3, bytes / copy_s / 1e9, copy_s / pass_s);
    std::fflush(stdout);
  }
}

// co2 on the host splits the pass: prepare (m, next anchor) runs on the progress thread when
// the average arrives; only apply (a <- a - p, p <- next anchor; 20 bytes per element) is left
// at the boundary. Side by side with the fused pass it replaces there.
void split_table(size_t max_millions, int repeats) {
  std::printf("\nThe training thread's share at a co2 boundary: fused pass vs the split pass's apply half\n");
  std::printf("%10s %12s %12s %12s %12s %8s\n", "N", "fused ms", "prepare ms", "apply ms", "apply GB/s",
              "fused/apply");
  for (size_t millions = 1; millions <= max_millions; millions *= 4) {
    const size_t n = millions << 20;
    PassInputs x(n);
    const double fused_s = best_of(repeats, [&] {
      co2::run_boundary_pass({true, true, false, false, true}, x.p.data(), x.a.data(), x.m.data(), x.c.data(), n,
                             x.k);
    });
    co2::PassFlags prepare{true, true, false, false, false};
    prepare.prepare = true;
    const double prepare_s = best_of(repeats, [&] {
      co2::run_boundary_pass(prepare, nullptr, x.a.data(), x.m.data(), x.c.data(), n, x.k);
    });
    const double apply_s =
        best_of(repeats, [&] { co2::apply_prepared_segment(x.p.data(), x.a.data(), x.c.data(), n); });
    std::printf("%9zuM %12.2f %12.2f %12.2f %12.2f %8.2f\n", millions, fused_s * 1e3, prepare_s * 1e3,
                apply_s * 1e3, 20.0 * double(n) / apply_s / 1e9, fused_s / apply_s);
    std::fflush(stdout);
  }
}

// The parameters of `x` converted to P (bf16, fp16, or fp32 itself).
template <typename P>
std::vector<P> params_as(const PassInputs& x, size_t n) {
  std::vector<P> out(n);
  co2::narrow_into(x.p.data(), out.data(), n);
  return out;
}

// The training thread's passes with each parameter dtype, side by side: the fused pass, the split
// pass's apply half (co2, delayed) and the eager correction (co2's default on the host).
void dtype_table(size_t max_millions, int repeats) {
  std::printf("\nParameter dtypes (fp32 outer state): ms (GB/s) of the fused pass, the apply half, the eager "
              "boundary\n");
  std::printf("%10s %6s %16s %16s %16s\n", "N", "dtype", "fused", "apply", "eager");
  for (size_t millions = 1; millions <= max_millions; millions *= 4) {
    const size_t n = millions << 20;
    PassInputs x(n);
    co2::FloatBuffer e(n), q(n), delta(n);
    fill(e, 0.001f);
    fill(q, 0.002f);
    auto bf16 = params_as<co2::Bf16>(x, n);
    auto fp16 = params_as<co2::Fp16>(x, n);
    const co2::PassFlags flags{true, true, false, false, true};
    co2::EagerCoefficients eager;
    eager.beta = 0.5f;
    eager.scale = 0.35f;
    eager.momentum = true;
    // Each pass rewrites its outputs; the measurement is of memory traffic and arithmetic, so
    // drifting values do not matter (they stay finite over a few repeats).
    auto row = [&](const char* name, auto* p, int param_bytes) {
      const double fused = best_of(repeats, [&] {
        co2::run_boundary_pass(flags, p, x.a.data(), x.m.data(), x.c.data(), n, x.k);
      });
      const double apply = best_of(repeats, [&] { co2::apply_prepared_segment(p, x.a.data(), x.c.data(), n); });
      const double eager_s = best_of(repeats, [&] {
        co2::eager_boundary_segment(p, x.a.data(), x.c.data(), e.data(), q.data(), delta.data(), n, eager);
      });
      // Bytes per element: fused = p, a, m, c read and written; apply = p, a read and written,
      // c read; eager = p, a, next, e, q read, p, delta, e, q written.
      const double b = double(param_bytes);
      char cells[3][32];
      const double seconds[3] = {fused, apply, eager_s}, bytes[3] = {2 * b + 24, 2 * b + 12, 2 * b + 28};
      for (int i = 0; i < 3; ++i)
        std::snprintf(cells[i], sizeof cells[i], "%.2f (%.1f)", seconds[i] * 1e3, bytes[i] * double(n) / seconds[i] / 1e9);
      std::printf("%9zuM %6s %16s %16s %16s\n", millions, name, cells[0], cells[1], cells[2]);
      std::fflush(stdout);
    };
    row("fp32", x.p.data(), 4);
    row("bf16", bf16.data(), 2);
    row("fp16", fp16.data(), 2);
  }
}

int check(co2_status_t status, const char* what) {
  if (status != CO2_OK) {
    std::fprintf(stderr, "%s: %s (%s)\n", what, co2_status_string(status), co2_last_error_message());
    std::exit(1);
  }
  return 0;
}

// ns per non-boundary co2_engine_step with an average in flight (the rounds' first two steps
// are boundaries; the third round never ends), under `apply_step`.
double step_ns(int32_t apply_step) {
  co2_comm_config_t cc = CO2_COMM_CONFIG_INIT;
  cc.transport = CO2_TRANSPORT_LOCAL;
  cc.group_name = "bench-step";
  co2_comm_t comm;
  check(co2_comm_create(&cc, &comm), "co2_comm_create");
  co2_engine_config_t ec = CO2_ENGINE_CONFIG_INIT;
  ec.tau = 1;
  ec.apply_step = apply_step;
  co2_engine_t engine;
  check(co2_engine_create(comm, &ec, &engine), "co2_engine_create");
  std::vector<float> w(1 << 20, 1.0f);
  co2_tensor_t t = CO2_TENSOR_INIT;
  t.name = "w";
  t.data = w.data();
  t.count = w.size();
  check(co2_engine_register_tensor(engine, &t), "register");
  check(co2_engine_commit(engine), "commit");
  int boundary = 0;
  check(co2_engine_step(engine, nullptr, &boundary), "step");
  check(co2_engine_set_param(engine, CO2_PARAM_TAU, 1e9), "tau");  // from the round after the next
  check(co2_engine_step(engine, nullptr, &boundary), "step");  // submits the average in flight
  const int calls = 10000000;
  const auto start = Clock::now();
  for (int i = 0; i < calls; ++i) check(co2_engine_step(engine, nullptr, &boundary), "step");
  const double ns = seconds_since(start) * 1e9 / calls;
  co2_engine_destroy(engine);
  co2_comm_destroy(comm);
  return ns;
}

void step_table() {
  std::printf("\nNon-boundary co2_engine_step through the C ABI, an average in flight (10M calls each)\n");
  std::printf("%34s %10.1f ns/call   (target < 1000 ns)\n", "apply_step CO2_APPLY_AT_BOUNDARY", step_ns(0));
  std::printf("%34s %10.1f ns/call\n", "apply_step CO2_APPLY_ON_ARRIVAL", step_ns(-1));
}

}  // namespace

int main(int argc, char** argv) {
  size_t max_millions = 64;
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--max-millions") max_millions = std::strtoul(argv[i + 1], nullptr, 10);
    else if (flag == "--repeats") repeats = std::atoi(argv[i + 1]);
  }
  if (max_millions < 1 || repeats < 1) {
    std::fprintf(stderr, "usage: boundary_pass [--max-millions N>=1] [--repeats R>=1]\n");
    return 2;
  }
  pass_table(max_millions, repeats);
  split_table(max_millions, repeats);
  dtype_table(max_millions, repeats);
  step_table();
  return 0;
}
