#include "npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string_view>
#include <utility>

#include "tilerope/error.h"

namespace tilerope::cli {

static_assert(std::endian::native == std::endian::little,
              "the .npy reader takes '|' and '=' byte orders as little-endian");

namespace {

constexpr char magic[] = "\x93NUMPY";
constexpr std::size_t magic_size = 6;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw error(path + ": " + what);
}

std::string errno_text() { return std::strerror(errno); }

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The header is a Python dict literal, e.g. "{'descr': '<f4', 'fortran_order': False,
// 'shape': (5, 4, 64), }". This reads exactly that grammar: string keys; a string, True/False
// or a tuple of non-negative integers as values.
class header_parser {
 public:
  header_parser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  void parse(std::string& descr, bool& fortran_order, std::vector<std::int64_t>& shape) {
    bool has_descr = false, has_order = false, has_shape = false;
    expect('{');
    while (!eat('}')) {
      const std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"') bad("'descr' is not a simple dtype string");
        descr = string_literal();
        has_descr = true;
      } else if (key == "fortran_order") {
        fortran_order = boolean();
        has_order = true;
      } else if (key == "shape") {
        shape = tuple();
        has_shape = true;
      } else {
        bad("unexpected key '" + key + "'");
      }
      if (!eat(',')) {
        expect('}');
        break;
      }
    }
    if (!has_descr) bad("no 'descr'");
    if (!has_order) bad("no 'fortran_order'");
    if (!has_shape) bad("no 'shape'");
  }

 private:
  [[noreturn]] void bad(const std::string& what) const { fail(path_, "bad .npy header: " + what); }

  char peek() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t')) ++at_;
    return at_ < text_.size() ? text_[at_] : '\0';
  }
  bool eat(char c) {
    if (peek() != c) return false;
    ++at_;
    return true;
  }
  void expect(char c) {
    if (!eat(c)) bad(std::string("expected '") + c + "' at offset " + std::to_string(at_));
  }
  std::string string_literal() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') bad("expected a string at offset " + std::to_string(at_));
    const std::size_t end = text_.find(quote, at_ + 1);
    if (end == std::string_view::npos) bad("unterminated string");
    std::string s(text_.substr(at_ + 1, end - at_ - 1));
    at_ = end + 1;
    return s;
  }
  bool boolean() {
    peek();
    for (const auto& [word, v] :
         {std::pair<std::string_view, bool>{"True", true}, {"False", false}}) {
      if (text_.substr(at_, word.size()) == word) {
        at_ += word.size();
        return v;
      }
    }
    bad("'fortran_order' is not True or False");
  }
  std::vector<std::int64_t> tuple() {
    std::vector<std::int64_t> dims;
    expect('(');
    while (!eat(')')) {
      peek();
      std::int64_t d = 0;
      std::size_t digits = 0;
      for (; at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9'; ++at_, ++digits) {
        if (d > (std::numeric_limits<std::int64_t>::max() - 9) / 10) bad("shape dim too large");
        d = d * 10 + (text_[at_] - '0');
      }
      if (digits == 0) bad("'shape' is not a tuple of non-negative integers");
      dims.push_back(d);
      if (!eat(',')) {
        expect(')');
        break;
      }
    }
    return dims;
  }

  std::string_view text_;
  const std::string& path_;
  std::size_t at_ = 0;
};

std::string supported_list(npy_content want) {
  switch (want) {
    case npy_content::floats:
      return "f4, f2, u2 with --dtype bf16";
    case npy_content::integers:
      return "i4, i8";
    default:
      return "f4, f2, u2, i4, i8";
  }
}

bool accepts(npy_content want, const std::string& descr) {
  const bool is_float = descr == "<f4" || descr == "<f2" || descr == "<u2";
  if (want == npy_content::floats) return is_float;
  if (want == npy_content::integers) return !is_float;
  return true;
}

