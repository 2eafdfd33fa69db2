// safetensors I/O tests: round trips for every dtype (0-D, empty and non-contiguous tensors,
// metadata); reading files written by PyTorch (tests/runtime/data, made by
// make_safetensors_fixture.py); malformed input raising FileFormatError with a message naming the
// problem and never crashing; IOError for unreadable and unwritable paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using testing::expect_close;
using testing::expect_equal;

constexpr char kDtypesFile[] = "tests/runtime/data/dtypes.safetensors";
constexpr char kModuleFile[] = "tests/runtime/data/torch_module.safetensors";

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// The 8-byte little-endian header length, the header and the data.
std::string make_file(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string length_prefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

const Tensor& find(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  static const Tensor kUndefined;
  ADD_FAILURE() << "no tensor named " << name;
  return kUndefined;
}

std::vector<std::string> names_of(const NamedTensors& tensors) {
  std::vector<std::string> out;
  for (const auto& [n, t] : tensors) out.push_back(n);
  return out;
}

// Values of any dtype (bf16 included) as doubles, in logical order.
std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.value_at(i));
  return out;
}

void expect_same_tensor(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  EXPECT_EQ(actual.dtype(), expected.dtype()) << what;
  EXPECT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(actual.is_contiguous()) << what;
  EXPECT_FALSE(actual.is_quantized()) << what;
  EXPECT_EQ(values(actual), values(expected)) << what;
}

NamedTensors every_dtype() {
  return {
      {"f32", from_vector<float>({-1.5f, 0.f, 3.25f, 1e-30f, -INFINITY, 7.f}, {2, 3})},
      {"s8", from_vector<int8_t>({-128, -1, 0, 127})},
      {"u8", from_vector<uint8_t>({0, 1, 200, 255}, {2, 2})},
      {"s32", from_vector<int32_t>({std::numeric_limits<int32_t>::min(), 0, std::numeric_limits<int32_t>::max()})},
      {"s64", from_vector<int64_t>({std::numeric_limits<int64_t>::min(), -1, std::numeric_limits<int64_t>::max()})},
      {"bf16", from_vector<float>({1.f, -3.140625f, 256.f, 0.5f}, {2, 1, 2}).to(DType::kBF16)},
      {"scalar", full(IntArrayRef{}, 2.5)},
      {"scalar_s64", full(IntArrayRef{}, 42.0, DType::kS64)},
      {"empty", zeros({0, 4})},
      {"empty_u8", zeros({2, 0, 3}, DType::kU8)},
  };
}

// ---------------------------------------------------------------------------------------------
// round trips

TEST(SafetensorsRoundTrip, EveryDtypeInMemory) {
  const NamedTensors tensors = every_dtype();
  const std::string bytes = serialize_safetensors(tensors);
  // Header padded so the data starts 8-byte aligned.
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  const NamedTensors loaded = parse_safetensors(bytes);
  EXPECT_EQ(names_of(loaded), names_of(tensors));  // file (data) order is the given order
  for (const auto& [n, t] : tensors) expect_same_tensor(find(loaded, n), t, n);
  EXPECT_EQ(find(loaded, "scalar").dim(), 0);
  EXPECT_EQ(find(loaded, "bf16").dtype(), DType::kBF16);
}

TEST(SafetensorsRoundTrip, EveryDtypeThroughAFile) {
  const std::string path = temp_path("every_dtype.safetensors");
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "quotes \" and \\ and \xc3\xa9"}};
  save_safetensors(path, every_dtype(), metadata);
  const NamedTensors loaded = load_safetensors(path);
  for (const auto& [n, t] : every_dtype()) expect_same_tensor(find(loaded, n), t, n);
  EXPECT_EQ(load_safetensors_metadata(path), metadata);
  // Saving again overwrites.
  save_safetensors(path, {{"only", ones({1})}});
  EXPECT_EQ(names_of(load_safetensors(path)), std::vector<std::string>{"only"});
  EXPECT_TRUE(load_safetensors_metadata(path).empty());
}

