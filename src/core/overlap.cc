#include "core/overlap.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

namespace tilerope::detail {

namespace {

// A view as a set of bytes: rows of `row` contiguous bytes at base + sum(i_k * stride_k),
// outer dims sorted by |stride| descending, size-1 dims dropped.
struct byte_layout {
  int rank = 0;
  std::int64_t n[max_rank] = {};
  std::int64_t stride[max_rank] = {};
  std::int64_t base = 0;  // byte address of the lowest row start
  std::int64_t row = 0;   // bytes per row (last dim)
};

byte_layout layout_of(const tensor_view& v) {
  const auto es = static_cast<std::int64_t>(size_of(v.type));
  byte_layout l;
  l.base = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(v.data));
  if (v.rank == 0) {
    l.row = es;
    return l;
  }
  l.row = v.shape[v.rank - 1] * es;
  for (int i = 0; i + 1 < v.rank; ++i) {
    if (v.shape[i] == 1) continue;
    std::int64_t s = v.strides[i] * es;
    if (s < 0) {  // mirror a negative stride: same set of rows
      l.base += s * (v.shape[i] - 1);
      s = -s;
    }
    // insertion by stride, descending (at most four outer dims)
    int at = l.rank++;
    for (; at > 0 && l.stride[at - 1] < s; --at) {
      l.stride[at] = l.stride[at - 1];
      l.n[at] = l.n[at - 1];
    }
    l.stride[at] = s;
    l.n[at] = v.shape[i];
  }
  return l;
}

// Bytes from the first row start to the end of the last row, over dims [from, rank).
std::int64_t span(const byte_layout& l, int from) {
  std::int64_t s = l.row;
  for (int i = from; i < l.rank && i < max_rank; ++i) s += (l.n[i] - 1) * l.stride[i];
  return s;
}

void collect_rows(const byte_layout& l, int dim, std::int64_t start,
                  std::vector<std::int64_t>& rows) {
  if (dim == l.rank || dim >= max_rank) {
    rows.push_back(start);
    return;
  }
  for (std::int64_t i = 0; i < l.n[dim]; ++i)
    collect_rows(l, dim + 1, start + i * l.stride[dim], rows);
}

// Row by row: sort both sets of row starts and sweep.
bool rows_overlap(const byte_layout& a, int da, std::int64_t a0, const byte_layout& b, int db,
                  std::int64_t b0) {
  std::vector<std::int64_t> ra, rb;
  collect_rows(a, da, a0, ra);
  collect_rows(b, db, b0, rb);
  std::sort(ra.begin(), ra.end());
  std::sort(rb.begin(), rb.end());
  std::size_t i = 0, j = 0;
  while (i < ra.size() && j < rb.size()) {
    const std::int64_t a_end = ra[i] + a.row, b_end = rb[j] + b.row;
    if (ra[i] < b_end && rb[j] < a_end) return true;
    if (a_end <= b_end)
      ++i;
    else
      ++j;
  }
  return false;
}

// Do the sub-views a[da:] at a0 and b[db:] at b0 share a byte? When both outer dims step by
// the same stride and each slice fits inside one step (q and k cut from one packed qkv
// buffer), only the few slice pairs whose offsets come within a span of each other can meet.
bool overlap_from(const byte_layout& a, int da, std::int64_t a0, const byte_layout& b, int db,
                  std::int64_t b0) {
  const std::int64_t span_a = span(a, da), span_b = span(b, db);
  if (a0 >= b0 + span_b || b0 >= a0 + span_a) return false;
  if (da == a.rank && db == b.rank) return true;  // two rows whose extents meet
  if (da < a.rank && db < b.rank && a.stride[da] == b.stride[db] && a.stride[da] > 0) {
    const std::int64_t step = a.stride[da];
    const std::int64_t sub_a = span(a, da + 1), sub_b = span(b, db + 1);
    if (sub_a <= step && sub_b <= step) {
      const std::int64_t delta = b0 - a0;
      // slice t of a against slice u = t + k of b: offsets differ by delta + k * step
      const std::int64_t k_lo = std::max(-(a.n[da] - 1), (-sub_b - delta) / step - 1);
      const std::int64_t k_hi = std::min(b.n[db] - 1, (sub_a - delta) / step + 1);
      for (std::int64_t k = k_lo; k <= k_hi; ++k) {
        if (overlap_from(a, da + 1, 0, b, db + 1, delta + k * step)) return true;
      }
      return false;
    }
  }
  return rows_overlap(a, da, a0, b, db, b0);
}

}  // namespace

bool views_share_memory(const tensor_view& a, const tensor_view& b) {
  // apart (or empty): the common case, decided cheaply
  if (!spans_meet(byte_extent(a), byte_extent(b))) return false;
  const byte_layout la = layout_of(a), lb = layout_of(b);
  return overlap_from(la, 0, la.base, lb, 0, lb.base);
}

namespace {
// Rows distinct in the view's own order of dims: each stride (all positive) clears the span of
// the dims inside it. Contiguous views and their slices are, decided without sorting (every
// call checks its outputs; decode calls are short).
bool nested_in_order(const tensor_view& v) {
  const auto es = static_cast<std::int64_t>(size_of(v.type));
  std::int64_t inner = v.shape[v.rank - 1] * es;  // bytes spanned by the dims inside dim i
  for (int i = v.rank - 2; i >= 0; --i) {
    if (v.shape[i] == 1) continue;
    const std::int64_t s = v.strides[i] * es;
    if (s < inner) return false;
    inner += s * (v.shape[i] - 1);
  }
  return true;
}
}  // namespace

bool view_overlaps_itself(const tensor_view& v) {
  if (v.numel() <= 1) return false;
  if (nested_in_order(v)) return false;
  const byte_layout l = layout_of(v);
  // Sorted by stride, rows are distinct when every stride clears the span of the dims inside
  // it: the common case, decided at once.
  bool nested = true;
  for (int i = l.rank - 1; i >= 0 && nested; --i) nested = l.stride[i] >= span(l, i + 1);
  if (nested) return false;
  // Otherwise the rows may still interleave without meeting ([2, 3, 2] with strides {9, 7, 1}):
  // every row start, sorted, against the next one. Past max_rows rows the answer stays "may
  // overlap" (an error), which only views with unusual strides and millions of rows reach.
  constexpr std::int64_t max_rows = std::int64_t{1} << 22;
  std::int64_t rows = 1;
  for (int i = 0; i < l.rank; ++i) {
    if (l.stride[i] == 0) return true;  // a repeated row
    rows *= l.n[i];
    if (rows > max_rows) return true;
  }
  std::vector<std::int64_t> starts;
  starts.reserve(static_cast<std::size_t>(rows));
  collect_rows(l, 0, l.base, starts);
  std::sort(starts.begin(), starts.end());
  for (std::size_t i = 1; i < starts.size(); ++i) {
    if (starts[i] < starts[i - 1] + l.row) return true;
  }
  return false;
}

bool same_view(const tensor_view& a, const tensor_view& b) {
  if (a.data != b.data || a.type != b.type || a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a.shape[i] != b.shape[i]) return false;
    if (a.shape[i] > 1 && a.strides[i] != b.strides[i]) return false;
  }
  return true;
}

}  // namespace tilerope::detail
