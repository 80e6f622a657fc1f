// rope_config: HF config.json parsing, the scaled frequencies, and their cos/sin tables.
// (tests/test_rope_config.py checks every rope type against an independent numpy evaluation.)

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "golden/golden.h"
#include "tilerope/error.h"
#include "tilerope/freqs.h"
#include "tilerope/rope_config.h"

namespace {

using namespace tilerope;

// The message of the tilerope::error `f` throws, or "(no error)".
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_ERROR(expr, needle)                                           \
  EXPECT_NE(error_of([&] { (void)(expr); }).find(needle), std::string::npos) \
      << error_of([&] { (void)(expr); })

rope_config parse(const std::string& json) { return rope_config::from_hf_json_text(json, "cfg"); }

// Qwen2.5-7B-Instruct with the YaRN block of its model card.
const char* qwen25_yarn = R"({
  "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
  "max_position_embeddings": 32768, "rope_theta": 1000000.0,
  "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}})";

TEST(RopeConfig, TypeNamesRoundTripAndLegacyNames) {
  for (auto t : {rope_scaling_type::none, rope_scaling_type::linear, rope_scaling_type::dynamic,
                 rope_scaling_type::yarn, rope_scaling_type::longrope, rope_scaling_type::llama3,
                 rope_scaling_type::proportional}) {
    EXPECT_EQ(rope_scaling_type_from_string(to_string(t)), t);
  }
  EXPECT_EQ(to_string(rope_scaling_type::none), "default");
  EXPECT_EQ(rope_scaling_type_from_string("su"), rope_scaling_type::longrope);
  EXPECT_EQ(rope_scaling_type_from_string("mrope"), rope_scaling_type::none);
  EXPECT_ERROR(rope_scaling_type_from_string("ntk"), "rope_type 'ntk' is not one of");
}

// proportional (Gemma 4): the whole head rotates; past int(factor * head_dim // 2) the
// frequencies are 0, and the others are over head_dim, divided by `factor`.
TEST(RopeConfig, ProportionalZeroesTheFrequenciesPastItsFraction) {
  const rope_config c = parse(R"({"head_dim": 256, "rope_parameters": {"rope_type":
      "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25, "factor": 2.0}})");
  EXPECT_EQ(c.scaling.type, rope_scaling_type::proportional);
  EXPECT_EQ(c.rotary_dim, 256);
  const rope_frequencies f = c.frequencies();
  const std::vector<double> base = rope_inv_freq(256, 1e6);
  ASSERT_EQ(f.inv_freq.size(), 128u);
  for (std::size_t i = 0; i < 128; ++i) {
    EXPECT_EQ(f.inv_freq[i], i < 32 ? base[i] / 2.0 : 0.0) << i;
  }
  EXPECT_EQ(f.attention_scaling, 1.0);
  // Without a factor or fraction: the plain frequencies over the whole head.
  const rope_frequencies plain =
      parse(R"({"head_dim": 64, "rope_parameters": {"rope_type": "proportional"}})").frequencies();
  EXPECT_EQ(plain.inv_freq, rope_inv_freq(64, 10000.0));
}

TEST(RopeConfig, ParsesQwen25Yarn) {
  const rope_config c = parse(qwen25_yarn);
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.theta, 1e6);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.scaling.type, rope_scaling_type::yarn);
  EXPECT_EQ(c.scaling.factor, 4.0);
  EXPECT_EQ(c.scaling.original_max_position_embeddings, 32768);
  EXPECT_FALSE(c.scaling.attention_factor);
  EXPECT_TRUE(c.scaling.truncate);
  EXPECT_FALSE(c.mrope_section);
}

