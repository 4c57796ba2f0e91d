// GGUF v2/v3 reader over a read-only private memory mapping.
//
// Format (little-endian; v2 and v3 are identical on little-endian hosts, v1 used 32-bit
// counts and is rejected):
//   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x (string key | u32 value type | value)          string = u64 length + bytes
//   n_tensors x (string name | u32 n_dims | n_dims x i64 ne | u32 type | u64 offset)
//   padding to general.alignment (default 32) | data section (offsets relative to it)
//
// Validation, in the order the bytes are read: every read is checked against the bytes left
// in the file before it happens, so truncation anywhere is reported as such; counts
// (n_kv, n_tensors, array lengths) are checked against what the remaining bytes could hold
// at the smallest encoding of one item *before* anything is reserved, and the total number
// of metadata array elements is capped at kMaxArrayElems (a 16M-element budget; the largest
// real vocabularies use well under 1M), so corrupt input cannot trigger huge allocations;
// nested arrays are limited to kMaxDepth levels, so recursion is bounded. Tensors: 1..4
// dims, each > 0, element and byte counts checked for overflow, row length a whole number
// of blocks, offset a multiple of the alignment, data inside the file, names unique.
//
// Known-but-unsupported tensor types (q8_K, q8_1, the i-quants other than iq4_nl / iq4_xs,
// tq1_0, tq2_0, i8..i64, f64) have known block geometry, so such tensors are validated and
// listed like any other (`kvtrim inspect` can show them); the error comes only when they are
// used: the loader, dequantize_row and the matmul kernels reject them with a message naming
// the type. A type id kvtrim does not know at all is an error at open, naming the tensor and
// the id (its size cannot be checked).
//
// Every error message starts with the file path.
#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace kvtrim {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxDims = 4;
constexpr int kMaxDepth = 8;                      // nesting of metadata arrays
constexpr uint64_t kMaxArrayElems = 1ull << 24;   // all metadata array elements together

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::F64); }

// Smallest number of bytes one value of type t occupies in the file (for count checks).
uint64_t min_encoded_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8:
    case GgufValueType::I8:
    case GgufValueType::BOOL: return 1;
    case GgufValueType::U16:
    case GgufValueType::I16: return 2;
    case GgufValueType::U32:
    case GgufValueType::I32:
    case GgufValueType::F32: return 4;
    case GgufValueType::U64:
    case GgufValueType::I64:
    case GgufValueType::F64:
    case GgufValueType::STRING: return 8;
    case GgufValueType::ARRAY: return 12;
  }
  return 1;
}

// Bounds-checked little-endian cursor over the mapping.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* base, size_t size) : path_(path), base_(base), size_(size) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }
  const std::string& path() const { return path_; }

  void need(size_t n, const std::string& what) const {
    if (n > left())
      fail("%s: truncated file: %s at offset %zu needs %zu bytes, only %zu left", path_.c_str(), what.c_str(),
           pos_, n, left());
  }
  template <typename T>
  T pod(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(const std::string& what) {
    const uint64_t n = pod<uint64_t>(what + " (string length)");
    if (n > left())
      fail("%s: %s: string length %" PRIu64 " at offset %zu exceeds the %zu bytes left in the file "
           "(corrupt or truncated)", path_.c_str(),
           what.c_str(), n, pos_ - 8, left());
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }

 private:
  const std::string& path_;
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
};

struct ParseState {
  uint64_t array_elems = 0;  // running total, capped at kMaxArrayElems
};

