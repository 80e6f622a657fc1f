// Many host threads calling the API at once: every call's outputs are bit-identical to the
// same call made alone, whatever the other threads run and with however many OpenMP threads
// each call asks for (rope_options::num_threads). Built also under ThreadSanitizer
// (scripts/sanitize.sh), where OpenMP's own synchronization is made visible through Archer.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "tilerope/error.h"
#include "tilerope/freqs.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"
#include "tilerope/runtime.h"

namespace {

using namespace tilerope;

// One call with its own inputs and outputs; run() writes only this job's outputs.
struct job {
  std::vector<unsigned char> q, k, q_out, k_out, weights, grads;
  std::vector<std::int64_t> positions;
  rope_table table;
  std::function<void(job&)> call;

  void run() { call(*this); }
  std::vector<unsigned char> result() const {
    std::vector<unsigned char> r = q_out;
    r.insert(r.end(), k_out.begin(), k_out.end());
    r.insert(r.end(), grads.begin(), grads.end());
    return r;
  }
};

std::vector<unsigned char> random_bytes_of(dtype t, std::int64_t n, std::mt19937_64& rng) {
  std::vector<unsigned char> b(static_cast<std::size_t>(n) * size_of(t));
  std::normal_distribution<double> normal(0.0, 1.0);
  for (std::int64_t i = 0; i < n; ++i)
    store_from_f64(b.data(), t, static_cast<std::size_t>(i), normal(rng));
  return b;
}

// Jobs of every family, big enough that a call with 2 or 3 threads splits its tokens.
std::vector<job> make_jobs() {
  std::vector<job> jobs;
  std::mt19937_64 rng(11);
  const std::int64_t Hq = 8, Hk = 2, D = 128;
  int n = 0;
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16}) {
    for (int variant = 0; variant < 4; ++variant, ++n) {
      const std::int64_t T = 160 + 16 * n;
      job j;
      j.q = random_bytes_of(t, T * Hq * D, rng);
      j.k = random_bytes_of(t, T * Hk * D, rng);
      j.q_out.assign(j.q.size(), 0);
      j.k_out.assign(j.k.size(), 0);
      for (std::int64_t i = 0; i < T; ++i) j.positions.push_back((i * 7919 + n) % 4096);
      j.table = make_rope_table(4096, static_cast<int>(D), 1e4);
      j.weights = random_bytes_of(t, 2 * D, rng);
      if (variant == 3) j.grads.assign(2 * D * sizeof(float), 0);
      const int threads = 1 + n % 3;  // 1, 2 or 3 OpenMP threads for this call
      j.call = [t, T, Hq, Hk, D, variant, threads](job& me) {
        rope_tensors x;
        x.q = tensor_view::contiguous(me.q.data(), t, {T, Hq, D});
        x.k = tensor_view::contiguous(me.k.data(), t, {T, Hk, D});
        x.q_out = tensor_view::contiguous(me.q_out.data(), t, {T, Hq, D});
        x.k_out = tensor_view::contiguous(me.k_out.data(), t, {T, Hk, D});
        const auto pos =
            rope_positions::from_ids(tensor_view::contiguous(me.positions.data(), dtype::i64, {T}));
        rope_options o;
        o.num_threads = threads;
        qk_norm norm;
        norm.q_weight = tensor_view::contiguous(me.weights.data(), t, {D});
        norm.k_weight = tensor_view::contiguous(me.weights.data() + D * size_of(t), t, {D});
        switch (variant) {
          case 0:  // neox from the table
            return rope_apply(rope_style::neox, x, pos,
                              rope_angles::from_table(me.table.cos, me.table.sin), o);
          case 1:  // gptj, computed angles
            return rope_apply(rope_style::gptj, x, pos, rope_angles::from_theta(5e5), o);
          case 2:  // QK RMSNorm + RoPE
            return qk_norm_rope_apply(rope_style::neox, x, pos, rope_angles::from_theta(1e6), norm,
                                      o);
          default: {  // its backward, with weight gradients
            qk_norm_rope_grad_tensors g;
            g.q = x.q, g.k = *x.k;  // the forward's inputs, and as dy below
            g.dq_out = x.q, g.dk_out = *x.k;
            g.dq = *x.q_out, g.dk = *x.k_out;
            g.dq_weight = tensor_view::contiguous(me.grads.data(), dtype::f32, {D});
            g.dk_weight =
                tensor_view::contiguous(me.grads.data() + D * sizeof(float), dtype::f32, {D});
            return qk_norm_rope_backward(rope_style::neox, g, pos, rope_angles::from_theta(1e6),
                                         norm, o);
          }
        }
      };
      jobs.push_back(std::move(j));
    }
  }
  return jobs;
}