TEST(SafetensorsRoundTrip, EmptyTensorsAnywhereInTheOrder) {
  // An empty tensor has data_offsets [k, k], the same begin as the tensor after it.
  const NamedTensors tensors = {{"z_empty", zeros({0})},
                                {"a", from_vector<float>({1, 2})},
                                {"m_empty", zeros({3, 0}, DType::kS32)},
                                {"b", from_vector<int32_t>({5})},
                                {"y_empty", zeros({0}, DType::kS8)}};
  const NamedTensors loaded = parse_safetensors(serialize_safetensors(tensors));
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [n, t] : tensors) expect_same_tensor(find(loaded, n), t, n);
  EXPECT_TRUE(parse_safetensors(serialize_safetensors({})).empty());
}

TEST(SafetensorsRoundTrip, NonContiguousInputsAreSavedContiguous) {
  Tensor base = arange(24).reshape({2, 3, 4});
  const NamedTensors tensors = {
      {"transposed", base.transpose(0, 2)},
      {"sliced", base.slice(2, 1, 4, 2)},  // storage offset and a step
      {"selected", base.select(1, 2)},
      {"channels_last", randn({2, 3, 4, 5}, 1).contiguous(MemoryFormat::kChannelsLast)},
      {"bf16_t", base.to(DType::kBF16).transpose(0, 1)},
      {"s8_t", base.to(DType::kS8).permute({2, 0, 1})},
  };
  ASSERT_FALSE(tensors[0].second.is_contiguous());
  ASSERT_FALSE(tensors[3].second.is_contiguous());
  const NamedTensors loaded = parse_safetensors(serialize_safetensors(tensors));
  for (const auto& [n, t] : tensors) expect_same_tensor(find(loaded, n), t, n);
  EXPECT_EQ(find(loaded, "sliced").to_vector<float>(), (std::vector<float>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));
}

TEST(SafetensorsRoundTrip, QuantizedTensorsKeepRawValuesAndDropParams) {
  Tensor q = quantize_per_tensor(from_vector<float>({0.f, 0.5f, 1.f}), 0.5f, 10, DType::kU8);
  const NamedTensors loaded = parse_safetensors(serialize_safetensors({{"q", q}}));
  const Tensor& t = find(loaded, "q");
  EXPECT_EQ(t.dtype(), DType::kU8);
  EXPECT_FALSE(t.is_quantized());
  EXPECT_EQ(t.to_vector<int>(), (std::vector<int>{10, 11, 12}));
}

TEST(SafetensorsRoundTrip, ModelStateDict) {
  auto model = std::make_shared<nn::SequentialImpl>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2dImpl>(3, 4, 3), std::make_shared<nn::BatchNorm2dImpl>(4), std::make_shared<nn::ReLUImpl>()});
  const std::string path = temp_path("model.safetensors");
  save_safetensors(path, model->state_dict());
  auto other = std::make_shared<nn::SequentialImpl>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2dImpl>(3, 4, 3), std::make_shared<nn::BatchNorm2dImpl>(4), std::make_shared<nn::ReLUImpl>()});
  EXPECT_TRUE(other->load_state_dict(load_safetensors(path)).ok());
  const NamedTensors a = model->state_dict(), b = other->state_dict();
  ASSERT_EQ(names_of(a), names_of(b));
  for (size_t i = 0; i < a.size(); ++i) expect_equal(b[i].second, a[i].second, a[i].first);
}

TEST(SafetensorsSerialize, InvalidInputsThrowValueError) {
  EXPECT_THROW_MSG(serialize_safetensors({{"u", Tensor()}}), ValueError, "tensor \"u\" is undefined");
  EXPECT_THROW_MSG(serialize_safetensors({{"__metadata__", ones({1})}}), ValueError, "\"__metadata__\" is reserved");
  EXPECT_THROW_MSG(serialize_safetensors({{"a", ones({1})}, {"a", ones({2})}}), ValueError,
                   "duplicate tensor name \"a\"");
}

// ---------------------------------------------------------------------------------------------
// files written by PyTorch