GgufValue read_value(Cursor& c, GgufValueType type, const std::string& what, int depth, ParseState& st) {
  switch (type) {
    case GgufValueType::U8: return {type, uint64_t{c.pod<uint8_t>(what)}};
    case GgufValueType::U16: return {type, uint64_t{c.pod<uint16_t>(what)}};
    case GgufValueType::U32: return {type, uint64_t{c.pod<uint32_t>(what)}};
    case GgufValueType::U64: return {type, c.pod<uint64_t>(what)};
    case GgufValueType::I8: return {type, int64_t{c.pod<int8_t>(what)}};
    case GgufValueType::I16: return {type, int64_t{c.pod<int16_t>(what)}};
    case GgufValueType::I32: return {type, int64_t{c.pod<int32_t>(what)}};
    case GgufValueType::I64: return {type, c.pod<int64_t>(what)};
    case GgufValueType::F32: return {type, static_cast<double>(c.pod<float>(what))};
    case GgufValueType::F64: return {type, c.pod<double>(what)};
    case GgufValueType::BOOL: {
      const uint8_t b = c.pod<uint8_t>(what);
      if (b > 1) fail("%s: %s: bool value %u at offset %zu is neither 0 nor 1", c.path().c_str(), what.c_str(), b,
                      c.pos() - 1);
      return {type, b == 1};
    }
    case GgufValueType::STRING: return {type, c.str(what)};
    case GgufValueType::ARRAY: {
      if (depth >= kMaxDepth)
        fail("%s: %s: metadata arrays nested deeper than %d levels", c.path().c_str(), what.c_str(), kMaxDepth);
      const uint32_t et = c.pod<uint32_t>(what + " (array element type)");
      if (!known_value_type(et))
        fail("%s: %s: unknown array element type %u", c.path().c_str(), what.c_str(), et);
      const auto elem_type = static_cast<GgufValueType>(et);
      const uint64_t n = c.pod<uint64_t>(what + " (array length)");
      if (n > c.left() / min_encoded_size(elem_type))
        fail("%s: %s: array of %" PRIu64 " %s elements cannot fit in the %zu bytes left in the file "
             "(corrupt or truncated)",
             c.path().c_str(), what.c_str(), n, gguf_value_type_name(elem_type), c.left());
      if (n > kMaxArrayElems - st.array_elems)
        fail("%s: %s: metadata arrays hold more than %" PRIu64 " elements in total", c.path().c_str(),
             what.c_str(), kMaxArrayElems);
      st.array_elems += n;
      GgufArray a{elem_type, {}};
      a.values.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) a.values.push_back(read_value(c, elem_type, what, depth + 1, st));
      return {type, std::move(a)};
    }
  }
  fail("%s: %s: unknown value type %u", c.path().c_str(), what.c_str(), static_cast<unsigned>(type));
}

// Printable form of a string value for messages and `kvtrim inspect`.
std::string quote(const std::string& s, size_t max_chars) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == max_chars) {
      out += "...";
      break;
    }
    const auto ch = static_cast<unsigned char>(s[i]);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch < 0x20 || ch == 0x7f) {
      out += strprintf("\\x%02x", ch);
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

}  // namespace

const char* gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8: return "u8";
    case GgufValueType::I8: return "i8";
    case GgufValueType::U16: return "u16";
    case GgufValueType::I16: return "i16";
    case GgufValueType::U32: return "u32";
    case GgufValueType::I32: return "i32";
    case GgufValueType::F32: return "f32";
    case GgufValueType::BOOL: return "bool";
    case GgufValueType::STRING: return "string";
    case GgufValueType::ARRAY: return "array";
    case GgufValueType::U64: return "u64";
    case GgufValueType::I64: return "i64";
    case GgufValueType::F64: return "f64";
  }
  return "unknown";
}


// ---- GgufValue ------------------------------------------------------------------------

int64_t GgufValue::as_int() const {
  if (const auto* u = std::get_if<uint64_t>(&v)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail("metadata value %" PRIu64 " (%s) does not fit in int64", *u, gguf_value_type_name(type));
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  fail("metadata value of type %s is not an integer", gguf_value_type_name(type));
}

double GgufValue::as_float() const {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&v)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  fail("metadata value of type %s is not a number", gguf_value_type_name(type));
}

