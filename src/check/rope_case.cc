#include "check/rope_case.h"

#include <string>

#include "tilerope/error.h"

namespace tilerope::check {

std::string_view to_string(x_layout l) {
  switch (l) {
    case x_layout::thd:
      return "thd";
    case x_layout::bshd:
      return "bshd";
    case x_layout::bhsd:
      return "bhsd";
  }
  return "?";
}

x_layout x_layout_from_string(std::string_view name) {
  if (name == "thd") return x_layout::thd;
  if (name == "bshd") return x_layout::bshd;
  if (name == "bhsd") return x_layout::bhsd;
  throw error("layout '" + std::string(name) + "' is not one of thd, bshd, bhsd");
}

std::string variant_of(const rope_case& c) {
  std::string v = c.mrope_section ? "mrope-" + std::string(to_string(c.mrope)) + "-" : "";
  if (c.vision_2d) v = "vision2d-";
  if (c.qk_norm) v = (c.zero_weights ? "qknorm-w0-" : "qknorm-") + v;
  std::string style(to_string(c.style));
  if (c.output_layout == rope_output_layout::split_half) style += "-split";
  if (!c.rows.empty()) style += c.rows_half ? "-rows/2" : "-rows";
  return v + style + (c.backward ? "-bwd" : "");
}

std::string shape_of(const rope_case& c) {
  const std::string tok = c.layout == x_layout::thd
                              ? std::to_string(c.tokens)
                              : std::to_string(c.batch) + "," + std::to_string(c.tokens);
  std::string s =
      "q[" + tok + "," + std::to_string(c.q_heads) + "," + std::to_string(c.head_dim) + "]";
  if (c.k_heads)
    s += " k[" + tok + "," + std::to_string(c.k_heads) + "," + std::to_string(c.head_dim) + "]";
  if (c.rotary_dim && c.rotary_dim != c.head_dim) s += " r=" + std::to_string(c.rotary_dim);
  return s;
}

}  // namespace tilerope::check