TEST(SafetensorsTorch, ReadsEveryDtype) {
  const NamedTensors t = load_safetensors(kDtypesFile);
  // File order (by data offset), not the header's alphabetical order.
  EXPECT_EQ(names_of(t), (std::vector<std::string>{"f32", "f16", "bf16", "i64", "i32", "u8", "i8", "scalar",
                                                   "transposed", "empty"}));
  const Tensor& f32 = find(t, "f32");
  EXPECT_EQ(f32.dtype(), DType::kF32);
  EXPECT_EQ(f32.sizes(), (IntArrayRef{2, 3}));
  EXPECT_EQ(f32.to_vector<float>(), (std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f}));

  const Tensor& f16 = find(t, "f16");  // converted to f32
  EXPECT_EQ(f16.dtype(), DType::kF32);
  EXPECT_EQ(f16.to_vector<float>(),
            (std::vector<float>{1.5f, -2.0f, 65504.0f, std::ldexp(1.f, -14), std::ldexp(1.f, -24), INFINITY}));

  const Tensor& bf16 = find(t, "bf16");  // kept as bf16
  EXPECT_EQ(bf16.dtype(), DType::kBF16);
  EXPECT_EQ(values(bf16), (std::vector<double>{1.0, -3.140625, 256.0}));
  EXPECT_EQ(bf16.to(DType::kF32).to_vector<float>(), (std::vector<float>{1.0f, -3.140625f, 256.0f}));

  const Tensor& i64 = find(t, "i64");
  EXPECT_EQ(i64.dtype(), DType::kS64);
  EXPECT_EQ(i64.sizes(), (IntArrayRef{2, 2}));
  EXPECT_EQ(i64.to_vector<int64_t>(), (std::vector<int64_t>{-(int64_t{1} << 40), 0, 1, int64_t{1} << 62}));
  EXPECT_EQ(find(t, "i32").dtype(), DType::kS32);
  EXPECT_EQ(find(t, "i32").to_vector<int32_t>(),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), 0, std::numeric_limits<int32_t>::max()}));
  EXPECT_EQ(find(t, "u8").dtype(), DType::kU8);
  EXPECT_EQ(find(t, "u8").to_vector<int>(), (std::vector<int>{0, 1, 128, 255}));
  EXPECT_EQ(find(t, "i8").dtype(), DType::kS8);
  EXPECT_EQ(find(t, "i8").to_vector<int>(), (std::vector<int>{-128, -1, 0, 127}));
  EXPECT_EQ(find(t, "scalar").dim(), 0);
  EXPECT_EQ(find(t, "scalar").item<float>(), 3.25f);
  EXPECT_EQ(find(t, "transposed").sizes(), (IntArrayRef{3, 2}));
  EXPECT_EQ(find(t, "transposed").to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(find(t, "empty").sizes(), (IntArrayRef{0, 3}));
}

TEST(SafetensorsTorch, ReadsMetadata) {
  const auto md = load_safetensors_metadata(kDtypesFile);
  EXPECT_EQ(md, (std::map<std::string, std::string>{{"format", "pt"}, {"producer", "make_safetensors_fixture.py"}}));
}

// A torch state_dict (PyTorch key names, an F16 weight, an I64 num_batches_tracked) loads into the
// equivalent dbrq model, which then reproduces torch's output.
TEST(SafetensorsTorch, LoadsAModuleStateDict) {
  struct Tiny : nn::CallableModule<Tiny> {
    Tiny() {
      conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(2, 4, 3, 1, 1));
      bn = register_module("bn", std::make_shared<nn::BatchNorm2dImpl>(4));
      fc = register_module("fc", std::make_shared<nn::LinearImpl>(36, 2));
    }
    Tensor forward(const Tensor& x) { return (*fc)(flatten(relu((*bn)((*conv)(x))), 1)); }
    std::shared_ptr<nn::Conv2dImpl> conv;
    std::shared_ptr<nn::BatchNorm2dImpl> bn;
    std::shared_ptr<nn::LinearImpl> fc;
  };
  NamedTensors file = load_safetensors(kModuleFile);
  EXPECT_EQ(find(file, "fc.weight").dtype(), DType::kF32);  // F16 in the file
  EXPECT_EQ(find(file, "bn.num_batches_tracked").dtype(), DType::kS64);
  NamedTensors state;
  for (const auto& [n, t] : file) {
    if (n != "input" && n != "expected") state.emplace_back(n, t);
  }
  auto model = std::make_shared<Tiny>();
  model->eval();
  nn::LoadReport r = model->load_state_dict(state);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(model->bn->num_batches_tracked.item<int64_t>(), 7);
  expect_close((*model)(find(file, "input")), find(file, "expected"), 1e-5, "torch output");
}

// ---------------------------------------------------------------------------------------------
// malformed input

