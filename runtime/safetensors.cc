#include "runtime/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

namespace dbrq {
namespace {

using json = nlohmann::json;

struct FileDType {
  const char* name;
  DType dtype;      // what we store it as
  size_t bytes;     // element size in the file
};

constexpr FileDType kFileDTypes[] = {
    {"F32", DType::kF32, 4}, {"F16", DType::kF32, 2}, {"BF16", DType::kBF16, 2}, {"I64", DType::kS64, 8},
    {"I32", DType::kS32, 4}, {"U8", DType::kU8, 1},   {"I8", DType::kS8, 1},
};

const char* file_dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kS64:
      return "I64";
    case DType::kS32:
      return "I32";
    case DType::kU8:
      return "U8";
    case DType::kS8:
      return "I8";
  }
  return "?";
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw FileFormatError(absl::StrCat("safetensors ", source, ": ", what));
}

}  // namespace

NamedTensors parse_safetensors(std::string_view bytes, const std::string& source, const SafetensorsLimits& limits) {
  if (bytes.size() < 8) bad(source, absl::StrCat("file is ", bytes.size(), " bytes, shorter than the 8-byte header length"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > limits.max_header_bytes) {
    bad(source, absl::StrCat("header length ", header_len, " exceeds the limit of ", limits.max_header_bytes, " bytes"));
  }
  if (header_len > bytes.size() - 8) {
    bad(source, absl::StrCat("header length ", header_len, " runs past the end of the file (", bytes.size(), " bytes)"));
  }
  json header;
  try {
    header = json::parse(bytes.substr(8, header_len));
  } catch (const json::exception& e) {
    bad(source, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) bad(source, "header must be a JSON object");
  const std::string_view data = bytes.substr(8 + header_len);
  if (header.size() - (header.contains("__metadata__") ? 1 : 0) > limits.max_tensors) {
    bad(source, absl::StrCat("header lists more than ", limits.max_tensors, " tensors"));
  }

  struct Entry {
    std::string name;
    const FileDType* dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const json& v = it.value();
    const std::string& name = it.key();
    if (!v.is_object()) bad(source, absl::StrCat("entry \"", name, "\" must be an object"));
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad(source, absl::StrCat("entry \"", name, "\" has no string dtype"));
    if (!v.contains("shape") || !v["shape"].is_array()) bad(source, absl::StrCat("entry \"", name, "\" has no shape array"));
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
      bad(source, absl::StrCat("entry \"", name, "\" needs data_offsets [begin, end]"));
    }
    Entry e;
    e.name = name;
    const std::string dt = v["dtype"].get<std::string>();
    e.dtype = nullptr;
    for (const FileDType& f : kFileDTypes) {
      if (dt == f.name) e.dtype = &f;
    }
    if (e.dtype == nullptr) {
      bad(source, absl::StrCat("entry \"", name, "\" has unsupported dtype \"", dt, "\" (supported: F32, F16, BF16, I64, I32, U8, I8)"));
    }
    if (v["shape"].size() > static_cast<size_t>(kMaxDims)) {
      bad(source, absl::StrCat("entry \"", name, "\" has ", v["shape"].size(), " dims; at most ", kMaxDims, " are supported"));
    }
    uint64_t numel = 1;
    // The product of the non-zero dims bounds the tensor's strides, which must fit in int64 even
    // when another dim is 0 and the tensor is empty.
    uint64_t extent = 1;
    for (const json& s : v["shape"]) {
      if (!s.is_number_unsigned()) bad(source, absl::StrCat("entry \"", name, "\" has a shape entry that is not a non-negative integer"));
      const uint64_t d = s.get<uint64_t>();
      if (d != 0 && numel > limits.max_total_bytes / d) bad(source, absl::StrCat("entry \"", name, "\" has a shape whose size overflows"));
      if (d != 0 && extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / d) {
        bad(source, absl::StrCat("entry \"", name, "\" has a shape whose size overflows"));
      }
      numel *= d;
      extent *= std::max<uint64_t>(d, 1);
      e.shape.push_back(static_cast<int64_t>(d));
    }
    for (const json& o : v["data_offsets"]) {
      if (!o.is_number_unsigned()) bad(source, absl::StrCat("entry \"", name, "\" has data_offsets that are not non-negative integers"));
    }
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    if (e.begin > e.end || e.end > data.size()) {
      bad(source, absl::StrCat("entry \"", name, "\" has data_offsets [", e.begin, ", ", e.end,
                               "] outside the data section of ", data.size(), " bytes (file truncated?)"));
    }
    if (numel > limits.max_total_bytes / e.dtype->bytes || e.end - e.begin != numel * e.dtype->bytes) {
      bad(source, absl::StrCat("entry \"", name, "\" has ", e.end - e.begin, " bytes of data but dtype ", dt, " and shape ",
                               shape_to_string(e.shape), " need ", numel * e.dtype->bytes));
    }
    total += e.end - e.begin;
    if (total > limits.max_total_bytes) bad(source, absl::StrCat("tensors exceed the limit of ", limits.max_total_bytes, " bytes"));
    entries.push_back(std::move(e));
  }
  // An empty tensor shares its begin offset with the tensor after it: order by (begin, end) so it
  // comes first and does not look like an overlap. Names make the order total.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].begin < entries[i - 1].end) {
      bad(source, absl::StrCat("entries \"", entries[i - 1].name, "\" and \"", entries[i].name, "\" overlap"));
    }
  }

  NamedTensors out;
  out.reserve(entries.size());
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype->dtype);
    const char* src = data.data() + e.begin;
    if (std::string(e.dtype->name) == "F16") {
      float* dst = t.mutable_data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = half_to_float(h);
      }
    } else if (t.nbytes() > 0) {
      std::memcpy(t.mutable_data_ptr(), src, t.nbytes());
    }
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DBRQ_ENSURE(f.good(), IOError, "cannot open \"", path, "\" for reading");
  // A directory opens fine but every read fails, which would look like an empty file.
  std::error_code ec;
  DBRQ_ENSURE(!std::filesystem::is_directory(path, ec), IOError, "cannot read \"", path, "\": it is a directory");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