bool GgufValue::as_bool() const {
  if (const auto* b = std::get_if<bool>(&v)) return *b;
  fail("metadata value of type %s is not a bool", gguf_value_type_name(type));
}

const std::string& GgufValue::as_string() const {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  fail("metadata value of type %s is not a string", gguf_value_type_name(type));
}

const GgufArray& GgufValue::as_array() const {
  if (const auto* a = std::get_if<GgufArray>(&v)) return *a;
  fail("metadata value of type %s is not an array", gguf_value_type_name(type));
}

std::string GgufValue::to_string(size_t max_elems) const {
  if (const auto* u = std::get_if<uint64_t>(&v)) return std::to_string(*u);
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return strprintf(type == GgufValueType::F32 ? "%.9g" : "%.17g", *d);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&v)) return quote(*s, 200);
  const auto& a = std::get<GgufArray>(v);
  std::string out = "[";
  for (size_t i = 0; i < a.values.size() && i < max_elems; ++i) {
    if (i) out += ", ";
    out += a.values[i].to_string(max_elems);
  }
  if (a.values.size() > max_elems) out += strprintf("%s... (%zu %s)", max_elems ? ", " : "", a.values.size(),
                                                    gguf_value_type_name(a.elem_type));
  return out + "]";
}

// ---- GgufTensor -----------------------------------------------------------------------

int64_t GgufTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // checked for overflow when the file was opened
  return n;
}

// ---- GgufFile -------------------------------------------------------------------------

GgufFile::~GgufFile() {
  if (owned_) {
    std::free(owned_);
  } else if (map_) {
    ::munmap(map_, size_);
  }
  if (fd_ >= 0) ::close(fd_);
}

void GgufFile::release_pages(const void* p, size_t n) const {
  if (!map_ || owned_ || n == 0) return;
  const auto b = reinterpret_cast<uintptr_t>(map_), e = b + size_;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + n;
  if (lo < b || hi > e) return;
  lo = (lo + page - 1) / page * page;  // whole pages only: a neighbour's bytes stay
  hi = hi / page * page;
  if (lo < hi) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);  // (advice: failure is harmless)
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  const char* p = path.c_str();

  // O_NONBLOCK: opening a FIFO by mistake must not wait for a writer (no-op for files).
  f->fd_ = ::open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f->fd_ < 0) fail("%s: cannot open GGUF file: %s", p, std::strerror(errno));
  struct stat st {};
  if (::fstat(f->fd_, &st) != 0) fail("%s: cannot stat GGUF file: %s", p, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("%s: not a regular file", p);
  if (st.st_size == 0) fail("%s: truncated file: empty (a GGUF header needs 24 bytes)", p);
  f->size_ = static_cast<size_t>(st.st_size);
  void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, f->fd_, 0);
  if (m == MAP_FAILED) fail("%s: cannot mmap %zu bytes: %s", p, f->size_, std::strerror(errno));
  f->map_ = m;
  ::close(f->fd_);  // the mapping stays valid without the descriptor
  f->fd_ = -1;
  f->parse();
  return f;
}

std::unique_ptr<GgufFile> GgufFile::from_memory(const std::string& name, const void* data, size_t size) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  if (size == 0) fail("%s: truncated file: empty (a GGUF header needs 24 bytes)", name.c_str());
  f->owned_ = std::aligned_alloc(64, (size + 63) / 64 * 64);
  if (!f->owned_) fail("%s: cannot allocate %zu bytes", name.c_str(), size);
  std::memcpy(f->owned_, data, size);
  f->map_ = f->owned_;
  f->size_ = size;
  f->parse();
  return f;
}