struct Malformed {
  const char* what;
  std::string bytes;
  const char* message;
};

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

TEST(SafetensorsMalformed, EachProblemRaisesFileFormatError) {
  const std::string four(4, '\0'), eight(8, '\0');
  const std::vector<Malformed> cases = {
      {"empty input", "", "file is 0 bytes, shorter than the 8-byte header length"},
      {"7 bytes", std::string(7, '\x01'), "file is 7 bytes, shorter than the 8-byte header length"},
      {"header past end", length_prefix(100) + "{}", "header length 100 runs past the end of the file (10 bytes)"},
      {"header length 2^64-1", length_prefix(~uint64_t{0}) + "{}", "exceeds the limit of"},
      {"header length over the limit", length_prefix(200ull << 20) + "{}",
       "header length 209715200 exceeds the limit of 104857600 bytes"},
      {"not JSON", make_file("{not json"), "header is not valid JSON"},
      {"truncated JSON", make_file("{\"a\":{\"dtype\":\"F32\""), "header is not valid JSON"},
      {"invalid UTF-8", make_file("{\"\xff\xfe\":1}"), "header is not valid JSON"},
      {"empty header", make_file(""), "header is not valid JSON"},
      {"header is an array", make_file("[1,2]"), "header must be a JSON object"},
      {"header is a string", make_file("\"hi\""), "header must be a JSON object"},
      {"header is null", make_file("null"), "header must be a JSON object"},
      {"entry not an object", make_file("{\"a\":5}"), "entry \"a\" must be an object"},
      {"no dtype", make_file("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", four),
       "entry \"a\" has no string dtype"},
      {"dtype not a string", make_file("{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", four),
       "entry \"a\" has no string dtype"},
      {"no shape", make_file("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", four),
       "entry \"a\" has no shape array"},
      {"shape not an array", make_file("{" + entry("a", "F32", "4", "[0,4]") + "}", four),
       "entry \"a\" has no shape array"},
      {"no data_offsets", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", four),
       "entry \"a\" needs data_offsets [begin, end]"},
      {"three data_offsets", make_file("{" + entry("a", "F32", "[1]", "[0,4,8]") + "}", four),
       "entry \"a\" needs data_offsets [begin, end]"},
      {"unknown dtype", make_file("{" + entry("a", "F64", "[1]", "[0,8]") + "}", eight),
       "entry \"a\" has unsupported dtype \"F64\""},
      {"lower-case dtype", make_file("{" + entry("a", "f32", "[1]", "[0,4]") + "}", four),
       "has unsupported dtype \"f32\""},
      {"negative shape", make_file("{" + entry("a", "F32", "[-1]", "[0,4]") + "}", four),
       "entry \"a\" has a shape entry that is not a non-negative integer"},
      {"fractional shape", make_file("{" + entry("a", "F32", "[1.5]", "[0,4]") + "}", four),
       "has a shape entry that is not a non-negative integer"},
      {"string shape", make_file("{" + entry("a", "F32", "[\"1\"]", "[0,4]") + "}", four),
       "has a shape entry that is not a non-negative integer"},
      {"too many dims", make_file("{" + entry("a", "F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]") + "}", four),
       "entry \"a\" has 9 dims; at most 8 are supported"},
      {"negative offset", make_file("{" + entry("a", "F32", "[1]", "[-4,0]") + "}", four),
       "entry \"a\" has data_offsets that are not non-negative integers"},
      {"fractional offset", make_file("{" + entry("a", "F32", "[1]", "[0,4.0]") + "}", four),
       "has data_offsets that are not non-negative integers"},
      {"truncated data", make_file("{" + entry("a", "F32", "[2]", "[0,8]") + "}", four),
       "entry \"a\" has data_offsets [0, 8] outside the data section of 4 bytes (file truncated?)"},
      {"begin after end", make_file("{" + entry("a", "F32", "[1]", "[4,0]") + "}", eight),
       "has data_offsets [4, 0] outside the data section"},
      {"offset near 2^64",
       make_file("{" + entry("a", "F32", "[1]", "[18446744073709551612,18446744073709551615]") + "}", four),
       "outside the data section of 4 bytes"},
      {"byte count too small", make_file("{" + entry("a", "F32", "[2]", "[0,4]") + "}", four),
       "entry \"a\" has 4 bytes of data but dtype F32 and shape [2] need 8"},
      {"byte count too large", make_file("{" + entry("a", "I8", "[2,2]", "[0,8]") + "}", eight),
       "has 8 bytes of data but dtype I8 and shape [2, 2] need 4"},
      {"f16 byte count", make_file("{" + entry("a", "F16", "[3]", "[0,8]") + "}", eight),
       "has 8 bytes of data but dtype F16 and shape [3] need 6"},
      {"overlapping entries",
       make_file("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[4,12]") + "}",
                 std::string(12, '\0')),
       "entries \"a\" and \"b\" overlap"},
      {"same offsets twice",
       make_file("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "I32", "[1]", "[0,4]") + "}", four),
       "overlap"},
      {"shape size overflows", make_file("{" + entry("a", "F32", "[4294967296,4294967296]", "[0,4]") + "}", four),
       "entry \"a\" has a shape whose size overflows"},
      {"shape size wraps to a small number",
       make_file("{" + entry("a", "U8", "[18446744073709551615,18446744073709551615]", "[0,1]") + "}", "x"),
       "has a shape whose size overflows"},
      {"huge dims beside a zero dim", make_file("{" + entry("a", "F32", "[0,4294967296,4294967296]", "[0,0]") + "}"),
       "has a shape whose size overflows"},
      {"dim past int64", make_file("{" + entry("a", "F32", "[0,9223372036854775808]", "[0,0]") + "}"),
       "has a shape whose size overflows"},
  };
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_THROW_MSG(parse_safetensors(c.bytes, "\"crafted\""), FileFormatError, c.message);
    EXPECT_THROW_MSG(parse_safetensors(c.bytes, "\"crafted\""), FileFormatError, "safetensors \"crafted\": ");
  }
}