// Current HF keeps the configured factor 4 (older 4.x derived 32768 / 32768 = 1: no scaling).
TEST(RopeConfig, Qwen25YarnUsesTheConfiguredFactor) {
  const rope_frequencies f = parse(qwen25_yarn).frequencies();
  const std::vector<double> base = rope_inv_freq(128, 1e6);
  ASSERT_EQ(f.inv_freq.size(), 64u);
  EXPECT_DOUBLE_EQ(f.attention_scaling, 0.1 * std::log(4.0) + 1.0);
  EXPECT_EQ(f.inv_freq[0], base[0]);                 // fastest: extrapolated, unchanged
  EXPECT_DOUBLE_EQ(f.inv_freq[63], base[63] / 4.0);  // slowest: interpolated by the factor
  for (std::size_t i = 0; i < 64; ++i) {
    EXPECT_LE(f.inv_freq[i], base[i]);
    EXPECT_GE(f.inv_freq[i], base[i] / 4.0 * (1 - 1e-15));
  }
}

TEST(RopeConfig, DeepSeekV2LiteRotatesQkRopeHeadDimWithUnitScaling) {
  const rope_config c = parse(R"({"model_type": "deepseek_v2", "hidden_size": 2048,
    "num_attention_heads": 16, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "max_position_embeddings": 163840, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
      "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"}})");
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.scaling.mscale, 0.707);
  const rope_frequencies f = c.frequencies();
  EXPECT_EQ(f.inv_freq.size(), 32u);
  EXPECT_EQ(f.attention_scaling, 1.0);
}

TEST(RopeConfig, Phi3TopLevelOriginalWinsAndLongropeSwitchesPastIt) {
  std::string shorts = "[", longs = "[";
  for (int i = 0; i < 48; ++i) {
    shorts += std::string(i ? ", " : "") + "1.5";
    longs += std::string(i ? ", " : "") + "4.0";
  }
  shorts += "]";
  longs += "]";
  const rope_config c = parse(R"({"model_type": "phi3", "hidden_size": 3072,
    "num_attention_heads": 32, "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
    "rope_scaling": {"type": "longrope", "original_max_position_embeddings": 999,
      "short_factor": )" + shorts +
                              R"(, "long_factor": )" + longs + "}}");
  EXPECT_EQ(c.scaling.type, rope_scaling_type::longrope);
  EXPECT_EQ(c.scaling.original_max_position_embeddings, 4096);
  const std::vector<double> base = rope_inv_freq(96, 10000.0);
  const double scaling = std::sqrt(1 + std::log(32.0) / std::log(4096.0));
  for (std::int64_t seq_len : {0, 1, 4096}) {
    const rope_frequencies f = c.frequencies(seq_len);
    EXPECT_DOUBLE_EQ(f.inv_freq[5], base[5] / 1.5) << seq_len;
    EXPECT_DOUBLE_EQ(f.attention_scaling, scaling);
  }
  const rope_frequencies f = c.frequencies(4097);
  EXPECT_DOUBLE_EQ(f.inv_freq[5], base[5] / 4.0);
  EXPECT_DOUBLE_EQ(f.attention_scaling, scaling);
}

TEST(RopeConfig, DynamicIsPlainUpToMaxPositionEmbeddings) {
  const rope_config c = parse(R"({"hidden_size": 1024, "num_attention_heads": 8,
    "max_position_embeddings": 2048, "rope_scaling": {"type": "dynamic", "factor": 2.0}})");
  EXPECT_EQ(c.theta, 10000.0);  // HF's default_theta
  const std::vector<double> base = rope_inv_freq(128, 10000.0);
  for (std::int64_t seq_len : {0, 100, 2048}) EXPECT_EQ(c.frequencies(seq_len).inv_freq, base);
  // Past it: theta * (2 * 4096 / 2048 - 1)^(128 / 126).
  const double theta = 10000.0 * std::pow(3.0, 128.0 / 126.0);
  const std::vector<double> grown = rope_inv_freq(128, theta);
  const rope_frequencies f = c.frequencies(4096);
  for (std::size_t i = 0; i < 64; ++i) EXPECT_NEAR(f.inv_freq[i], grown[i], 1e-15 * grown[i]);
}

