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

// ---------------------------------------------------------------------------------------------
// The header is read with nlohmann's SAX interface, not into a json DOM: a DOM costs 16 to 80
// bytes per byte of hostile JSON ("[[[[..." or "[0,0,0,...") and a 100 MB header could ask for
// gigabytes. The handler keeps only what the format uses (per entry: dtype, the first few shape
// and offset items, their counts), and the tensor count limit is enforced while parsing. Nesting
// costs a bit per level (the parser's own stack); nlohmann's lexer keeps the current run of
// punctuation and whitespace as its last token (for error messages), so reading a header peaks at
// a few times the header's size, whatever its structure. The checks on the collected entries
// afterwards are the ones a DOM would allow, in the same (name) order, with the same messages.

// One item of a shape or data_offsets array: only non-negative integers are usable.
struct RawItem {
  bool is_unsigned = false;
  uint64_t value = 0;
};

struct RawArray {
  bool present = false;   // the key was there
  bool is_array = false;  // and its value is an array
  size_t count = 0;       // items, all of them
  std::vector<RawItem> items;  // the first kMaxItems
};

struct RawEntry {
  bool is_object = false;
  bool has_dtype = false, dtype_is_string = false;
  std::string dtype;
  RawArray shape, offsets;
};

// Items kept per array: enough for kMaxDims dims and the two offsets; more are only counted.
constexpr size_t kMaxItems = static_cast<size_t>(kMaxDims) > 2 ? static_cast<size_t>(kMaxDims) : 2;

class HeaderReader {
 public:
  using string_t = json::string_t;

  HeaderReader(const std::string& source, size_t max_tensors, bool keep_metadata)
      : source_(source), max_tensors_(max_tensors), keep_metadata_(keep_metadata) {}

  bool root_is_object() const { return root_is_object_; }
  const std::map<std::string, RawEntry>& entries() const { return entries_; }
  std::map<std::string, std::string>& metadata() { return metadata_; }

