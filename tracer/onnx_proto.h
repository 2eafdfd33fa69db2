// A minimal writer of the ONNX protobuf messages the exporter needs (ModelProto, GraphProto,
// NodeProto, AttributeProto, TensorProto, ValueInfoProto), in protobuf's wire format directly:
// no protobuf library, no generated code (docs/onnx_export.md says why). Field numbers are
// onnx.proto's (ONNX 1.12). Internal to the tracer.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace dbrq::onnx {

// ONNX TensorProto.DataType values.
enum ElemType : int32_t { kFloat = 1, kUint8 = 2, kInt8 = 3, kInt32 = 6, kInt64 = 7, kBool = 9 };

// Protobuf wire format: varints, length-delimited fields, fixed32 floats.
class Wire {
 public:
  void varint(uint64_t v) {
    while (v >= 0x80) {
      buf_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    buf_.push_back(static_cast<char>(v));
  }
  void key(int field, int wire_type) { varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type)); }
  void int_field(int field, int64_t v) {
    key(field, 0);
    varint(static_cast<uint64_t>(v));  // negative int64: ten bytes, as protobuf encodes them
  }
  void bytes_field(int field, const std::string& s) {
    key(field, 2);
    varint(s.size());
    buf_ += s;
  }
  void msg_field(int field, const Wire& m) { bytes_field(field, m.buf_); }
  void float_field(int field, float f) {
    key(field, 5);
    char b[4];
    std::memcpy(b, &f, 4);
    buf_.append(b, 4);
  }
  const std::string& bytes() const { return buf_; }

 private:
  std::string buf_;
};

struct Attribute {
  enum Type : int32_t { kFloatAttr = 1, kIntAttr = 2, kStringAttr = 3, kFloatsAttr = 6, kIntsAttr = 7 };
  std::string name;
  Type type = kIntAttr;
  float f = 0.f;
  int64_t i = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;

  static Attribute Int(std::string n, int64_t v) {
    Attribute a;
    a.name = std::move(n);
    a.type = kIntAttr;
    a.i = v;
    return a;
  }
  static Attribute Float(std::string n, float v) {
    Attribute a;
    a.name = std::move(n);
    a.type = kFloatAttr;
    a.f = v;
    return a;
  }
  static Attribute Ints(std::string n, std::vector<int64_t> v) {
    Attribute a;
    a.name = std::move(n);
    a.type = kIntsAttr;
    a.ints = std::move(v);
    return a;
  }
  static Attribute String(std::string n, std::string v) {
    Attribute a;
    a.name = std::move(n);
    a.type = kStringAttr;
    a.s = std::move(v);
    return a;
  }
  Wire encode() const {
    Wire w;
    w.bytes_field(1, name);
    switch (type) {
      case kFloatAttr:
        w.float_field(2, f);
        break;
      case kIntAttr:
        w.int_field(3, i);
        break;
      case kStringAttr:
        w.bytes_field(4, s);
        break;
      case kFloatsAttr:
        for (float v : floats) w.float_field(7, v);
        break;
      case kIntsAttr:
        for (int64_t v : ints) w.int_field(8, v);
        break;
    }
    w.int_field(20, type);
    return w;
  }
};

struct Node {
  std::string op_type, name;
  std::vector<std::string> inputs, outputs;
  std::vector<Attribute> attributes;
  Wire encode() const {
    Wire w;
    for (const std::string& s : inputs) w.bytes_field(1, s);
    for (const std::string& s : outputs) w.bytes_field(2, s);
    w.bytes_field(3, name);
    w.bytes_field(4, op_type);
    for (const Attribute& a : attributes) w.msg_field(5, a.encode());
    return w;
  }
};

struct Initializer {
  std::string name;
  ElemType type = kFloat;
  std::vector<int64_t> dims;
  std::string raw;  // little-endian element bytes
  Wire encode() const {
    Wire w;
    for (int64_t d : dims) w.int_field(1, d);
    w.int_field(2, type);
    w.bytes_field(8, name);
    w.bytes_field(9, raw);
    return w;
  }
};

struct ValueInfo {
  std::string name;
  ElemType type = kFloat;
  std::vector<int64_t> dims;
  Wire encode() const {
    Wire shape;
    for (int64_t d : dims) {
      Wire dim;
      dim.int_field(1, d);
      shape.msg_field(1, dim);
    }
    Wire tensor_type;
    tensor_type.int_field(1, type);
    tensor_type.msg_field(2, shape);
    Wire type_proto;
    type_proto.msg_field(1, tensor_type);
    Wire w;
    w.bytes_field(1, name);
    w.msg_field(2, type_proto);
    return w;
  }
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;
  std::vector<Initializer> initializers;
  std::vector<ValueInfo> inputs, outputs;
  Wire encode() const {
    Wire w;
    for (const Node& n : nodes) w.msg_field(1, n.encode());
    w.bytes_field(2, name);
    for (const Initializer& t : initializers) w.msg_field(5, t.encode());
    for (const ValueInfo& v : inputs) w.msg_field(11, v.encode());
    for (const ValueInfo& v : outputs) w.msg_field(12, v.encode());
    return w;
  }
};

// ModelProto: IR version 8 (ONNX 1.12), one opset import of the default domain.
inline std::string encode_model(const Graph& g, int64_t opset, const std::string& producer_version,
                                const std::string& doc) {
  Wire opset_id;
  opset_id.bytes_field(1, "");
  opset_id.int_field(2, opset);
  Wire m;
  m.int_field(1, 8);
  m.bytes_field(2, "dbrq");
  m.bytes_field(3, producer_version);
  if (!doc.empty()) m.bytes_field(6, doc);
  m.msg_field(7, g.encode());
  m.msg_field(8, opset_id);
  return m.bytes();
}

}  // namespace dbrq::onnx