std::uint64_t read_le(const unsigned char* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

std::size_t npy_item_size(const std::string& descr) {
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f2" || descr == "<u2") return 2;
  if (descr == "<i8") return 8;
  return 0;
}

namespace {

// Where read_from takes the bytes: a file, or memory.
struct file_source {
  std::ifstream& f;
  bool read(void* to, std::uint64_t n) {
    return static_cast<bool>(f.read(static_cast<char*>(to), static_cast<std::streamsize>(n)));
  }
};
struct memory_source {
  const unsigned char* bytes;
  std::uint64_t size, at = 0;
  bool read(void* to, std::uint64_t n) {
    if (n > size - at) return false;
    if (n) std::memcpy(to, bytes + at, n);
    at += n;
    return true;
  }
};

template <class Source>
npy_array read_from(Source& in, std::uint64_t file_size, const std::string& path,
                    npy_content want) {
  unsigned char prefix[12];
  if (!in.read(prefix, 8) || std::memcmp(prefix, magic, magic_size) != 0) {
    fail(path, "not a .npy file (bad magic)");
  }
  const int major = prefix[6], minor = prefix[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    fail(path, ".npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                   " is not supported (1.0, 2.0, 3.0)");
  }
  const int len_bytes = major == 1 ? 2 : 4;
  if (!in.read(prefix + 8, len_bytes)) fail(path, "truncated header");
  const std::uint64_t header_len = read_le(prefix + 8, len_bytes);
  const std::uint64_t data_offset = 8 + len_bytes + header_len;
  if (data_offset > file_size) {
    fail(path, "truncated header: " + std::to_string(header_len) + " bytes announced, " +
                   std::to_string(file_size - 8 - len_bytes) + " present");
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) fail(path, "cannot read the header: " + errno_text());

  npy_array a;
  bool fortran_order = false;
  header_parser(header, path).parse(a.descr, fortran_order, a.shape);
  if (a.descr.size() == 3 && (a.descr[0] == '|' || a.descr[0] == '=')) a.descr[0] = '<';
  if (!a.descr.empty() && a.descr[0] == '>') {
    fail(path, "dtype '" + a.descr + "' is big-endian; only little-endian data is supported");
  }
  if (npy_item_size(a.descr) == 0 || !accepts(want, a.descr)) {
    fail(path, "dtype '" + a.descr + "' is not supported (" + supported_list(want) + ")");
  }
  if (fortran_order) fail(path, "fortran_order True is not supported (C order only)");

  std::uint64_t bytes = npy_item_size(a.descr);
  for (std::int64_t d : a.shape) {
    if (__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(d), &bytes)) {
      fail(path, "shape " + shape_text(a.shape) + " is too large");
    }
  }
  if (bytes > file_size - data_offset) {
    fail(path, "truncated data: shape " + shape_text(a.shape) + " of '" + a.descr + "' needs " +
                   std::to_string(bytes) + " bytes, the file has " +
                   std::to_string(file_size - data_offset));
  }
  a.data.resize(bytes);
  if (bytes > 0 && !in.read(a.data.data(), bytes)) {
    fail(path, "cannot read the data: " + errno_text());
  }
  return a;
}

}  // namespace

npy_array read_npy(const std::string& path, npy_content want) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open: " + errno_text());
  f.seekg(0, std::ios::end);
  const std::streamoff end = f.tellg();
  f.seekg(0);
  if (!f || end < 0) fail(path, "cannot read: " + errno_text());
  file_source in{f};
  return read_from(in, static_cast<std::uint64_t>(end), path, want);
}

npy_array read_npy_bytes(const void* data, std::size_t size, const std::string& name,
                         npy_content want) {
  memory_source in{static_cast<const unsigned char*>(data), size};
  return read_from(in, size, name, want);
}

pending_npy::pending_npy(const std::string& path, const std::string& descr,
                         const std::vector<std::int64_t>& shape, const void* data,
                         std::size_t bytes)
    : path_(path) {
  std::uint64_t want = npy_item_size(descr);
  if (want == 0) fail(path, "cannot write dtype '" + descr + "'");
  for (std::int64_t d : shape) want *= static_cast<std::uint64_t>(d);
  if (want != bytes) {
    fail(path, "shape " + shape_text(shape) + " of '" + descr + "' needs " + std::to_string(want) +
                   " bytes, " + std::to_string(bytes) + " given");
  }

  // numpy's layout: the dict, padded with spaces and a final '\n' so that the data starts at
  // a multiple of 64 bytes.
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    header += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    if (i + 1 < shape.size()) header += ' ';
  }
  header += "), }";
  auto padded = [&](std::size_t prefix_size) {
    std::string h = header;
    h.append(63 - (prefix_size + h.size()) % 64, ' ');
    return h + '\n';
  };
  std::string prefix(magic, magic_size);
  std::string h = padded(10);
  if (h.size() <= 0xffff) {
    prefix += std::string("\x01\x00", 2);
    prefix += static_cast<char>(h.size() & 0xff);
    prefix += static_cast<char>(h.size() >> 8);
  } else {
    h = padded(12);
    prefix += std::string("\x02\x00", 2);
    for (int i = 0; i < 4; ++i) prefix += static_cast<char>((h.size() >> (8 * i)) & 0xff);
  }

  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) fail(path, "is a directory");
  std::string temp = path + ".tmp-XXXXXX";
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) fail(path, "cannot create a temporary file beside it: " + errno_text());
  const mode_t mask = ::umask(0);  // mkstemp makes 0600; give the file the usual 0666 & ~umask
  ::umask(mask);
  bool ok = ::fchmod(fd, 0666 & ~mask) == 0;
  for (const auto& [p, n] : {std::pair<const void*, std::size_t>{prefix.data(), prefix.size()},
                             {h.data(), h.size()},
                             {data, bytes}}) {
    for (std::size_t done = 0; ok && done < n;) {
      const ssize_t w = ::write(fd, static_cast<const char*>(p) + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      ok = w > 0;
      if (ok) done += static_cast<std::size_t>(w);
    }
  }
  std::string why = ok ? "" : errno_text();
  if (::close(fd) != 0 && ok) {
    ok = false;
    why = errno_text();
  }
  if (!ok) {
    ::unlink(temp.c_str());
    fail(path, "cannot write " + temp + ": " + why);
  }
  temp_ = std::move(temp);
}

pending_npy::pending_npy(pending_npy&& other) noexcept
    : path_(std::move(other.path_)), temp_(std::exchange(other.temp_, {})) {}

pending_npy::~pending_npy() {
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

void pending_npy::commit() {
  if (temp_.empty()) return;
  if (std::rename(temp_.c_str(), path_.c_str()) != 0) {
    fail(path_, "cannot rename " + temp_ + " over it: " + errno_text());
  }
  temp_.clear();
}

void write_npy_atomic(const std::string& path, const std::string& descr,
                      const std::vector<std::int64_t>& shape, const void* data, std::size_t bytes) {
  pending_npy(path, descr, shape, data, bytes).commit();
}

}  // namespace tilerope::cli