  bool null() { return scalar(Kind::kOther); }
  bool boolean(bool) { return scalar(Kind::kOther); }
  bool number_integer(json::number_integer_t) { return scalar(Kind::kOther); }
  bool number_unsigned(json::number_unsigned_t v) { return scalar(Kind::kUnsigned, v); }
  bool number_float(json::number_float_t, const string_t&) { return scalar(Kind::kOther); }
  bool binary(json::binary_t&) { return scalar(Kind::kOther); }
  bool string(string_t& s) { return scalar(Kind::kString, 0, &s); }
  bool start_object(size_t) { return open(Kind::kObject); }
  bool start_array(size_t) { return open(Kind::kArray); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& k) {
    switch (frame()) {
      case Frame::kRoot:
        if (k == "__metadata__") {
          entry_ = nullptr;
          in_metadata_ = true;
          metadata_.clear();  // a repeated key replaces the earlier value, as in a DOM
        } else {
          in_metadata_ = false;
          auto [it, inserted] = entries_.try_emplace(k);
          if (!inserted) it->second = RawEntry();
          if (entries_.size() > max_tensors_) bad(source_, absl::StrCat("header lists more than ", max_tensors_, " tensors"));
          entry_ = &it->second;
        }
        break;
      case Frame::kEntry:
        field_ = nullptr;
        field_is_dtype_ = k == "dtype";
        if (field_is_dtype_) {
          entry_->has_dtype = true;
          entry_->dtype_is_string = false;
          entry_->dtype.clear();
        } else if (k == "shape" || k == "data_offsets") {
          field_ = k == "shape" ? &entry_->shape : &entry_->offsets;
          *field_ = RawArray();
          field_->present = true;
        }
        break;
      case Frame::kMetadata:
        if (keep_metadata_) {
          metadata_key_ = k;
          metadata_.erase(k);
        }
        break;
      default:
        break;
    }
    return true;
  }

  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    // nlohmann quotes the last token, which can be most of the header ("[[[[..."): keep it short.
    std::string what = e.what();
    if (what.size() > 300) what = what.substr(0, 300) + "...";
    bad(source_, absl::StrCat("header is not valid JSON: ", what));
  }

 private:
  enum class Kind { kObject, kArray, kString, kUnsigned, kOther };
  // What the innermost open container is. Only the first three levels matter; deeper ones are
  // counted in depth_ and otherwise ignored.
  enum class Frame { kNone, kRoot, kEntry, kMetadata, kItems, kIgnored };
  static constexpr size_t kTrackedLevels = 3;

  Frame frame() const {
    if (depth_ == 0) return Frame::kNone;
    return depth_ <= kTrackedLevels ? frames_[depth_ - 1] : Frame::kIgnored;
  }

  // A value (scalar, or a container being opened) in the current frame; returns the frame the
  // value opens when it is a container.
  Frame value(Kind kind, uint64_t v, string_t* s) {
    switch (frame()) {
      case Frame::kNone:
        root_is_object_ = kind == Kind::kObject;
        return kind == Kind::kObject ? Frame::kRoot : Frame::kIgnored;
      case Frame::kRoot:
        if (in_metadata_) return kind == Kind::kObject ? Frame::kMetadata : Frame::kIgnored;
        entry_->is_object = kind == Kind::kObject;
        return entry_->is_object ? Frame::kEntry : Frame::kIgnored;
      case Frame::kEntry:
        if (field_is_dtype_ && kind == Kind::kString) {
          entry_->dtype_is_string = true;
          entry_->dtype = std::move(*s);
        } else if (field_ != nullptr && kind == Kind::kArray) {
          field_->is_array = true;
          return Frame::kItems;
        }
        return Frame::kIgnored;
      case Frame::kMetadata:
        if (keep_metadata_ && kind == Kind::kString) metadata_[metadata_key_] = std::move(*s);
        return Frame::kIgnored;
      case Frame::kItems:
        if (++field_->count <= kMaxItems) field_->items.push_back({kind == Kind::kUnsigned, v});
        return Frame::kIgnored;
      default:
        return Frame::kIgnored;
    }
  }

  bool scalar(Kind kind, uint64_t v = 0, string_t* s = nullptr) {
    value(kind, v, s);
    return true;
  }

  bool open(Kind kind) {
    const Frame f = value(kind, 0, nullptr);
    if (depth_ < kTrackedLevels) frames_[depth_] = f;
    ++depth_;
    return true;
  }

  bool close() {
    --depth_;
    return true;
  }

  const std::string& source_;
  const size_t max_tensors_;
  const bool keep_metadata_;
  size_t depth_ = 0;
  Frame frames_[kTrackedLevels] = {};
  bool root_is_object_ = false;
  std::map<std::string, RawEntry> entries_;  // ordered by name, like a json object
  RawEntry* entry_ = nullptr;                 // the entry whose value is being read
  bool in_metadata_ = false;                  // the value being read is __metadata__'s
  RawArray* field_ = nullptr;                 // shape or data_offsets of entry_
  bool field_is_dtype_ = false;
  std::map<std::string, std::string> metadata_;
  std::string metadata_key_;
};