TEST(RopeConfig, Llama3KeepsHighFrequenciesAndDividesLowOnes) {
  const rope_config c = parse(R"({"hidden_size": 4096, "num_attention_heads": 32,
    "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  const std::vector<double> base = rope_inv_freq(128, 500000.0);
  const rope_frequencies f = c.frequencies();
  for (std::size_t i = 0; i < 64; ++i) {
    const double wavelen = 2 * std::numbers::pi / base[i];
    if (wavelen < 8192.0 / 4) EXPECT_EQ(f.inv_freq[i], base[i]) << i;
    if (wavelen > 8192.0) EXPECT_EQ(f.inv_freq[i], base[i] / 8) << i;
    EXPECT_LE(f.inv_freq[i], base[i]);
    EXPECT_GE(f.inv_freq[i], base[i] / 8);
  }
}

TEST(RopeConfig, TextConfigRopeParametersAndPartialRotary) {
  // Qwen3.5 style: everything under text_config, rope_parameters with the rotated fraction.
  const rope_config c = parse(R"({"model_type": "qwen3_5", "text_config": {
    "hidden_size": 4096, "num_attention_heads": 16, "head_dim": 256,
    "max_position_embeddings": 262144,
    "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
      "rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}}})");
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.theta, 1e7);
  ASSERT_TRUE(c.mrope_section);
  EXPECT_EQ(*c.mrope_section, (std::array<int, 3>{11, 11, 10}));
  EXPECT_TRUE(c.mrope_interleaved);
  EXPECT_EQ(c.frequencies().inv_freq, rope_inv_freq(64, 1e7));
}

TEST(RopeConfig, Qwen2VlMropeIsDefaultWithChunkedSections) {
  const rope_config c = parse(R"({"model_type": "qwen2_vl", "hidden_size": 3584,
    "num_attention_heads": 28, "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})");
  EXPECT_EQ(c.scaling.type, rope_scaling_type::none);
  EXPECT_EQ(*c.mrope_section, (std::array<int, 3>{16, 24, 24}));
  EXPECT_FALSE(c.mrope_interleaved);
}

TEST(RopeConfig, ErrorsNameTheOriginTheKeyAndTheValue) {
  const std::string dims = R"("hidden_size": 1024, "num_attention_heads": 8, )";
  EXPECT_ERROR(parse("{" + dims + R"("rope_scaling": {"type": "linear", "factor": -2}})"),
               "cfg: rope_scaling.factor (-2) must be > 0");
  EXPECT_ERROR(parse("{" + dims + R"("rope_scaling": {"type": "linear", "factor": "2"}})"),
               R"(cfg: rope_scaling.factor ("2") must be a number)");
  EXPECT_ERROR(parse("{" + dims + R"("rope_scaling": {"type": "linear"}})"),
               "cfg: rope_scaling.factor is missing (rope_type 'linear' needs it)");
  EXPECT_ERROR(parse("{" + dims + R"("rope_parameters": {"rope_type": "warp"}})"),
               "cfg: rope_parameters.rope_type: rope_type 'warp' is not one of");
  EXPECT_ERROR(parse("{" + dims + R"("rope_scaling": {"type": "longrope",
      "short_factor": [1, 1], "long_factor": [1, 1]}, "max_position_embeddings": 4096})"),
               "cfg: rope_scaling.short_factor has 2 entries; it needs rotary_dim/2 = 64");
  EXPECT_ERROR(parse("{" + dims + R"("rope_scaling": {"type": "longrope",
      "short_factor": [1], "long_factor": [1]}})"),
               "cfg: max_position_embeddings is missing (rope_type 'longrope' needs it");
  EXPECT_ERROR(parse(R"({"head_dim": 64.5})"), "cfg: head_dim (64.5) must be an integer");
  EXPECT_ERROR(parse(R"({"num_attention_heads": 8})"), "cfg: head_dim is missing, and so is");
  EXPECT_ERROR(parse("{" + dims + R"("rope_theta": 0})"),
               "cfg: rope_theta (0) must be finite and > 0");
  EXPECT_ERROR(parse("{" + dims + R"("text_config": 3})"), "cfg: text_config must be an object");
  EXPECT_ERROR(parse("{" + dims + R"("text_config": {"rope_scaling": {"type": "dynamic",
      "factor": 2}}})"),
               "cfg: max_position_embeddings is missing (rope_type 'dynamic' needs it");
  EXPECT_ERROR(parse("{" + dims + R"("rope_scaling": {"type": "yarn", "factor": 2,
      "truncate": "no"}})"),
               "cfg: rope_scaling.truncate (\"no\") must be true or false");
  EXPECT_ERROR(parse("{" + dims + R"("rope_scaling": {"type": "mrope",
      "mrope_section": [16, 24]}})"),
               "cfg: rope_scaling.mrope_section ([16,24]) must be a list of 3 integers");
  EXPECT_ERROR(parse("[1, 2]"), "cfg: the config must be a JSON object");
  EXPECT_ERROR(parse("{"), "cfg: invalid JSON");
  EXPECT_ERROR(rope_config::from_hf_json("/nonexistent/config.json"),
               "/nonexistent/config.json: cannot be opened");
}

