"""`tilerope freqs` against an independent fp64 numpy evaluation of HF transformers' RoPE presets.

The reference below re-derives, from transformers' modeling_rope_utils (current main: YaRN keeps
a configured `factor`), the inverse frequencies and the attention scaling of each rope type, and
reads every config.json itself (text_config, rope_scaling / rope_parameters, legacy type names).
It checks every model config in tests/configs, synthetic configs for the rope types and formats
no shipped model covers, and bad configs that must exit 2 naming the key.

Usage: /usr/bin/python3 test_rope_config.py path/to/tilerope
Prints one line per check, then `N passed, M failed`; exits 1 if any check failed.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

BINARY = sys.argv[1]
CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
COUNTS = {"passed": 0, "failed": 0}
RTOL = 1e-6


def check(ok, what):
    print(("PASS  " if ok else "FAIL  ") + what)
    COUNTS["passed" if ok else "failed"] += 1


# --- the reference ------------------------------------------------------------------------------


def read_settings(cfg):
    """The RoPE settings HF's config classes end up with, as a flat dict."""
    text = cfg.get("text_config") or {}

    def get(key):
        value = text.get(key)
        return cfg.get(key) if value is None else value

    rope = get("rope_scaling") or get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "mrope":  # Qwen2-VL: plain frequencies, the sections say which axis rotates each
        kind = "default"
    if kind == "su" or (kind == "yarn" and get("model_type") == "phi3"):
        kind = "longrope"
    if get("qk_rope_head_dim") is not None:
        head_dim = get("qk_rope_head_dim")
    elif get("head_dim") is not None:
        head_dim = get("head_dim")
    else:
        head_dim = get("hidden_size") // get("num_attention_heads")
    prf = get("partial_rotary_factor")
    if prf is None:
        prf = rope.get("partial_rotary_factor", 1.0)
    theta = rope.get("rope_theta")
    if theta is None:
        theta = get("rope_theta")
    s = dict(rope)
    s.update(
        kind=kind,
        theta=10000.0 if theta is None else float(theta),
        head_dim=head_dim,
        dim=int(head_dim * prf),
        max_pos=get("max_position_embeddings"),
        mrope_section=rope.get("mrope_section", get("mrope_section")),
        mrope_interleaved=bool(rope.get("mrope_interleaved", get("mrope_interleaved") or False)),
    )
    if kind in ("yarn", "longrope", "llama3"):
        top = get("original_max_position_embeddings")
        inner = rope.get("original_max_position_embeddings")
        s["original"] = top if top is not None else (inner if inner is not None else s["max_pos"])
    return s


def hf_frequencies(s, seq_len=None):
    """(inv_freq, attention_scaling) as HF's _compute_<type>_parameters, in fp64."""
    d, theta = s["dim"], s["theta"]
    exponent = np.arange(0, d, 2, dtype=np.float64) / d
    pos_freqs = theta**exponent
    inv = 1.0 / pos_freqs
    kind = s["kind"]
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / s["factor"], 1.0
    if kind == "dynamic":
        max_pos, factor = s["max_pos"], s["factor"]
        length = max_pos if seq_len is None else max(seq_len, max_pos)
        base = theta * ((factor * length / max_pos) - (factor - 1)) ** (d / (d - 2))
        return 1.0 / base**exponent, 1.0
    if kind == "yarn":
        original = s["original"]
        factor = s.get("factor")
        if factor is None:
            factor = s["max_pos"] / original

        def mscale_of(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = s.get("attention_factor")
        if attention is None:
            if s.get("mscale") and s.get("mscale_all_dim"):
                attention = mscale_of(factor, s["mscale"]) / mscale_of(factor, s["mscale_all_dim"])
            else:
                attention = mscale_of(factor)
        beta_fast = s.get("beta_fast") or 32
        beta_slow = s.get("beta_slow") or 1

        def correction_dim(rotations):
            return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if s.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        keep = 1 - ramp  # weight of the extrapolated (unscaled) frequency
        return (1.0 / (factor * pos_freqs)) * (1 - keep) + inv * keep, attention
    if kind == "longrope":
        original = s["original"]
        factor = s.get("factor")
        if factor is None:
            factor = s["max_pos"] / original
        attention = s.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        ext = s["long_factor"] if seq_len and seq_len > original else s["short_factor"]
        return 1.0 / (np.asarray(ext, dtype=np.float64) * pos_freqs), attention
    if kind == "llama3":
        factor, lo, hi, original = (s["factor"], s["low_freq_factor"], s["high_freq_factor"],
                                    s["original"])
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > original / lo, inv / factor, inv)
        smooth = (original / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < original / hi) & ~(wavelen > original / lo)
        return np.where(medium, smoothed, out), 1.0
    raise ValueError(kind)


