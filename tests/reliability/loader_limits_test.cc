// The loaders of untrusted files cap what a file's lengths and counts can make them allocate, and
// read numbers without silent truncation or undefined behaviour:
//
//   - safetensors: the header is read without a JSON DOM, so hostile nesting or long arrays cost
//     no more than the header's own size; the tensor count limit applies while parsing; byte
//     counts must match the data present before anything is allocated (tests/runtime covers the
//     rest of the format's checks).
//   - quant state: a document may nest at most 16 levels and hold at most a model-derived number
//     of JSON values; integers must fit their field, floats must be finite and within float's
//     range; parameters and statistics must be ones an observer of that spec can produce, with
//     per-channel and histogram arrays no longer than the model's observer allows.
//
// Peak-RSS checks run outside AddressSanitizer only (its shadow memory and quarantine distort RSS).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "dbrq.h"
#include "tests/test_util.h"
#include "tools/fuzz/fuzz_targets.h"

namespace dbrq {
namespace {

using json = nlohmann::json;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderAsan = true;
#else
constexpr bool kUnderAsan = false;
#endif

// Peak RSS since the last reset_peak_rss(), in MB; -1 when /proc does not provide it.
int64_t peak_rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10) / 1024;
  }
  return -1;
}

bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return f.good();
}

// Runs `fn` and expects the process's peak RSS to grow by less than `limit_mb` over `baseline_mb`
// (the memory the test itself holds, e.g. the input).
template <typename Fn>
void expect_peak_rss_below(int64_t limit_mb, Fn fn) {
  const bool measured = !kUnderAsan && reset_peak_rss() && peak_rss_mb() >= 0;
  const int64_t before = measured ? peak_rss_mb() : 0;
  fn();
  if (!measured) return;
  const int64_t grew = peak_rss_mb() - before;
  EXPECT_LT(grew, limit_mb) << "peak RSS grew by " << grew << " MB";
}

std::string make_file(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// ---- safetensors -----------------------------------------------------------------------------

TEST(SafetensorsLimits, HostileNestingCostsAFewTimesTheHeaderAtMost) {
  // 32 MB of '[' in the metadata: a json DOM would build 32 million nested arrays (about 2.4 GB)
  // before finding that the header never closes them. Reading it without a DOM peaks at a few
  // times the header (nlohmann's lexer keeps the run of '[' as its last token).
  const std::string file = make_file("{\"__metadata__\":" + std::string(32u << 20, '['));
  expect_peak_rss_below(5 * 32, [&] {
    try {
      parse_safetensors(file, "\"nested\"");
      ADD_FAILURE() << "parsed";
    } catch (const FileFormatError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("header is not valid JSON"), std::string::npos) << what.substr(0, 400);
      EXPECT_LT(what.size(), 1000u) << "the message quotes the whole run of '['";
    }
  });
  // Closed nesting under an entry's extra key is ignored like any extra key.
  const std::string deep = std::string(1u << 20, '[') + std::string(1u << 20, ']');
  const NamedTensors t = parse_safetensors(make_file(
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":" + deep + "}}", std::string(4, '\0')));
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].first, "a");
}

TEST(SafetensorsLimits, ALongShapeIsCountedNotStored) {
  std::string shape = "[";
  for (int i = 0; i < 4000000; ++i) shape += i == 0 ? "1" : ",1";
  shape += "]";
  const std::string file = make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[0,4]}}",
                                     std::string(4, '\0'));
  expect_peak_rss_below(64, [&] {
    EXPECT_THROW_MSG(parse_safetensors(file), FileFormatError, "entry \"a\" has 4000000 dims; at most 8 are supported");
  });
}