void GgufFile::parse() {
  GgufFile* f = this;
  const char* p = path_.c_str();
  const auto* base = static_cast<const uint8_t*>(f->map_);
  Cursor c(f->path_, base, f->size_);

  // Header.
  const uint32_t magic = c.pod<uint32_t>("header magic");
  if (magic != kMagic) {
    std::string shown;
    for (int i = 0; i < 4; ++i) shown += strprintf("%02x", base[i]);
    fail("%s: not a GGUF file (magic bytes %s, expected 47475546 \"GGUF\")", p, shown.c_str());
  }
  const uint32_t version = c.pod<uint32_t>("header version");
  if (version != 2 && version != 3) {
    if (__builtin_bswap32(version) == 2 || __builtin_bswap32(version) == 3)
      fail("%s: big-endian GGUF files are not supported", p);
    fail("%s: unsupported GGUF version %u (kvtrim reads versions 2 and 3)", p, version);
  }
  f->version_ = version;
  const uint64_t n_tensors = c.pod<uint64_t>("header tensor count");
  const uint64_t n_kv = c.pod<uint64_t>("header metadata count");
  // Smallest encodings: key/name length 8 + type 4 + value >= 1; name 8 + n_dims 4 + one dim 8
  // + type 4 + offset 8.
  constexpr uint64_t kMinKv = 13, kMinTensor = 32;
  if (n_kv > c.left() / kMinKv)
    fail("%s: metadata count %" PRIu64 " is larger than the %zu remaining bytes can hold (corrupt or truncated "
         "file)", p, n_kv, c.left());
  if (n_tensors > c.left() / kMinTensor || n_kv * kMinKv + n_tensors * kMinTensor > c.left())
    fail("%s: tensor count %" PRIu64 " (with %" PRIu64 " metadata entries) is larger than the %zu remaining bytes "
         "can hold (corrupt or truncated file)", p, n_tensors, n_kv, c.left());

  // Metadata.
  ParseState ps;
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.str(strprintf("metadata entry #%" PRIu64 " key", i));
    const std::string what = "metadata key '" + key + "'";
    const uint32_t t = c.pod<uint32_t>(what + " (value type)");
    if (!known_value_type(t)) fail("%s: %s has unknown value type %u", p, what.c_str(), t);
    GgufValue v = read_value(c, static_cast<GgufValueType>(t), what, 0, ps);
    if (f->kv_.count(key)) fail("%s: duplicate metadata key '%s'", p, key.c_str());
    f->kv_.emplace(std::move(key), std::move(v));
  }
  if (const GgufValue* a = f->find("general.alignment")) {
    if (a->type != GgufValueType::U32)
      fail("%s: metadata general.alignment must be u32, not %s", p, gguf_value_type_name(a->type));
    const uint64_t al = std::get<uint64_t>(a->v);
    if (al == 0 || (al & (al - 1)) != 0) fail("%s: general.alignment = %" PRIu64 " is not a power of two", p, al);
    f->alignment_ = al;
  } else {
    f->alignment_ = kGgufDefaultAlignment;
  }
  const uint64_t align = f->alignment_;

  // Tensor table.
  f->tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.str(strprintf("tensor #%" PRIu64 " name", i));
    const char* tn = t.name.c_str();
    const std::string what = "tensor '" + t.name + "'";
    if (f->tensor_index_.count(t.name)) fail("%s: duplicate tensor name '%s'", p, tn);
    const uint32_t n_dims = c.pod<uint32_t>(what + " (n_dims)");
    if (n_dims < 1 || n_dims > kMaxDims) fail("%s: tensor '%s' has n_dims = %u (1..%d allowed)", p, tn, n_dims, kMaxDims);
    int64_t n_elem = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const int64_t ne = c.pod<int64_t>(what + " (dims)");
      if (ne <= 0) fail("%s: tensor '%s' has dim %u = %" PRId64 " (must be > 0)", p, tn, d, ne);
      if (__builtin_mul_overflow(n_elem, ne, &n_elem))
        fail("%s: tensor '%s': element count overflows (dim %u = %" PRId64 ")", p, tn, d, ne);
      t.ne.push_back(ne);
    }
    const uint32_t type_id = c.pod<uint32_t>(what + " (type)");
    const auto tr = ggml_type_traits(type_id);
    if (!tr) fail("%s: tensor '%s' has unknown type id %u", p, tn, type_id);
    t.type = tr->type;
    if (t.ne[0] % tr->block_size != 0)
      fail("%s: tensor '%s' (%s): row length %" PRId64 " is not a multiple of the block size %" PRId64, p, tn,
           std::string(tr->name).c_str(), t.ne[0], tr->block_size);
    if (__builtin_mul_overflow(static_cast<uint64_t>(n_elem / tr->block_size), tr->type_size, &t.n_bytes))
      fail("%s: tensor '%s': byte size overflows", p, tn);
    t.offset = c.pod<uint64_t>(what + " (data offset)");
    if (t.offset % align != 0)
      fail("%s: tensor '%s': data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64, p, tn, t.offset,
           align);
    t.data = nullptr;
    f->tensor_index_.emplace(t.name, f->tensors_.size());
    f->tensors_.push_back(std::move(t));
  }

  // Data section.
  if (!f->tensors_.empty()) {
    const uint64_t data_start = (static_cast<uint64_t>(c.pos()) + align - 1) / align * align;
    if (data_start > f->size_)
      fail("%s: truncated file: data section starts at offset %" PRIu64 " but the file has %zu bytes", p,
           data_start, f->size_);
    const uint64_t data_size = f->size_ - data_start;
    for (auto& t : f->tensors_) {
      if (t.offset > data_size || t.n_bytes > data_size - t.offset)
        fail("%s: tensor '%s': data [%" PRIu64 ", %" PRIu64 ") of the data section is out of the file's bounds "
             "(data section holds %" PRIu64 " bytes; file truncated?)",
             p, t.name.c_str(), t.offset, t.offset + static_cast<uint64_t>(t.n_bytes), data_size);
      t.data = base + data_start + t.offset;
    }
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_.find(std::string(key));
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {
// Runs an accessor on a present value, prefixing errors with the path and key.
template <typename F>
auto keyed(const std::string& path, std::string_view key, const GgufValue* v, F f) -> decltype(f(*v)) {
  if (!v) fail("%s: missing metadata key '%.*s'", path.c_str(), static_cast<int>(key.size()), key.data());
  try {
    return f(*v);
  } catch (const Error& e) {
    fail("%s: metadata key '%.*s': %s", path.c_str(), static_cast<int>(key.size()), key.data(), e.what());
  }
}
}  // namespace

int64_t GgufFile::get_int(std::string_view key) const {
  return keyed(path_, key, find(key), [](const GgufValue& v) { return v.as_int(); });
}
double GgufFile::get_float(std::string_view key) const {
  return keyed(path_, key, find(key), [](const GgufValue& v) { return v.as_float(); });
}
const std::string& GgufFile::get_string(std::string_view key) const {
  return keyed(path_, key, find(key), [](const GgufValue& v) -> const std::string& { return v.as_string(); });
}
const GgufArray& GgufFile::get_array(std::string_view key) const {
  return keyed(path_, key, find(key), [](const GgufValue& v) -> const GgufArray& { return v.as_array(); });
}

// Optional getters: the default when the key is absent; a present value of the wrong type
// is still an error (a silently ignored hyperparameter would be worse).
int64_t GgufFile::get_int(std::string_view key, int64_t def) const {
  return find(key) ? get_int(key) : def;
}
double GgufFile::get_float(std::string_view key, double def) const {
  return find(key) ? get_float(key) : def;
}
std::string GgufFile::get_string(std::string_view key, const std::string& def) const {
  return find(key) ? get_string(key) : def;
}
bool GgufFile::get_bool(std::string_view key, bool def) const {
  return find(key) ? keyed(path_, key, find(key), [](const GgufValue& v) { return v.as_bool(); }) : def;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) fail("%s: missing tensor '%.*s'", path_.c_str(), static_cast<int>(name.size()), name.data());
  return *t;
}

}  // namespace kvtrim