# --- running the binary --------------------------------------------------------------------------


def run(*args):
    return subprocess.run([BINARY, *map(str, args)], capture_output=True, text=True)


def freqs_json(path, seq_len=None):
    args = ["freqs", "--config", path, "--json"]
    if seq_len is not None:
        args += ["--seq-len", seq_len]
    r = run(*args)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return json.loads(r.stdout), ""


def rel_err(got, want):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return math.inf
    return float(np.max(np.abs(got - want) / np.abs(want))) if want.size else 0.0


def compare(name, path, seq_len=None, expect=None):
    """`tilerope freqs` on `path` against the reference; `expect` adds exact field checks."""
    with open(path) as f:
        s = read_settings(json.load(f))
    got, err = freqs_json(path, seq_len)
    label = f"{name}" + ("" if seq_len is None else f" seq_len={seq_len}")
    if got is None:
        check(False, f"{label}: tilerope freqs failed: {err}")
        return None
    want_inv, want_scale = hf_frequencies(s, seq_len)
    e_inv = rel_err(got["inv_freq"], want_inv)
    e_scale = rel_err([got["attention_scaling"]], [want_scale])
    fields_ok = (
        got["rope_type"] == s["kind"]
        and got["theta"] == s["theta"]
        and got["head_dim"] == s["head_dim"]
        and got["rotary_dim"] == s["dim"]
        and got["mrope_section"] == s["mrope_section"]
        and got["mrope_interleaved"] == s["mrope_interleaved"]
    )
    for key, value in (expect or {}).items():
        fields_ok = fields_ok and (got[key] == value if not isinstance(value, float) else
                                   abs(got[key] - value) <= RTOL * abs(value))
    check(
        e_inv <= RTOL and e_scale <= RTOL and fields_ok,
        f"{label}: {got['rope_type']} d={got['rotary_dim']} {len(got['inv_freq'])} inv_freq "
        f"max rel err {e_inv:.1e}, attention_scaling {got['attention_scaling']:.17g} "
        f"(rel err {e_scale:.1e})"
        f"{'' if fields_ok else ', FIELDS DIFFER: ' + json.dumps(got)[:300]}",
    )
    return got


def expect_error(name, path, needles, *extra):
    r = run("freqs", "--config", path, "--json", *extra)
    line = r.stderr.strip()
    ok = (r.returncode == 2 and line.startswith("tilerope: error:")
          and all(n in line for n in needles))
    check(ok, f"{name}: exit {r.returncode}: {line}")


# --- the checks ---------------------------------------------------------------------------------


