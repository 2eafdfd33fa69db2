// Writes the seed corpora of the fuzz targets: valid files produced by dbrq, plus a few malformed
// ones, into <out>/safetensors and <out>/quant_state. Seeds are kept small (a few KB): libFuzzer's
// default -max_len is the largest seed, and large seeds slow every mutation down.
//
//   bazel run //tools/fuzz:make_seeds -- $PWD/tools/fuzz/corpus
//
// //tests/reliability:fuzz_corpus_test checks what each seed is expected to do (accepted, or the
// error a malformed one raises); keep it in step when adding seeds here.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tools/fuzz/fuzz_targets.h"

namespace {

void write(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f.good()) {
    std::fprintf(stderr, "cannot write %s\n", p.c_str());
    std::exit(1);
  }
}

// A safetensors file with a hand-written header (for malformed seeds).
std::string raw_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string replace_first(std::string s, const std::string& from, const std::string& to) {
  const size_t p = s.find(from);
  if (p != std::string::npos) s.replace(p, from.size(), to);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <corpus dir>\n");
    return 2;
  }
  const std::filesystem::path root = argv[1];
  const auto st = root / "safetensors";
  const auto qs = root / "quant_state";
  std::filesystem::create_directories(st);
  std::filesystem::create_directories(qs);
  using dbrq::DType;

  // ---- safetensors: valid ----
  auto tiny = dbrq::fuzz::make_tiny_net();
  write(st / "tiny_net.safetensors", dbrq::serialize_safetensors(tiny->state_dict()));
  write(st / "tiny_net_metadata.safetensors", dbrq::serialize_safetensors(tiny->state_dict(), {{"format", "pt"}}));
  dbrq::NamedTensors every = {
      {"f32", dbrq::randn({2, 3}, 1)},
      {"bf16", dbrq::randn({3}, 2).to(DType::kBF16)},
      {"s64", dbrq::arange(4, DType::kS64)},
      {"s32", dbrq::arange(5, DType::kS32)},
      {"u8", dbrq::arange(6, DType::kU8)},
      {"s8", dbrq::arange(3, DType::kS8)},
      {"empty", dbrq::zeros({0, 4})},
      {"scalar", dbrq::full({}, 2.5)},
  };
  write(st / "every_dtype.safetensors", dbrq::serialize_safetensors(every, {{"note", "seed"}}));
  // F16 is read-only in dbrq: two halves (1.0, -2.0) written by hand.
  write(st / "f16.safetensors",
        raw_file(R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", std::string("\x00\x3c\x00\xc0", 4)));

  // ---- safetensors: malformed ----
  const std::string good = dbrq::serialize_safetensors(tiny->state_dict());
  write(st / "bad_truncated.safetensors", good.substr(0, good.size() / 2));
  write(st / "bad_header_length.safetensors", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10));
  write(st / "bad_json.safetensors", raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4])", "abcd"));
  write(st / "bad_overlap.safetensors",
        raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 std::string(8, '\0')));
  write(st / "bad_shape.safetensors",
        raw_file(R"({"a":{"dtype":"F32","shape":[-1,4294967296,4294967296],"data_offsets":[0,4]}})", std::string(4, '\0')));
  write(st / "bad_dtype.safetensors", raw_file(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')));

  // ---- quant state: valid ----
  // With statistics too, except mapping 0's (four 2048-bin histograms would make a 130 KB seed;
  // mapping 3 carries 32-bin ones) and mapping 2's (dynamic: no observers, so no statistics).
  for (int which = 0; which < dbrq::fuzz::kNumMappings; ++which) {
    write(qs / ("tiny_mapping" + std::to_string(which) + ".json"), dbrq::fuzz::tiny_quant_state(which, false));
    const std::string with_stats = dbrq::fuzz::tiny_quant_state(which, true);
    if (which != 0 && with_stats.find("\"stats\"") != std::string::npos) {
      write(qs / ("tiny_mapping" + std::to_string(which) + "_stats.json"), with_stats);
    }
  }
  // ---- quant state: malformed ----
  const std::string doc = dbrq::fuzz::tiny_quant_state(3, true);
  write(qs / "bad_truncated.json", doc.substr(0, doc.size() / 3));
  const std::string version = "\"version\": " + std::to_string(dbrq::kQuantStateVersion);
  if (doc.find(version) == std::string::npos) {
    std::fprintf(stderr, "the quant-state document has no %s\n", version.c_str());
    std::exit(1);
  }
  write(qs / "bad_version.json", replace_first(doc, version, "\"version\": 7"));
  write(qs / "bad_model_type.json", replace_first(doc, "\"model_type\": \"TinyNet\"", "\"model_type\": \"ResNet18\""));
  write(qs / "bad_format.json", R"({"format": "something else", "version": 1})");
  write(qs / "bad_not_object.json", "[1, 2, 3]");
  std::printf("seeds written to %s\n", root.c_str());
  return 0;
}
