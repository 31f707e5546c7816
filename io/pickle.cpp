#include "io/pickle.h"

#include <fmt/format.h>
#include <algorithm>
#include <iterator>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "io/binary_fields.h"

namespace ddp::io {
namespace {

using binary::fail;
using binary::le16;
using binary::le32;
using binary::le64;
using binary::printable;

enum class Kind : uint8_t { kNone, kBool, kInt, kText, kBytes, kTuple, kList, kGlobal, kArray, kDtype };

// With its article, for messages: "an int", "a list".
const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "a bool";
    case Kind::kInt:
      return "an int";
    case Kind::kText:
      return "a str";
    case Kind::kBytes:
      return "a bytes";
    case Kind::kTuple:
      return "a tuple";
    case Kind::kList:
      return "a list";
    case Kind::kGlobal:
      return "a global";
    case Kind::kArray:
      return "an ndarray";
    case Kind::kDtype:
      return "a dtype";
  }
  return "?";
}

struct Node;

// An int, bool or None inline; anything else in a shared node (the memo and the stack may share it).
struct Value {
  Kind kind = Kind::kNone;
  int64_t number = 0;
  std::shared_ptr<Node> node;
};

struct Node {
  std::string text;            // str, bytes, a global's name, a dtype's type string
  std::vector<Value> items;    // tuple; list once it holds something other than ints
  std::vector<int64_t> ints;   // list while it holds only ints (the common case, kept compact)
  bool mixed = false;          // list: `items` holds the elements
  bool contained = false;      // inside a tuple or list: a list no longer grows, an ndarray is not built
                               // (so no value can contain itself)
  int depth = 1;               // nesting depth, bounded so destruction cannot recurse deeply
  std::vector<int64_t> shape;  // ndarray
  std::shared_ptr<Node> data;  // ndarray: the list of its elements, after BUILD
  bool built = false;          // ndarray, dtype: BUILD applied
};

constexpr int kMaxDepth = 16;
constexpr size_t kMaxGlobalName = 256;

Value make(Kind kind) {
  Value v;
  v.kind = kind;
  v.node = std::make_shared<Node>();
  return v;
}
Value make_int(Kind kind, int64_t number) {
  Value v;
  v.kind = kind;
  v.number = number;
  return v;
}

std::string opcode_name(uint8_t op) {
  // clang-format off
  static const std::unordered_map<uint8_t, const char*> kNames = {
      {'(', "MARK"}, {'.', "STOP"}, {'0', "POP"}, {'1', "POP_MARK"}, {'2', "DUP"}, {'F', "FLOAT"},
      {'I', "INT"}, {'J', "BININT"}, {'K', "BININT1"}, {'L', "LONG"}, {'M', "BININT2"}, {'N', "NONE"},
      {'P', "PERSID"}, {'Q', "BINPERSID"}, {'R', "REDUCE"}, {'S', "STRING"}, {'T', "BINSTRING"},
      {'U', "SHORT_BINSTRING"}, {'V', "UNICODE"}, {'X', "BINUNICODE"}, {'a', "APPEND"}, {'b', "BUILD"},
      {'c', "GLOBAL"}, {'d', "DICT"}, {'}', "EMPTY_DICT"}, {'e', "APPENDS"}, {'g', "GET"}, {'h', "BINGET"},
      {'i', "INST"}, {'j', "LONG_BINGET"}, {'l', "LIST"}, {']', "EMPTY_LIST"}, {'o', "OBJ"}, {'p', "PUT"},
      {'q', "BINPUT"}, {'r', "LONG_BINPUT"}, {'s', "SETITEM"}, {'t', "TUPLE"}, {')', "EMPTY_TUPLE"},
      {'u', "SETITEMS"}, {'G', "BINFLOAT"}, {0x80, "PROTO"}, {0x81, "NEWOBJ"}, {0x82, "EXT1"}, {0x83, "EXT2"},
      {0x84, "EXT4"}, {0x85, "TUPLE1"}, {0x86, "TUPLE2"}, {0x87, "TUPLE3"}, {0x88, "NEWTRUE"},
      {0x89, "NEWFALSE"}, {0x8a, "LONG1"}, {0x8b, "LONG4"}, {'B', "BINBYTES"}, {'C', "SHORT_BINBYTES"},
      {0x8c, "SHORT_BINUNICODE"}, {0x8d, "BINUNICODE8"}, {0x8e, "BINBYTES8"}, {0x8f, "EMPTY_SET"},
      {0x90, "ADDITEMS"}, {0x91, "FROZENSET"}, {0x92, "NEWOBJ_EX"}, {0x93, "STACK_GLOBAL"}, {0x94, "MEMOIZE"},
      {0x95, "FRAME"}, {0x96, "BYTEARRAY8"}, {0x97, "NEXT_BUFFER"}, {0x98, "READONLY_BUFFER"}};
  // clang-format on
  const auto it = kNames.find(op);
  return fmt::format("0x{:02x} ({})", op, it == kNames.end() ? "unknown" : it->second);
}