NamedTensors load_safetensors(const std::string& path, const SafetensorsLimits& limits) {
  return parse_safetensors(read_file(path), "\"" + path + "\"", limits);
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  const std::string bytes = read_file(path);
  parse_safetensors(bytes, "\"" + path + "\"");  // validates
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  const json header = json::parse(bytes.substr(8, header_len));
  std::map<std::string, std::string> out;
  if (header.contains("__metadata__") && header["__metadata__"].is_object()) {
    for (auto it = header["__metadata__"].begin(); it != header["__metadata__"].end(); ++it) {
      if (it.value().is_string()) out[it.key()] = it.value().get<std::string>();
    }
  }
  return out;
}

namespace {

// A contiguous copy made byte-wise in logical order: saving is not an op the tracer should see,
// and this path is rare (saved tensors are usually contiguous already).
Tensor contiguous_bytes(const Tensor& t) {
  Tensor d = Tensor::empty(t.sizes(), t.dtype());
  const size_t es = t.element_size();
  const char* base = static_cast<const char*>(t.storage()->data());
  char* out = static_cast<char*>(d.mutable_data_ptr());
  int64_t idx[kMaxDims] = {};
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {
    int64_t off = t.storage_offset();
    for (int64_t k = 0; k < t.dim(); ++k) off += idx[k] * t.stride(k);
    std::memcpy(out + i * es, base + off * static_cast<int64_t>(es), es);
    for (int64_t k = t.dim() - 1; k >= 0; --k) {
      if (++idx[k] < t.size(k)) break;
      idx[k] = 0;
    }
  }
  return d;
}

}  // namespace

std::string serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<Tensor> contiguous;
  for (const auto& [name, t] : tensors) {
    DBRQ_ENSURE(t.defined(), ValueError, "save_safetensors: tensor \"", name, "\" is undefined");
    DBRQ_ENSURE(name != "__metadata__", ValueError, "save_safetensors: \"__metadata__\" is reserved");
    DBRQ_ENSURE(!header.contains(name), ValueError, "save_safetensors: duplicate tensor name \"", name, "\"");
    contiguous.push_back(t.is_contiguous() ? t : contiguous_bytes(t));
    json entry;
    entry["dtype"] = file_dtype_name(t.dtype());
    entry["shape"] = std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
    entry["data_offsets"] = {offset, offset + t.nbytes()};
    header[name] = entry;
    offset += t.nbytes();
  }
  std::string h = header.dump();
  // The spec recommends padding the header to 8 bytes with spaces.
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');
  std::string out(8, '\0');
  uint64_t len = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  out += h;
  for (const Tensor& c : contiguous) {
    if (c.numel() > 0) out.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string bytes = serialize_safetensors(tensors, metadata);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  DBRQ_ENSURE(f.good(), IOError, "cannot open \"", path, "\" for writing");
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();  // flushes: a write error (disk full) may only show here
  DBRQ_ENSURE(!f.fail(), IOError, "failed writing \"", path, "\"");
}

}  // namespace dbrq
