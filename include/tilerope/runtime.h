#pragma once
/// \file runtime.h
/// Threads and SIMD target selection for the CPU kernels.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tilerope {

/// Threads used by the CPU kernels for problems large enough to share (small problems such
/// as single-token decode always run on the calling thread). The default is the
/// TILEROPE_NUM_THREADS environment variable if set, otherwise OpenMP's default.
/// n <= 0 throws tilerope::error.
void set_num_threads(int n);
int num_threads();

/// Software prefetch distance of the CPU kernels, in bytes: as a kernel reads each row of q
/// or k (or of the backward's inputs), it asks for the lines this far beyond it in the same
/// buffer (rows of a multiple of 256 bytes: 0 to 255 bytes further, from 128 bytes into a
/// 256-byte block of the address space). 0 turns it off. The default is the
/// TILEROPE_PREFETCH_BYTES environment variable if set, otherwise the distance of the CPU's
/// class (cpu_class(); the table and its measurements are in docs/performance.md). A value
/// outside [0, 2^20] throws tilerope::error. Results do not depend on it.
void set_prefetch_bytes(std::int64_t bytes);
std::int64_t prefetch_bytes();

/// The CPU's class as the prefetch table names it, with its cpuid family and model:
/// "AMD Zen 5 (family 26, model 2)", "Intel (family 6, model 143)", "other (...)".
std::string cpu_class();

/// SIMD targets compiled into this library, by tilerope's names ("scalar", "sse4", "avx2",
/// "avx512", ...), best last.
std::vector<std::string> compiled_cpu_targets();
/// Targets this CPU can run, among the compiled ones.
std::vector<std::string> supported_cpu_targets();
/// Forces the kernels onto one target: "scalar", "sse4", "avx2", "avx512" (or "best" to undo).
/// An unknown name, or one this CPU or build cannot run, throws tilerope::error. The
/// TILEROPE_CPU_TARGET environment variable does the same at the first kernel call.
void set_cpu_target(std::string_view name);
/// The target the kernels run on now.
std::string cpu_target();

/// "0.1.0".
std::string_view version();

}  // namespace tilerope