// Inputs that once crashed the reader or escaped it as another exception type.
TEST(RopeConfig, HostileJsonIsATileropeError) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const auto parse = [](const std::string& text) {
    return error_of([&] { rope_config::from_hf_json_text(text, "c.json"); });
  };
  EXPECT_NE(parse("{\"head_dim\": " + deep + "}").find("c.json: JSON nested deeper than 64"),
            std::string::npos);
  EXPECT_NE(parse("{\"head_dim\": 128, \"rope_scaling\": " + deep + "}").find("deeper than 64"),
            std::string::npos);
  EXPECT_NE(parse("{\"head_dim\": 128, \"rope_theta\": 1e400}").find("c.json: invalid JSON"),
            std::string::npos);
  EXPECT_NE(parse("{\"head_dim\": 128, \"partial_rotary_factor\": 1e300}")
                .find("partial_rotary_factor (1e+300) must be in (0, 1]"),
            std::string::npos);
  EXPECT_NE(parse("{\"head_dim\": 1073741824, \"partial_rotary_factor\": 4}")
                .find("head_dim (1073741824) must be in [1, 65536]"),
            std::string::npos);
  EXPECT_NE(parse("{\"head_dim\": 161824786}").find("head_dim (161824786)"), std::string::npos);
  EXPECT_NE(parse("{\"head_dim\": 128, \"rope_scaling\": {\"rope_type\": \"default\", "
                  "\"mrope_section\": [1073741824, 1073741824, 1073741824]}}")
                .find("summing to rotary_dim/2 (64)"),
            std::string::npos);
  rope_config c;
  c.head_dim = 1 << 20;
  EXPECT_NE(error_of([&] { c.frequencies(0); }).find("head_dim (1048576) must be in [1, 65536]"),
            std::string::npos);
}

