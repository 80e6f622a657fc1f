#pragma once
// Memory for large outputs, kept for reuse once their tensors are freed.
//
// A fresh output from the system costs a page fault and a page of zeroes for every page on its
// first write; for a prefill's q and k that is several times the rotation itself. Buffers of
// the same rounded size are handed out again instead, as a GPU caching allocator does, up to a
// limit of cached bytes. The tensors are ordinary torch tensors built by DLPack; their deleter
// gives the buffer back.

#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tilerope/dtype.h"

namespace tilerope::python {

/// A DLPack capsule ("dltensor") of an uninitialised CPU tensor of `shape` and `strides`
/// (elements), whose memory comes from the cache. The strides must describe a dense tensor.
PyObject* cached_empty(const std::vector<std::int64_t>& shape,
                       const std::vector<std::int64_t>& strides, dtype type);

/// Bytes of freed buffers the cache holds, and the most it keeps (more is given back).
std::size_t output_cache_bytes();
std::size_t output_cache_limit();
void set_output_cache_limit(std::size_t bytes);
/// Gives every cached buffer back to the system.
void empty_output_cache();

}  // namespace tilerope::python