class Unpickler {
 public:
  Unpickler(std::span<const uint8_t> data, std::string where) : data_(data), where_(std::move(where)) {}

  Value load() {
    for (;;) {
      if (pos_ >= data_.size()) fail(where_, "pickle: ends without STOP (truncated?)");
      at_ = pos_;
      const uint8_t op = data_[pos_++];
      switch (op) {
        case 0x80: {  // PROTO
          const uint8_t protocol = byte();
          if (protocol < 2 || protocol > 5) {
            error("protocol " + std::to_string(protocol) + " is not supported");
          }
          break;
        }
        case 0x95:  // FRAME: a hint for buffering readers, nothing to do
          need(u64());
          break;
        case 'c': {  // GLOBAL
          const std::string module = line();
          const std::string name = line();
          push(global(module, name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const Value name = pop();
          const Value module = pop();
          if (name.kind != Kind::kText || module.kind != Kind::kText) error("STACK_GLOBAL needs two strings");
          push(global(module.node->text, name.node->text));
          break;
        }
        case 0x8c:  // SHORT_BINUNICODE
          push(text(Kind::kText, byte()));
          break;
        case 'X':  // BINUNICODE
          push(text(Kind::kText, u32()));
          break;
        case 0x8d:  // BINUNICODE8
          push(text(Kind::kText, u64()));
          break;
        case 'U':  // SHORT_BINSTRING (Python 2's str)
          push(text(Kind::kText, byte()));
          break;
        case 'T': {  // BINSTRING
          const auto length = static_cast<int32_t>(u32());
          if (length < 0) error("negative string length");
          push(text(Kind::kText, static_cast<uint64_t>(length)));
          break;
        }
        case 'C':  // SHORT_BINBYTES
          push(text(Kind::kBytes, byte()));
          break;
        case 'B':  // BINBYTES
          push(text(Kind::kBytes, u32()));
          break;
        case 'q':  // BINPUT
          memo_put(byte());
          break;
        case 'r':  // LONG_BINPUT
          memo_put(u32());
          break;
        case 0x94:  // MEMOIZE
          memo_put(memo_.size());
          break;
        case 'h':  // BINGET
          memo_get(byte());
          break;
        case 'j':  // LONG_BINGET
          memo_get(u32());
          break;
        case '(':  // MARK
          marks_.push_back(stack_.size());
          break;
        case ')':  // EMPTY_TUPLE
          push(tuple(stack_.size()));
          break;
        case 't': {  // TUPLE
          const size_t mark = pop_mark();
          push(tuple(mark));
          break;
        }
        case 0x85:  // TUPLE1
        case 0x86:  // TUPLE2
        case 0x87:  // TUPLE3
        {
          const size_t count = static_cast<size_t>(op - 0x84);
          if (available() < count) error("stack underflow");
          push(tuple(stack_.size() - count));
          break;
        }
        case ']':  // EMPTY_LIST
          push(make(Kind::kList));
          break;
        case 'l': {  // LIST
          const size_t mark = pop_mark();
          Value list = make(Kind::kList);
          append(list, mark);
          push(std::move(list));
          break;
        }
        case 'a':  // APPEND
          if (available() < 2) error("stack underflow");
          append(stack_[stack_.size() - 2], stack_.size() - 1);
          break;
        case 'e': {  // APPENDS
          const size_t mark = pop_mark();
          if (mark == 0) error("APPENDS without a list");
          append(stack_[mark - 1], mark);
          break;
        }
        case 'J':  // BININT
          push(make_int(Kind::kInt, static_cast<int32_t>(u32())));
          break;
        case 'K':  // BININT1
          push(make_int(Kind::kInt, byte()));
          break;
        case 'M':  // BININT2
          push(make_int(Kind::kInt, u16()));
          break;
        case 0x8a:  // LONG1
          push(make_int(Kind::kInt, long1()));
          break;
        case 0x88:  // NEWTRUE
          push(make_int(Kind::kBool, 1));
          break;
        case 0x89:  // NEWFALSE
          push(make_int(Kind::kBool, 0));
          break;
        case 'N':  // NONE
          push(Value{});
          break;
        case 'R': {  // REDUCE
          Value args = pop();
          Value callable = pop();
          push(reduce(callable, args));
          break;
        }
        case 'b': {  // BUILD
          Value state = pop();
          if (available() < 1) error("stack underflow");
          build(stack_.back(), state);
          break;
        }
        case '.':  // STOP
          return pop();
        default:
          error("opcode " + opcode_name(op) +
                " is not allowed (only numpy's pickles of arrays of lists of ints)");
      }
    }
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail(where_, "pickle: " + what + " (at byte " + std::to_string(at_) + ")");
  }

  void need(uint64_t count) const {
    if (count > data_.size() - pos_) error("truncated");
  }
  uint8_t byte() {
    need(1);
    return data_[pos_++];
  }
  uint16_t u16() {
    need(2);
    pos_ += 2;
    return le16(data_.data() + pos_ - 2);
  }
  uint32_t u32() {
    need(4);
    pos_ += 4;
    return le32(data_.data() + pos_ - 4);
  }
  uint64_t u64() {
    need(8);
    pos_ += 8;
    return le64(data_.data() + pos_ - 8);
  }
  std::string line() {
    const size_t start = pos_;
    while (pos_ < data_.size() && data_[pos_] != '\n' && pos_ - start < kMaxGlobalName) ++pos_;
    if (pos_ >= data_.size() || data_[pos_] != '\n') error("GLOBAL name is not terminated");
    std::string text(reinterpret_cast<const char*>(data_.data() + start), pos_ - start);
    ++pos_;
    return text;
  }
  int64_t long1() {
    const uint8_t length = byte();
    if (length > 8) error("an int wider than 64 bits");
    need(length);
    uint64_t value = 0;
    for (uint8_t i = 0; i < length; ++i) value |= static_cast<uint64_t>(data_[pos_ + i]) << (8 * i);
    if (length > 0 && length < 8 && (data_[pos_ + length - 1] & 0x80)) value |= ~uint64_t{0} << (8 * length);
    pos_ += length;
    return static_cast<int64_t>(value);
  }

  Value text(Kind kind, uint64_t length) {
    need(length);
    Value v = make(kind);
    v.node->text.assign(reinterpret_cast<const char*>(data_.data() + pos_), length);
    pos_ += length;
    return v;
  }

  void push(Value v) { stack_.push_back(std::move(v)); }
  // Entries above the innermost MARK: an opcode may not reach below it.
  size_t available() const { return stack_.size() - (marks_.empty() ? 0 : marks_.back()); }
  Value pop() {
    if (available() == 0) error("stack underflow");
    Value v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  size_t pop_mark() {
    if (marks_.empty()) error("no MARK to match");
    const size_t mark = marks_.back();
    marks_.pop_back();
    return mark;
  }

  void memo_put(uint64_t index) {
    if (available() == 0) error("PUT with an empty stack");
    memo_[index] = stack_.back();
  }
  void memo_get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) error("GET of memo entry " + std::to_string(index) + ", which was never stored");
    push(it->second);
  }

  // A value placed inside a container: lists freeze (no cycles) and depth grows.
  int contain(const Value& v) {
    if (!v.node) return 0;
    v.node->contained = true;
    return v.node->depth;
  }

  // Builds a tuple of stack_[first, end) and removes those entries.
  Value tuple(size_t first) {
    Value t = make(Kind::kTuple);
    int depth = 0;
    for (size_t i = first; i < stack_.size(); ++i) depth = std::max(depth, contain(stack_[i]));
    t.node->depth = depth + 1;
    if (t.node->depth > kMaxDepth) error("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    t.node->items.assign(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(first)),
                         std::make_move_iterator(stack_.end()));
    stack_.resize(first);
    return t;
  }

  // Appends stack_[first, end) to `list` and removes those entries.
  void append(Value& list, size_t first) {
    if (list.kind != Kind::kList) error(std::string("APPEND to ") + kind_name(list.kind) + ", not a list");
    Node& node = *list.node;
    for (size_t i = first; i < stack_.size(); ++i) {
      const int depth = contain(stack_[i]);
      if (node.contained) error("APPEND to a list that is already inside another container");
      if (depth + 1 > kMaxDepth) error("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
      node.depth = std::max(node.depth, depth + 1);
      if (stack_[i].kind == Kind::kInt && !node.mixed) {
        node.ints.push_back(stack_[i].number);
        continue;
      }
      if (!node.mixed) {
        for (int64_t number : node.ints) node.items.push_back(make_int(Kind::kInt, number));
        node.ints.clear();
        node.mixed = true;
      }
      node.items.push_back(std::move(stack_[i]));
    }
    stack_.resize(first);
  }

  Value global(const std::string& module, const std::string& name) {
    std::string known;
    if ((module == "numpy.core.multiarray" || module == "numpy._core.multiarray") && name == "_reconstruct") {
      known = "_reconstruct";
    } else if (module == "numpy" && (name == "ndarray" || name == "dtype")) {
      known = name;
    } else if (name == "scalar") {
      // np.savez of lists built from numpy arrays (list(row)) pickles every token as a numpy scalar.
      error(
          "global " + printable(module + "." + name) +
          " is not allowed: the sequences hold numpy integers, not Python ints (write each as row.tolist())");
    } else {
      error("global " + printable(module + "." + name) +
            " is not allowed (only numpy's ndarray reconstruction)");
    }
    Value g = make(Kind::kGlobal);
    g.node->text = known;
    return g;
  }

  Value reduce(const Value& callable, const Value& args) {
    if (callable.kind != Kind::kGlobal || args.kind != Kind::kTuple) {
      error(std::string("REDUCE of ") + kind_name(callable.kind) + " with " + kind_name(args.kind));
    }
    const std::vector<Value>& a = args.node->items;
    if (callable.node->text == "_reconstruct") {
      if (a.empty() || a[0].kind != Kind::kGlobal || a[0].node->text != "ndarray") {
        error("_reconstruct of something other than numpy.ndarray");
      }
      return make(Kind::kArray);
    }
    if (callable.node->text == "dtype") {
      if (a.empty() || a[0].kind != Kind::kText) error("dtype() without a type string");
      Value d = make(Kind::kDtype);
      d.node->text = a[0].node->text;
      return d;
    }
    error("REDUCE of numpy." + callable.node->text + " is not allowed");
  }

  void build(Value& target, const Value& state) {
    if (state.kind != Kind::kTuple) error(std::string("BUILD with ") + kind_name(state.kind) + " state");
    const std::vector<Value>& s = state.node->items;
    if (target.kind == Kind::kDtype) {
      target.node->built = true;
      return;
    }
    if (target.kind != Kind::kArray) error(std::string("BUILD of ") + kind_name(target.kind));
    if (target.node->built) error("BUILD of an ndarray twice");
    // Its data may not lead back to it: an ndarray already inside a container cannot be built.
    if (target.node->contained) error("BUILD of an ndarray that is inside a container");
    // ndarray.__setstate__: (version, shape, dtype, fortran, data), or without the version (old numpy).
    if (s.size() != 5 && s.size() != 4) error("ndarray state of " + std::to_string(s.size()) + " items");
    const size_t first = s.size() - 4;
    const Value& shape = s[first];
    const Value& dtype = s[first + 1];
    const Value& data = s[first + 3];
    if (shape.kind != Kind::kTuple) error("ndarray shape is not a tuple");
    for (const Value& dim : shape.node->items) {
      if (dim.kind != Kind::kInt || dim.number < 0) error("ndarray shape holds something other than sizes");
      target.node->shape.push_back(dim.number);
    }
    if (dtype.kind != Kind::kDtype) error("ndarray dtype is " + std::string(kind_name(dtype.kind)));
    if (dtype.node->text != "O8" && dtype.node->text != "O4" && dtype.node->text != "O") {
      error("pickled ndarray of dtype '" + printable(dtype.node->text) +
            "' (only object arrays are pickled: an object array must hold each sequence as a Python list, "
            "row.tolist())");
    }
    if (data.kind != Kind::kList)
      error("ndarray data is " + std::string(kind_name(data.kind)) + ", not a list");
    if (data.node->depth + 1 > kMaxDepth)
      error("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    target.node->depth = data.node->depth + 1;
    target.node->data = data.node;
    target.node->built = true;
  }

  std::span<const uint8_t> data_;
  std::string where_;
  size_t pos_ = 0;
  size_t at_ = 0;  // where the current opcode starts, for messages
  std::vector<Value> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value> memo_;
};

}  // namespace

ObjectArrayElements unpickle_object_array(std::span<const uint8_t> pickle, const std::vector<int64_t>& shape,
                                          const std::string& where) {
  ObjectArrayElements array;
  int64_t size = 1;
  for (int64_t dim : shape) size *= dim;
  Value result;
  {
    Unpickler unpickler(pickle, where);
    result = unpickler.load();
  }  // the memo is gone: the elements' lists are owned by the array alone
  if (result.kind != Kind::kArray || !result.node->built) {
    fail(where, std::string("the pickle holds ") + kind_name(result.kind) + ", not an ndarray");
  }
  if (result.node->shape != shape) fail(where, "the pickled shape differs from the header's");
  Node& data = *result.node->data;
  const size_t count = data.mixed ? data.items.size() : data.ints.size();
  if (static_cast<int64_t>(count) != size) {
    fail(where,
         "the pickle holds " + std::to_string(count) + " elements, the shape says " + std::to_string(size));
  }
  if (!data.mixed) {  // every element an int
    array.integers = std::move(data.ints);
    return array;
  }
  const bool lists = data.items.front().kind == Kind::kList;
  std::unordered_set<const Node*> seen;
  for (size_t i = 0; i < data.items.size(); ++i) {
    Value& element = data.items[i];
    const std::string element_name = "element " + std::to_string(i);
    if (lists) {
      if (element.kind != Kind::kList) {
        fail(where, element_name + " is " + kind_name(element.kind) + ", not a list of ints");
      }
      Node& list = *element.node;
      if (list.mixed) {
        for (const Value& item : list.items) {
          if (item.kind != Kind::kInt) {
            fail(where, element_name + " holds " + kind_name(item.kind) + ", not only ints");
          }
        }
      }
      // The same list twice would be copied twice: a small pickle could blow up memory that way.
      if (!seen.insert(&list).second) {
        fail(where, element_name + " repeats an earlier element's list (shared lists are not supported)");
      }
      array.lists.push_back(std::move(list.ints));
    } else if (element.kind == Kind::kInt) {
      array.integers.push_back(element.number);
    } else {
      fail(where, element_name + " is " + kind_name(element.kind) + ", not an int or a list of ints");
    }
  }
  return array;
}

}  // namespace ddp::io