TEST(SafetensorsMalformed, LimitsAreEnforced) {
  const std::string file = make_file(
      "{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[8,16]") + "}", std::string(16, '\0'));
  EXPECT_EQ(parse_safetensors(file).size(), 2u);
  SafetensorsLimits small_header;
  small_header.max_header_bytes = 16;
  EXPECT_THROW_MSG(parse_safetensors(file, "f", small_header), FileFormatError, "exceeds the limit of 16 bytes");
  SafetensorsLimits one_tensor;
  one_tensor.max_tensors = 1;
  EXPECT_THROW_MSG(parse_safetensors(file, "f", one_tensor), FileFormatError, "header lists more than 1 tensors");
  SafetensorsLimits few_bytes;
  few_bytes.max_total_bytes = 12;
  EXPECT_THROW_MSG(parse_safetensors(file, "f", few_bytes), FileFormatError, "tensors exceed the limit of 12 bytes");
  // A header length of 2^64 - 1 with no header limit must not wrap around.
  SafetensorsLimits unlimited;
  unlimited.max_header_bytes = ~uint64_t{0};
  EXPECT_THROW_MSG(parse_safetensors(length_prefix(~uint64_t{0}) + "{}", "f", unlimited), FileFormatError,
                   "runs past the end of the file");
}

TEST(SafetensorsMalformed, AcceptedOddities) {
  // Metadata is not a tensor; unknown top-level metadata shapes are ignored; trailing data is
  // allowed; entries may have extra keys.
  const std::string file = make_file(
      "{\"__metadata__\":{\"k\":\"v\"}," + std::string("\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2],"
                                                       "\"extra\":true}}"),
      std::string("\x07\x09zz", 4));
  const NamedTensors t = parse_safetensors(file);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].second.to_vector<int>(), (std::vector<int>{7, 9}));
  EXPECT_TRUE(parse_safetensors(make_file("{}")).empty());
  EXPECT_TRUE(parse_safetensors(make_file("{\"__metadata__\":{}}")).empty());
  // F16 specials.
  const uint16_t half[] = {0x7e00, 0xfc00, 0x8000, 0x0001, 0x03ff, 0x7bff};
  const NamedTensors h = parse_safetensors(
      make_file("{" + entry("h", "F16", "[6]", "[0,12]") + "}", std::string(reinterpret_cast<const char*>(half), 12)));
  const std::vector<float> v = h[0].second.to_vector<float>();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], -INFINITY);
  EXPECT_EQ(v[2], 0.f);
  EXPECT_TRUE(std::signbit(v[2]));
  EXPECT_EQ(v[3], std::ldexp(1.f, -24));
  EXPECT_EQ(v[4], 1023 * std::ldexp(1.f, -24));
  EXPECT_EQ(v[5], 65504.f);
}