def model_configs():
    files = sorted(f for f in os.listdir(CONFIGS) if f.endswith(".json"))
    check(len(files) >= 6, f"tests/configs holds {len(files)} model configs")
    for f in files:
        path = os.path.join(CONFIGS, f)
        compare(f, path)
    p = lambda f: os.path.join(CONFIGS, f)
    # Facts each model is meant to have, stated outright.
    q = compare("qwen2.5 yarn: factor 4 is used (not max/original = 1)",
                p("qwen2.5-7b-instruct-yarn.json"),
                expect={"attention_scaling": 0.1 * math.log(4.0) + 1.0})
    if q:
        base = 1e6 ** (-np.arange(0, 128, 2) / 128)
        check(abs(q["inv_freq"][0] - 1.0) < 1e-15
              and rel_err(q["inv_freq"][-1], base[-1] / 4) < 1e-12,
              "qwen2.5 yarn: the fastest frequency is unscaled, the slowest divided by 4")
    compare("deepseek-v2-lite: mscale == mscale_all_dim gives attention_scaling 1",
            p("deepseek-v2-lite.json"),
            expect={"attention_scaling": 1.0, "head_dim": 64, "rotary_dim": 64})
    phi = p("phi-3-mini-128k-instruct.json")
    for seq_len in (0, 4096, 4097, 131072):  # short factors up to original (4096), long past it
        compare("phi-3-mini-128k", phi, seq_len,
                expect={"attention_scaling": math.sqrt(1 + math.log(32) / math.log(4096))})
    short, _ = freqs_json(phi, 4096)
    long, _ = freqs_json(phi, 4097)
    check(short and long and short["inv_freq"] != long["inv_freq"],
          "phi-3-mini-128k: seq_len 4097 switches to long_factor")
    llama = compare("llama-3.1-8b: high frequencies kept, low ones / 8", p("llama-3.1-8b.json"))
    if llama:
        base = 500000.0 ** (-np.arange(0, 128, 2) / 128)
        check(llama["inv_freq"][0] == 1.0 and rel_err(llama["inv_freq"][-1], base[-1] / 8) < 1e-12,
              "llama-3.1-8b: inv_freq[0] = 1, inv_freq[63] = base / 8")