TEST(SafetensorsLimits, TheTensorCountLimitAppliesWhileParsing) {
  std::string header = "{";
  for (int i = 0; i < 200000; ++i) header += (i == 0 ? "\"t" : ",\"t") + std::to_string(i) + "\":{}";
  header += "}";
  SafetensorsLimits limits;
  limits.max_tensors = 10;
  EXPECT_THROW_MSG(parse_safetensors(make_file(header), "f", limits), FileFormatError,
                   "header lists more than 10 tensors");
  // The same name twice is one tensor (the later entry wins, as in a JSON object).
  const std::string twice = make_file(
      "{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},"
      "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
      "\x05\x06");
  const NamedTensors t = parse_safetensors(twice);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].second.to_vector<int>(), (std::vector<int>{5, 6}));
  limits.max_tensors = 1;
  EXPECT_EQ(parse_safetensors(twice, "f", limits).size(), 1u);
}

TEST(SafetensorsLimits, MetadataIsTheStringValuesOfTheMetadataObject) {
  const std::string path = temp_path("metadata.safetensors");
  {
    std::ofstream f(path, std::ios::binary);
    f << make_file(
        "{\"__metadata__\":{\"a\":\"1\",\"b\":{\"x\":\"y\"},\"c\":\"3\",\"a\":\"2\",\"d\":5,\"e\":[\"z\"]},"
        "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"meta\":{\"f\":\"g\"}}}",
        "x");
  }
  const std::map<std::string, std::string> want = {{"a", "2"}, {"c", "3"}};
  EXPECT_EQ(load_safetensors_metadata(path), want);
  EXPECT_EQ(load_safetensors(path).size(), 1u);
  // A file written by dbrq reads its metadata back.
  save_safetensors(path, {{"w", ones({2})}}, {{"format", "pt"}, {"note", "{\"not\": \"json\"}"}});
  const std::map<std::string, std::string> saved = {{"format", "pt"}, {"note", "{\"not\": \"json\"}"}};
  EXPECT_EQ(load_safetensors_metadata(path), saved);
}

TEST(SafetensorsLimits, ByteCountsMustMatchTheDataBeforeAllocating) {
  // 2^40 elements claimed for 4 bytes of data: rejected without a 4 TB allocation.
  EXPECT_THROW_MSG(parse_safetensors(make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1048576,1048576],"
                                               "\"data_offsets\":[0,4]}}",
                                               std::string(4, '\0'))),
                   FileFormatError, "has a shape whose size overflows");
  SafetensorsLimits unlimited;
  unlimited.max_total_bytes = ~uint64_t{0};
  EXPECT_THROW_MSG(parse_safetensors(make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1048576,1048576],"
                                               "\"data_offsets\":[0,4]}}",
                                               std::string(4, '\0')),
                                     "f", unlimited),
                   FileFormatError, "has 4 bytes of data but dtype F32 and shape [1048576, 1048576] need 4398046511104");
}

// ---- quant state -----------------------------------------------------------------------------

class QuantStateLimits : public ::testing::Test {
 protected:
  // The document of a calibrated TinyNet (see tools/fuzz/fuzz_targets.h), as JSON to edit.
  static json document(int mapping, bool stats) { return json::parse(fuzz::tiny_quant_state(mapping, stats)); }

  // The first observer slot whose observer kind is `kind`.
  static json& slot_of_kind(json& doc, const std::string& kind) {
    for (json& s : doc["observers"]) {
      if (s.contains("observer") && s["observer"]["kind"] == kind) return s;
    }
    ADD_FAILURE() << "no " << kind << " observer";
    return doc["observers"][0];
  }

  // Loads `text` into a TinyNet prepared with `mapping`.
  static void load(int mapping, const std::string& text) {
    auto m = fuzz::prepared_tiny_net(mapping);
    quant_state_from_json(model_quant_state(*m), m->type_name(), text, "\"edited\"");
  }
  // An edited document, its record checks recomputed (the edits test what lies behind them).
  static void load(int mapping, const json& doc) { load(mapping, reseal_quant_state(doc.dump(1))); }
};