NamedTensors parse(std::string_view bytes, const std::string& source, const SafetensorsLimits& limits,
                   std::map<std::string, std::string>* metadata) {
  if (bytes.size() < 8) bad(source, absl::StrCat("file is ", bytes.size(), " bytes, shorter than the 8-byte header length"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > limits.max_header_bytes) {
    bad(source, absl::StrCat("header length ", header_len, " exceeds the limit of ", limits.max_header_bytes, " bytes"));
  }
  if (header_len > bytes.size() - 8) {
    bad(source, absl::StrCat("header length ", header_len, " runs past the end of the file (", bytes.size(), " bytes)"));
  }
  const std::string_view header = bytes.substr(8, header_len);
  HeaderReader reader(source, limits.max_tensors, metadata != nullptr);
  json::sax_parse(header.data(), header.data() + header.size(), &reader);
  if (!reader.root_is_object()) bad(source, "header must be a JSON object");
  const std::string_view data = bytes.substr(8 + header_len);

  struct Entry {
    std::string name;
    const FileDType* dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  entries.reserve(reader.entries().size());
  uint64_t total = 0;
  for (const auto& [name, v] : reader.entries()) {
    if (!v.is_object) bad(source, absl::StrCat("entry \"", name, "\" must be an object"));
    if (!v.has_dtype || !v.dtype_is_string) bad(source, absl::StrCat("entry \"", name, "\" has no string dtype"));
    if (!v.shape.present || !v.shape.is_array) bad(source, absl::StrCat("entry \"", name, "\" has no shape array"));
    if (!v.offsets.present || !v.offsets.is_array || v.offsets.count != 2) {
      bad(source, absl::StrCat("entry \"", name, "\" needs data_offsets [begin, end]"));
    }
    Entry e;
    e.name = name;
    const std::string& dt = v.dtype;
    e.dtype = nullptr;
    for (const FileDType& f : kFileDTypes) {
      if (dt == f.name) e.dtype = &f;
    }
    if (e.dtype == nullptr) {
      bad(source, absl::StrCat("entry \"", name, "\" has unsupported dtype \"", dt, "\" (supported: F32, F16, BF16, I64, I32, U8, I8)"));
    }
    if (v.shape.count > static_cast<size_t>(kMaxDims)) {
      bad(source, absl::StrCat("entry \"", name, "\" has ", v.shape.count, " dims; at most ", kMaxDims, " are supported"));
    }
    uint64_t numel = 1;
    // The product of the non-zero dims bounds the tensor's strides, which must fit in int64 even
    // when another dim is 0 and the tensor is empty.
    uint64_t extent = 1;
    for (const RawItem& s : v.shape.items) {
      if (!s.is_unsigned) bad(source, absl::StrCat("entry \"", name, "\" has a shape entry that is not a non-negative integer"));
      const uint64_t d = s.value;
      if (d != 0 && numel > limits.max_total_bytes / d) bad(source, absl::StrCat("entry \"", name, "\" has a shape whose size overflows"));
      if (d != 0 && extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / d) {
        bad(source, absl::StrCat("entry \"", name, "\" has a shape whose size overflows"));
      }
      numel *= d;
      extent *= std::max<uint64_t>(d, 1);
      e.shape.push_back(static_cast<int64_t>(d));
    }
    for (const RawItem& o : v.offsets.items) {
      if (!o.is_unsigned) bad(source, absl::StrCat("entry \"", name, "\" has data_offsets that are not non-negative integers"));
    }
    e.begin = v.offsets.items[0].value;
    e.end = v.offsets.items[1].value;
    if (e.begin > e.end || e.end > data.size()) {
      bad(source, absl::StrCat("entry \"", name, "\" has data_offsets [", e.begin, ", ", e.end,
                               "] outside the data section of ", data.size(), " bytes (file truncated?)"));
    }
    // The byte count must match the data actually present before anything is allocated.
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
      float* dst = t.raw_mutable_data<float>();
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
  if (metadata != nullptr) *metadata = std::move(reader.metadata());
  return out;
}

}  // namespace

NamedTensors parse_safetensors(std::string_view bytes, const std::string& source, const SafetensorsLimits& limits) {
  return parse(bytes, source, limits, nullptr);
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
  std::map<std::string, std::string> out;
  parse(read_file(path), "\"" + path + "\"", SafetensorsLimits{}, &out);  // validates the whole file
  return out;
}

namespace {

// A contiguous copy made byte-wise in logical order: saving is not an op the tracer should see,
// and this path is rare (saved tensors are usually contiguous already).
Tensor contiguous_bytes(const Tensor& t) {
  Tensor d = Tensor::empty(t.sizes(), t.dtype());
  const size_t es = t.element_size();
  (void)t.data_ptr();  // raises for a tensor without values of its own (Tensor::value_withheld)
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