TEST(Concurrency, ManyHostThreadsGiveTheBitsOfSerialCalls) {
  std::vector<job> jobs = make_jobs();
  std::vector<std::vector<unsigned char>> serial;
  for (auto& j : jobs) {
    j.run();
    serial.push_back(j.result());
  }
  for (int round = 0; round < 3; ++round) {
    for (auto& j : jobs) {
      std::fill(j.q_out.begin(), j.q_out.end(), 0xAB);
      std::fill(j.k_out.begin(), j.k_out.end(), 0xAB);
      std::fill(j.grads.begin(), j.grads.end(), 0xAB);
    }
    // every job on its own thread, each running its call 4 times, all at once
    std::vector<std::thread> threads;
    for (auto& j : jobs) {
      threads.emplace_back([&j] {
        for (int r = 0; r < 4; ++r) j.run();
      });
    }
    for (auto& t : threads) t.join();
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_TRUE(jobs[i].result() == serial[i]) << "job " << i << ", round " << round;
    }
  }
}

// Errors thrown on some threads while others compute: each thread sees its own outcome.
TEST(Concurrency, ErrorsOnSomeThreadsLeaveTheOthersAlone) {
  std::vector<job> jobs = make_jobs();
  std::vector<std::vector<unsigned char>> serial;
  for (auto& j : jobs) {
    j.run();
    serial.push_back(j.result());
    std::fill(j.q_out.begin(), j.q_out.end(), 0);
  }
  std::vector<int> errors(jobs.size(), 0);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int r = 0; r < 4; ++r) {
        if (i % 2) {
          try {  // positions past the table on odd jobs: rejected, nothing written
            rope_tensors x;
            x.q = tensor_view::contiguous(jobs[i].q.data(), dtype::f32, {2, 1, 64});
            x.q_out = tensor_view::contiguous(jobs[i].q_out.data(), dtype::f32, {2, 1, 64});
            const std::int64_t far[2] = {0, 1 << 20};
            rope_apply(rope_style::neox, x,
                       rope_positions::from_ids(tensor_view::contiguous(
                           const_cast<std::int64_t*>(far), dtype::i64, {2})),
                       rope_angles::from_table(jobs[i].table.cos, jobs[i].table.sin));
          } catch (const error&) {
            ++errors[i];
          }
        } else {
          jobs[i].run();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (i % 2) {
      EXPECT_EQ(errors[i], 4) << i;
      EXPECT_TRUE(std::all_of(jobs[i].q_out.begin(), jobs[i].q_out.end(),
                              [](unsigned char b) { return b == 0; }))
          << "job " << i << " wrote after an error";
    } else {
      EXPECT_TRUE(jobs[i].result() == serial[i]) << "job " << i;
    }
  }
}

TEST(Concurrency, PerCallThreadCountsAreValidated) {
  std::vector<job> jobs = make_jobs();
  rope_tensors x;
  x.q = tensor_view::contiguous(jobs[0].q.data(), dtype::f32, {4, 1, 64});
  rope_options o;
  o.num_threads = -1;
  const std::int64_t pos[4] = {0, 1, 2, 3};
  const auto p = rope_positions::from_ids(
      tensor_view::contiguous(const_cast<std::int64_t*>(pos), dtype::i64, {4}));
  try {
    rope_apply(rope_style::neox, x, p, rope_angles::from_theta(1e4), o);
    ADD_FAILURE() << "num_threads -1 accepted";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("num_threads (-1) must be in [0, 4096]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