TEST_F(QuantStateLimits, TheUneditedDocumentsLoad) {
  for (int mapping = 0; mapping < fuzz::kNumMappings; ++mapping) {
    for (bool stats : {false, true}) {
      SCOPED_TRACE(mapping * 2 + stats);
      load(mapping, document(mapping, stats));
    }
  }
}

TEST_F(QuantStateLimits, IntegersThatDoNotFitAreRejectedNotTruncated) {
  // get<int>() would read 4294967297 as 1 and accept the document as version 1.
  json doc = document(1, false);
  doc["version"] = 4294967297ull;
  EXPECT_THROW_MSG(load(1, doc), FileFormatError, "has an invalid value: version 4294967297 is out of range");
  // ... and a zero point of 2^32 + 134 as 134.
  doc = document(1, false);
  slot_of_kind(doc, "MinMax")["qparams"]["zero_points"][0] = 4294967296ll + 134;
  EXPECT_THROW_MSG(load(1, doc), FileFormatError, "zero point 4294967430 is out of range");
  doc = document(1, false);
  doc["observers"][0]["root"] = -2147483649ll;
  EXPECT_THROW_MSG(load(1, doc), FileFormatError, "root -2147483649 is out of range");
  // A float where an integer belongs: converting 1e300 to int is undefined behaviour.
  doc = document(1, false);
  doc["modules"][0]["seen_ops"][0]["output_observer"] = 1e300;
  EXPECT_THROW_MSG(load(1, doc), FileFormatError, "is malformed: output_observer must be an integer, got 1e+300");
  doc = document(1, false);
  doc["version"] = 1.0;
  EXPECT_THROW_MSG(load(1, doc), FileFormatError, "is malformed: version must be an integer");
  // The optional record and slot marks are booleans when present.
  doc = document(1, false);
  doc["modules"][0]["seen_ops"][0]["broadcasts"] = 1;
  EXPECT_THROW_MSG(load(1, doc), FileFormatError, "is malformed: broadcasts must be true or false, got 1");
  doc = document(1, false);
  slot_of_kind(doc, "MinMax")["infinities"] = "yes";
  EXPECT_THROW_MSG(load(1, doc), FileFormatError, "is malformed: infinities must be true or false, got \"yes\"");
}

TEST_F(QuantStateLimits, FloatsMustBeFiniteAndWithinFloatRange) {
  json doc = document(1, false);
  slot_of_kind(doc, "MinMax")["qparams"]["scales"][0] = 1e39;
  EXPECT_THROW_MSG(load(1, doc), FileFormatError, "scale 1e+39 is outside the range of float");
  // JSON has no infinity; a number too large for a double is not valid JSON.
  std::string text = document(1, false).dump(1);
  const std::string key = "\"fixed_scale\": 0.0";
  text.replace(text.find(key), key.size(), "\"fixed_scale\": 1e999");
  EXPECT_THROW_MSG(load(1, text), FileFormatError, "is not valid JSON: [json.exception.out_of_range.406] number overflow");
}

TEST_F(QuantStateLimits, ParametersMustBeOnesTheObserverCanProduce) {
  json doc = document(1, false);
  slot_of_kind(doc, "MinMax")["qparams"]["scales"][0] = 1e-30;
  EXPECT_THROW_MSG(load(1, doc), FileFormatError, "has scale 1e-30, below the smallest scale an observer computes");
  doc = document(1, false);
  slot_of_kind(doc, "MinMax")["qparams"]["axis"] = 0;
  EXPECT_THROW_MSG(load(1, doc), FileFormatError, "is per-tensor (per_tensor_affine), its parameters need axis -1, got 0");
  doc = document(1, false);
  json& fixed = slot_of_kind(doc, "FixedQParams");
  fixed["qparams"]["scales"][0] = 0.5;
  EXPECT_THROW_MSG(load(1, doc), FileFormatError, "is FixedQParams(scale=0.00390625, zero_point=0) but the file gives scale 0.5");
  doc = document(1, false);
  slot_of_kind(doc, "MinMax")["qparams"]["zero_points"] = json::array({300});
  EXPECT_THROW_MSG(load(1, doc), FileFormatError, "has zero point 300, outside u8's range [0, 255]");
}