TEST(RopeConfig, HandBuiltConfigsAreValidatedByFrequencies) {
  rope_config c;
  c.head_dim = 64;
  EXPECT_EQ(c.effective_rotary_dim(), 64);
  EXPECT_EQ(c.frequencies().inv_freq, rope_inv_freq(64, 10000.0));
  c.scaling.type = rope_scaling_type::linear;
  EXPECT_ERROR(c.frequencies(), "scaling.factor is missing (rope_type 'linear' needs it)");
  c.scaling.factor = -2;
  EXPECT_ERROR(c.frequencies(), "scaling.factor (-2) must be > 0");
  c.scaling.factor = 2;
  EXPECT_ERROR(c.frequencies(-1), "seq_len (-1) must be >= 0");
  c.rotary_dim = 32;
  EXPECT_ERROR(c.frequencies(), "rotary_dim (32) must be 0 or int(head_dim (64) * ");
  c.rotary_dim = 0;
  c.partial_rotary_factor = 0.5;
  EXPECT_EQ(c.frequencies().inv_freq.size(), 16u);
  c.scaling.type = rope_scaling_type::yarn;
  EXPECT_ERROR(c.frequencies(), "max_position_embeddings is missing (rope_type 'yarn' needs it");
  c.max_position_embeddings = 4096;
  c.scaling.beta_fast = -1;
  EXPECT_ERROR(c.frequencies(), "scaling.beta_fast (-1) must be finite and >= 0");
}

// make_rope_table(max_pos, frequencies): cos/sin times the attention scaling, rounded once.
TEST(RopeConfig, TablesAreCosSinTimesScalingRoundedOnce) {
  const rope_frequencies f = parse(qwen25_yarn).frequencies();
  ASSERT_NE(f.attention_scaling, 1.0);
  const std::int64_t max_pos = 300;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    const rope_table table = make_rope_table(max_pos, f, t);
    ASSERT_EQ(table.cos.shape(), (std::vector<std::int64_t>{max_pos, 64}));
    ASSERT_EQ(table.sin.shape(), (std::vector<std::int64_t>{max_pos, 64}));
    ASSERT_EQ(table.cos.type(), t);
    for (std::int64_t p = 0; p < max_pos; ++p) {
      for (std::size_t i = 0; i < 64; ++i) {
        const double a = static_cast<double>(p) * f.inv_freq[i];
        const std::size_t at = static_cast<std::size_t>(p * 64) + i;
        ASSERT_EQ(load_as_f64(table.cos.data(), t, at),
                  golden::round_to(t, std::cos(a) * f.attention_scaling))
            << to_string(t) << " p=" << p << " i=" << i;
        ASSERT_EQ(load_as_f64(table.sin.data(), t, at),
                  golden::round_to(t, std::sin(a) * f.attention_scaling))
            << to_string(t) << " p=" << p << " i=" << i;
      }
    }
  }
}

TEST(RopeConfig, UnitScalingTablesEqualThePlainFrequencyTables) {
  rope_frequencies f{rope_inv_freq(64, 500000.0), 1.0};
  const rope_table a = make_rope_table(257, f);
  const rope_table b = make_rope_table(257, f.inv_freq);
  for (std::size_t i = 0; i < static_cast<std::size_t>(a.cos.numel()); ++i) {
    ASSERT_EQ(load_as_f64(a.cos.data(), dtype::f32, i), load_as_f64(b.cos.data(), dtype::f32, i));
    ASSERT_EQ(load_as_f64(a.sin.data(), dtype::f32, i), load_as_f64(b.sin.data(), dtype::f32, i));
  }
  EXPECT_EQ(make_rope_table(0, f).cos.numel(), 0);
}

TEST(RopeConfig, TableArgumentsAreValidated) {
  const rope_frequencies good{{1.0, 0.5}, 1.2};
  EXPECT_ERROR(make_rope_table(-1, good), "max_pos (-1) must be >= 0");
  EXPECT_ERROR(make_rope_table(4, good, dtype::i32), "table dtype (i32) must be f32, f16 or bf16");
  EXPECT_ERROR(make_rope_table(4, rope_frequencies{{}, 1.0}), "inv_freq must not be empty");
  EXPECT_ERROR(make_rope_table(4, rope_frequencies{{1.0, NAN}, 1.0}),
               "inv_freq[1] (nan) must be finite");
  EXPECT_ERROR(make_rope_table(4, rope_frequencies{{1.0}, 0.0}),
               "attention_scaling (0) must be finite and > 0");
}

}  // namespace