def synthetic_configs(tmp):
    def write(name, cfg):
        path = os.path.join(tmp, name + ".json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    llama = {"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 16,
             "max_position_embeddings": 4096, "rope_theta": 10000.0}
    compare("linear factor 4",
            write("linear", {**llama, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}))
    dyn = write("dynamic", {**llama, "rope_scaling": {"type": "dynamic", "factor": 2.0}})
    for seq_len in (None, 1000, 4096, 4097, 16384):
        compare("dynamic factor 2", dyn, seq_len)
    plain, _ = freqs_json(dyn, 4096)
    grown, _ = freqs_json(dyn, 16384)
    check(plain and grown and plain["inv_freq"][1] > grown["inv_freq"][1],
          "dynamic: past max_position_embeddings the base grows (slower frequencies)")
    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}
    compare("yarn, attention_factor given",
            write("yarn_af", {**llama, "rope_scaling": {**yarn, "attention_factor": 1.25}}),
            expect={"attention_scaling": 1.25})
    compare("yarn, truncate false (gpt-oss style)",
            write("yarn_notrunc", {**llama, "rope_theta": 150000.0, "head_dim": 64,
                                   "rope_scaling": {**yarn, "factor": 32.0, "beta_fast": 32.0,
                                                    "beta_slow": 1.0, "truncate": False}}))
    compare("yarn, no factor: max/original = 4",
            write("yarn_nofactor", {**llama, "max_position_embeddings": 16384,
                                    "rope_scaling": {"type": "yarn",
                                                     "original_max_position_embeddings": 4096}}),
            expect={"attention_scaling": 0.1 * math.log(4.0) + 1.0})
    compare("yarn, mscale 1 and mscale_all_dim 0.5 (ratio)",
            write("yarn_mscale",
                  {**llama, "rope_scaling": {**yarn, "mscale": 1.0, "mscale_all_dim": 0.5}}))
    compare("yarn, beta 0 means the defaults 32 and 1",
            write("yarn_beta0",
                  {**llama, "rope_scaling": {**yarn, "beta_fast": 0, "beta_slow": 0}}))
    compare("rope_parameters (transformers 5), theta inside",
            write("rope_parameters", {
                "model_type": "qwen3", "hidden_size": 4096, "num_attention_heads": 32,
                "head_dim": 128, "max_position_embeddings": 131072,
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 32768}}),
            expect={"theta": 1000000.0})
    compare("partial_rotary_factor 0.5, linear",
            write("partial", {**llama, "partial_rotary_factor": 0.5,
                              "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
            expect={"rotary_dim": 64, "head_dim": 128})
    compare("partial_rotary_factor 0.25 inside rope_parameters, text_config (Qwen3.5 style)",
            write("qwen35", {"model_type": "qwen3_5", "text_config": {
                "model_type": "qwen3_5_text", "hidden_size": 4096, "num_attention_heads": 16,
                "head_dim": 256,
                "max_position_embeddings": 262144,
                "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                                    "rope_type": "default", "rope_theta": 10000000,
                                    "partial_rotary_factor": 0.25}}}),
            expect={"rotary_dim": 64, "mrope_section": [11, 11, 10], "mrope_interleaved": True})
    compare("text_config nesting with yarn",
            write("nested_yarn", {"model_type": "qwen2_5_vl", "text_config": {
                "hidden_size": 3584, "num_attention_heads": 28, "max_position_embeddings": 32768,
                "rope_theta": 1000000.0,
                "rope_scaling": {"type": "yarn", "factor": 4.0,
                                 "original_max_position_embeddings": 32768,
                                 "mrope_section": [16, 24, 24]}}}),
            expect={"mrope_section": [16, 24, 24]})
    compare("missing rope_theta falls back to HF's default_theta 10000",
            write("no_theta", {"hidden_size": 1024, "num_attention_heads": 8}),
            expect={"theta": 10000.0})
    compare("legacy type 'su' is longrope",
            write("su", {"hidden_size": 64, "num_attention_heads": 4,
                         "max_position_embeddings": 8192,
                         "original_max_position_embeddings": 2048,
                         "rope_scaling": {"type": "su",
                                          "short_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5],
                                          "long_factor": [2.0] * 8}}))
    phi_yarn = write("phi3_yarn", {
        "model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4,
        "max_position_embeddings": 8192, "original_max_position_embeddings": 2048,
        "rope_scaling": {"type": "yarn", "short_factor": [1.25] * 8, "long_factor": [3.0] * 8}})
    compare("phi3's legacy type 'yarn' is longrope", phi_yarn, 3000)
    compare("longrope with factor and attention_factor given",
            write("longrope_given", {
                "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 8192,
                "rope_scaling": {"rope_type": "longrope", "factor": 2.0, "attention_factor": 1.1,
                                 "original_max_position_embeddings": 4096,
                                 "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}}),
            8000, expect={"attention_scaling": 1.1})
    compare("llama3 through rope_parameters, original at the top level wins",
            write("llama3_top", {
                **llama, "original_max_position_embeddings": 2048,
                "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 999}}))
    r = run("freqs", "--theta", "10000", "--rotary-dim", "64", "--json")
    ok = r.returncode == 0
    if ok:
        got = json.loads(r.stdout)
        ok = (got["rope_type"] == "default"
              and rel_err(got["inv_freq"], 10000.0 ** (-np.arange(0, 64, 2) / 64)) <= RTOL)
    check(ok, "--theta 10000 --rotary-dim 64: plain RoPE")
    r = run("freqs", "--config", dyn)
    check(r.returncode == 0 and "rope_type          dynamic" in r.stdout
          and "attention_scaling" in r.stdout,
          "text output names the rope type and the scaling")


def bad_configs(tmp):
    def write(name, cfg):
        path = os.path.join(tmp, name + ".json")
        with open(path, "w") as f:
            f.write(cfg if isinstance(cfg, str) else json.dumps(cfg))
        return path

    base = {"hidden_size": 2048, "num_attention_heads": 16, "max_position_embeddings": 4096,
            "rope_theta": 10000.0}
    expect_error("negative factor",
                 write("neg", {**base, "rope_scaling": {"rope_type": "linear", "factor": -2}}),
                 ["neg.json: rope_scaling.factor (-2) must be > 0"])
    expect_error("factor is a string",
                 write("str", {**base, "rope_scaling": {"type": "yarn", "factor": "4"}}),
                 ["rope_scaling.factor", '"4"', "must be a number"])
    expect_error("linear without factor",
                 write("nofactor", {**base, "rope_scaling": {"rope_type": "linear"}}),
                 ["rope_scaling.factor is missing", "'linear'"])
    expect_error("longrope list of the wrong length",
                 write("short", {**base, "rope_scaling": {"type": "longrope",
                                                          "short_factor": [1.0, 1.0, 1.0],
                                                          "long_factor": [1.0] * 64}}),
                 ["rope_scaling.short_factor has 3 entries", "rotary_dim/2 = 64"])
    expect_error("longrope without long_factor",
                 write("nolong",
                       {**base, "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 64}}),
                 ["rope_scaling.long_factor is missing"])
    expect_error("unknown rope_type",
                 write("magic", {**base, "rope_scaling": {"rope_type": "magic", "factor": 2}}),
                 ["rope_scaling.rope_type", "'magic'", "not one of"])
    expect_error("head_dim and hidden_size missing", write("nodim", {"num_attention_heads": 16}),
                 ["head_dim is missing", "hidden_size"])
    expect_error("negative rope_theta", write("negtheta", {**base, "rope_theta": -1}),
                 ["rope_theta (-1) must be finite and > 0"])
    expect_error("partial_rotary_factor 1.5", write("prf", {**base, "partial_rotary_factor": 1.5}),
                 ["partial_rotary_factor (1.5) must be in (0, 1]"])
    expect_error("odd rotary_dim",
                 write("odd", {**base, "head_dim": 80, "partial_rotary_factor": 0.4125}),
                 ["rotary_dim (33)", "must be even"])
    expect_error("dynamic without max_position_embeddings",
                 write("dyn_nomax", {"hidden_size": 2048, "num_attention_heads": 16,
                                     "rope_scaling": {"type": "dynamic", "factor": 2.0}}),
                 ["max_position_embeddings is missing", "'dynamic'"])
    expect_error("llama3 without low_freq_factor",
                 write("llama3_nolow", {**base, "rope_scaling": {
                     "rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}}),
                 ["rope_scaling.low_freq_factor is missing"])
    expect_error("llama3 high_freq_factor <= low_freq_factor",
                 write("llama3_order", {**base, "rope_scaling": {
                     "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                     "high_freq_factor": 1.0}}),
                 ["rope_scaling.high_freq_factor (1) must be > rope_scaling.low_freq_factor (4)"])
    expect_error("yarn beta_fast < beta_slow",
                 write("beta", {**base, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                         "beta_fast": 1, "beta_slow": 8}}),
                 ["rope_scaling.beta_fast (1) must be >= rope_scaling.beta_slow (8)"])
    expect_error("mrope_section not summing to rotary_dim/2",
                 write("mrope",
                       {**base, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 16]}}),
                 ["rope_scaling.mrope_section ([16, 24, 16])", "rotary_dim/2 (64)"])
    expect_error("text_config's negative factor names text_config",
                 write("nested_neg", {"text_config": {
                     **base, "rope_scaling": {"type": "linear", "factor": -1}}}),
                 ["text_config.rope_scaling.factor (-1) must be > 0"])
    expect_error("per-layer-type rope_parameters",
                 write("layers", {**base, "rope_parameters": {
                     "full_attention": {"rope_type": "default"},
                     "sliding_attention": {"rope_type": "default"}}}),
                 ["rope_parameters holds per-layer-type parameters"])
    expect_error("invalid JSON", write("broken", '{"rope_theta": 1e4,'),
                 ["broken.json: invalid JSON"])
    expect_error("missing file", os.path.join(tmp, "absent.json"),
                 ["absent.json: cannot be opened"])
    expect_error("negative --seq-len", write("ok", base),
                 ["--seq-len: '-1' is not an integer in [0, 9223372036854775807]"],
                 "--seq-len", "-1")


def main():
    model_configs()
    with tempfile.TemporaryDirectory() as tmp:
        synthetic_configs(tmp)
        bad_configs(tmp)
    print(f"{COUNTS['passed']} passed, {COUNTS['failed']} failed")
    sys.exit(1 if COUNTS["failed"] else 0)


if __name__ == "__main__":
    main()