TEST(SafetensorsMalformed, DeeplyNestedJsonDoesNotCrash) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_THROW_MSG(parse_safetensors(make_file(deep)), FileFormatError, "");
  const std::string deep_value = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_THROW_MSG(parse_safetensors(make_file(deep_value)), FileFormatError, "entry \"a\" must be an object");
  const std::string deep_metadata = "{\"__metadata__\":" + std::string(50000, '[') + std::string(50000, ']') + "}";
  EXPECT_TRUE(parse_safetensors(make_file(deep_metadata)).empty());
}

TEST(SafetensorsMalformed, EveryTruncationOfAValidFileIsRejectedCleanly) {
  const std::string valid = serialize_safetensors(every_dtype(), {{"format", "pt"}});
  ASSERT_EQ(parse_safetensors(valid).size(), every_dtype().size());
  for (size_t n = 0; n < valid.size(); ++n) {
    SCOPED_TRACE(n);
    EXPECT_THROW(parse_safetensors(std::string_view(valid.data(), n)), FileFormatError);
  }
}

TEST(SafetensorsMalformed, ByteFlipsNeverCrash) {
  // Corrupting any single header byte either still parses or raises FileFormatError.
  const std::string valid =
      serialize_safetensors({{"w", from_vector<float>({1, 2, 3, 4}, {2, 2})}, {"b", from_vector<int64_t>({5, 6})}});
  uint64_t header_len = 0;
  std::memcpy(&header_len, valid.data(), 8);
  int rejected = 0;
  for (size_t i = 0; i < 8 + header_len; ++i) {
    for (unsigned char flip : {0x01, 0x20, 0x80, 0xff}) {
      std::string bad = valid;
      bad[i] = static_cast<char>(bad[i] ^ flip);
      try {
        parse_safetensors(bad);
      } catch (const FileFormatError&) {
        ++rejected;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "byte " << i << " ^ " << int(flip) << ": unexpected " << e.what();
      }
    }
  }
  EXPECT_GT(rejected, 0);
}

// ---------------------------------------------------------------------------------------------
// I/O errors

TEST(SafetensorsIO, MissingFileRaisesIOError) {
  EXPECT_THROW_MSG(load_safetensors("/nonexistent/dir/w.safetensors"), IOError,
                   "cannot open \"/nonexistent/dir/w.safetensors\" for reading");
  EXPECT_THROW_MSG(load_safetensors_metadata("/nonexistent/w.safetensors"), IOError, "cannot open");
}

TEST(SafetensorsIO, MalformedFileNamesThePath) {
  const std::string path = temp_path("short.safetensors");
  std::ofstream(path, std::ios::binary) << "abc";
  EXPECT_THROW_MSG(load_safetensors(path), FileFormatError, "safetensors \"" + path + "\": file is 3 bytes");
  EXPECT_THROW_MSG(load_safetensors_metadata(path), FileFormatError, "file is 3 bytes");
}

TEST(SafetensorsIO, DirectoryIsNotAFile) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = dir != nullptr ? dir : "/tmp";
  EXPECT_THROW_MSG(load_safetensors(path), IOError, "it is a directory");
  EXPECT_THROW_MSG(save_safetensors(path, {{"a", ones({1})}}), IOError, "for writing");
}

TEST(SafetensorsIO, UnwritablePathRaisesIOError) {
  EXPECT_THROW_MSG(save_safetensors("/nonexistent/dir/out.safetensors", {{"a", ones({1})}}), IOError,
                   "cannot open \"/nonexistent/dir/out.safetensors\" for writing");
}

TEST(SafetensorsIO, FailedWriteRaisesIOError) {
  // /dev/full accepts the open and fails every write (ENOSPC), even a small buffered one.
  std::ifstream probe("/dev/full");
  if (!probe.good()) GTEST_SKIP() << "/dev/full is not available";
  EXPECT_THROW_MSG(save_safetensors("/dev/full", {{"a", ones({1})}}), IOError, "/dev/full");
}

}  // namespace
}  // namespace dbrq