TEST_F(QuantStateLimits, StatisticsMustBeOnesTheObserverCanProduce) {
  auto edited = [](const std::function<void(json&)>& edit) {
    json doc = document(3, true);
    edit(slot_of_kind(doc, "Histogram")["stats"]);
    return doc;
  };
  EXPECT_THROW_MSG(load(3, edited([](json& s) { s["fields"]["min"][0] = 5.0; s["fields"]["max"][0] = 1.0; })),
                   FileFormatError, "[min, max] = [5, 1] is not an ordered range of finite width");
  EXPECT_THROW_MSG(load(3, edited([](json& s) { s["fields"]["min"][0] = -3e38; s["fields"]["max"][0] = 3e38; })),
                   FileFormatError, "is not an ordered range of finite width");
  EXPECT_THROW_MSG(load(3, edited([](json& s) { s["fields"]["histogram"][3] = -1.0; })), FileFormatError,
                   "statistics field \"histogram\" has a negative count -1");
  EXPECT_THROW_MSG(load(3, edited([](json& s) { s["num_batches"] = -1; })), FileFormatError,
                   "statistics have negative counters");
  EXPECT_THROW_MSG(load(3, edited([](json& s) { s["mask_count"] = -2; })), FileFormatError,
                   "statistics have negative counters");
  EXPECT_THROW_MSG(load(3, edited([](json& s) { s["fields"]["histogram"] = std::vector<double>(500, 1.0); })),
                   FileFormatError, "statistics field \"histogram\" has 500 values; this model's observer has at most 32");
  EXPECT_THROW_MSG(load(3, edited([](json& s) { s["fields"]["min"][0] = nullptr; })), FileFormatError,
                   "is malformed: an observer statistic must be a number, got null");
}

TEST_F(QuantStateLimits, DocumentsAreBoundedByWhatTheModelHas) {
  json doc = document(0, false);
  doc["padding"] = std::vector<int>(8000000, 0);
  EXPECT_THROW_MSG(load(0, doc), FileFormatError, "JSON values, more than any document for this model");
  // 16 MB of '[': a DOM would be built 16 million levels deep (about 1.2 GB) before the document
  // turned out to be unterminated.
  std::string text = document(0, false).dump(1);
  text.insert(text.rfind('}'), ", \"x\": " + std::string(16u << 20, '['));
  expect_peak_rss_below(64, [&] {
    EXPECT_THROW_MSG(load(0, text), FileFormatError, "nests deeper than 16 levels");
  });
}

TEST_F(QuantStateLimits, ObserversThatSawNothingRoundTrip) {
  // Saved with statistics before any calibration: observers that saw nothing are written without
  // statistics (their empty range used to be written as null and made the document unreadable).
  auto m = fuzz::prepared_tiny_net(0);
  SaveQuantStateOptions with_stats;
  with_stats.include_observer_stats = true;
  const std::string text = quant_state_to_json(model_quant_state(*m), m->type_name(), with_stats);
  const json doc = json::parse(text);
  int saved_stats = 0;
  for (const json& s : doc["observers"]) {
    if (!s.contains("stats")) continue;
    ++saved_stats;
    EXPECT_EQ(s["stats"].dump().find("null"), std::string::npos) << s.dump();
  }
  EXPECT_LT(saved_stats, static_cast<int>(doc["observers"].size()));
  load(0, text);
  auto fresh = fuzz::prepared_tiny_net(0);
  quant_state_from_json(model_quant_state(*fresh), fresh->type_name(), text);
  EXPECT_THROW(convert(*fresh), NotCalibratedError);
}

}  // namespace
}  // namespace dbrq
