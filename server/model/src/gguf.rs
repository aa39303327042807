//! GGUF v3 (and v2) reader over a memory map. Every count, length, offset,
//! size and alignment is checked against the file before it is used, so a
//! corrupt or hostile file gives an error naming the field — never a panic
//! or an allocation sized by the file.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_kernels::backend::SharedBytes;
use sluice_kernels::quant::DType;

mod ggml_types;
mod split;

pub use ggml_types::ggml_type_name;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;
/// Most entries reserved before they are read. A count is checked against
/// the file's size, but an entry takes several times its smallest size on
/// disk once in memory, so reserving for a claimed count would still
/// allocate several times the file before the first entry failed.
const MAX_RESERVED: usize = 1024;

/// What went wrong reading a GGUF file. Messages name the field.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: cannot open: {error}")]
    Open { path: PathBuf, error: std::io::Error },
    #[error("not a GGUF file (magic {found:?}, expected \"GGUF\")")]
    BadMagic { found: [u8; 4] },
    #[error("GGUF version {0} is not supported (2 and 3 are)")]
    Version(u32),
    #[error("truncated: {field} at byte {offset} needs {needed} bytes, the file has {available} left")]
    Truncated { field: String, offset: usize, needed: u64, available: usize },
    #[error("{field} = {value} is absurd for a file of {file_len} bytes")]
    AbsurdCount { field: String, value: u64, file_len: usize },
    #[error("{field}: invalid UTF-8")]
    Utf8 { field: String },
    #[error("{field}: unknown metadata value type {type_id}")]
    ValueType { field: String, type_id: u32 },
    #[error("{field}: nested arrays are not supported")]
    NestedArray { field: String },
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    #[error("tensor {tensor:?}: {problem}")]
    Tensor { tensor: String, problem: String },
    #[error("tensors {first:?} and {second:?} overlap in the data section")]
    Overlap { first: String, second: String },
    #[error("general.alignment = {0} must be a power of two between 1 and 65536")]
    Alignment(u64),
    #[error("missing metadata key {0:?}")]
    MissingKey(String),
    #[error("metadata {key:?}: expected {expected}, found {found}")]
    WrongType { key: String, expected: &'static str, found: String },
    /// A split model whose shards do not fit together.
    #[error("{}: {problem}", path.display())]
    Split { path: PathBuf, problem: String },
    #[error("shard {no} of {count} of a split model read from memory: the other shards are found by path")]
    SplitInMemory { no: u32, count: u32 },
    /// A split model's shard that is not a valid GGUF file.
    #[error("{}: {source}", path.display())]
    Shard {
        path: PathBuf,
        #[source]
        source: Box<GgufError>,
    },
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(MetaArray),
}

/// A metadata array (homogeneous).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaArray {
    Ints(Vec<i64>),
    /// Unsigned 64-bit values above `i64::MAX`, kept exact.
    U64s(Vec<u64>),
    Floats(Vec<f64>),
    Bools(Vec<bool>),
    Strs(Vec<String>),
}

impl MetaArray {
    pub fn len(&self) -> usize {
        match self {
            MetaArray::Ints(values) => values.len(),
            MetaArray::U64s(values) => values.len(),
            MetaArray::Floats(values) => values.len(),
            MetaArray::Bools(values) => values.len(),
            MetaArray::Strs(values) => values.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl MetaValue {
    fn type_name(&self) -> String {
        match self {
            MetaValue::U8(_) => "u8".into(),
            MetaValue::I8(_) => "i8".into(),
            MetaValue::U16(_) => "u16".into(),
            MetaValue::I16(_) => "i16".into(),
            MetaValue::U32(_) => "u32".into(),
            MetaValue::I32(_) => "i32".into(),
            MetaValue::U64(_) => "u64".into(),
            MetaValue::I64(_) => "i64".into(),
            MetaValue::F32(_) => "f32".into(),
            MetaValue::F64(_) => "f64".into(),
            MetaValue::Bool(_) => "bool".into(),
            MetaValue::Str(_) => "string".into(),
            MetaValue::Array(array) => format!("array of {}", array.len()),
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(value) => Some(value.into()),
            MetaValue::I8(value) => Some(value.into()),
            MetaValue::U16(value) => Some(value.into()),
            MetaValue::I16(value) => Some(value.into()),
            MetaValue::U32(value) => Some(value.into()),
            MetaValue::I32(value) => Some(value.into()),
            MetaValue::U64(value) => i64::try_from(value).ok(),
            MetaValue::I64(value) => Some(value),
            _ => None,
        }
    }
}

/// A tensor's element type: a weight format the kernels read, or plain
/// integers (index maps, such as a DFlash draft's `d2t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorType {
    Weights(DType),
    I32,
    I64,
}

impl TensorType {
    fn from_ggml(type_id: u32) -> Option<Self> {
        match type_id {
            26 => Some(TensorType::I32),
            27 => Some(TensorType::I64),
            other => DType::from_ggml(other).map(TensorType::Weights),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TensorType::Weights(dtype) => dtype.name(),
            TensorType::I32 => "I32",
            TensorType::I64 => "I64",
        }
    }

    /// The weight format, if this is one.
    pub fn weights(self) -> Option<DType> {
        match self {
            TensorType::Weights(dtype) => Some(dtype),
            TensorType::I32 | TensorType::I64 => None,
        }
    }

    fn row_bytes(self, n: usize) -> Option<usize> {
        match self {
            TensorType::Weights(dtype) => dtype.row_bytes(n),
            TensorType::I32 => n.checked_mul(4),
            TensorType::I64 => n.checked_mul(8),
        }
    }
}

/// One tensor's descriptor, validated against the data section.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions, innermost first (as GGUF stores them).
    pub dims: Vec<u64>,
    pub dtype: TensorType,
    /// Which file of a split model holds it (0 for a single file).
    pub shard: usize,
    /// Byte range in that file.
    pub start: usize,
    pub len: usize,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl AsRef<[u8]> for Storage {
    fn as_ref(&self) -> &[u8] {
        match self {
            Storage::Mapped(map) => map,
            Storage::Owned(bytes) => bytes,
        }
    }
}

/// An open GGUF file: metadata in memory, tensor data borrowed from the map
/// (shared with the backend that computes on it). A split model is one
/// `GgufFile` whose tensors live in several maps, one per shard.
pub struct GgufFile {
    /// One per shard, indexed by [`TensorInfo::shard`].
    storage: Vec<Arc<Storage>>,
    /// The shards' paths, in order, when the model is split.
    split: Vec<PathBuf>,
    pub version: u32,
    metadata: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// Which tensors [`GgufFile::tensor`] found, by index: a loader's
    /// record of what it read (see [`GgufFile::unread_tensors`]).
    looked_up: std::sync::Mutex<Vec<bool>>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    fn map_one(path: &Path, options: &memmap2::MmapOptions) -> Result<Self, GgufError> {
        let open_error = |error| GgufError::Open { path: path.to_owned(), error };
        let file = std::fs::File::open(path).map_err(open_error)?;
        // SAFETY: the map is read-only and private to this process; a file
        // changed underneath a running server is outside what we defend
        // against (as with any mmap-based loader), and every read goes
        // through bounds checks against the map's length.
        let map = unsafe { options.map(&file) }.map_err(open_error)?;
        Self::parse(Storage::Mapped(map))
    }

    fn parse(storage: Storage) -> Result<Self, GgufError> {
        let bytes: &[u8] = storage.as_ref();
        let mut reader = Reader { bytes, offset: 0 };
        let magic = reader.take("magic", 4)?;
        if magic != MAGIC {
            let mut found = [0; 4];
            found.copy_from_slice(magic);
            return Err(GgufError::BadMagic { found });
        }
        let version = reader.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version(version));
        }
        // Each tensor descriptor takes at least 24 bytes and each key/value
        // pair at least 12: a count beyond that cannot be real.
        let tensor_count = reader.count("tensor_count", 24)?;
        let kv_count = reader.count("metadata_kv_count", 12)?;

        let mut metadata = Vec::with_capacity(kv_count.min(MAX_RESERVED));
        let mut index = HashMap::with_capacity(kv_count.min(MAX_RESERVED));
        for entry in 0..kv_count {
            let key = reader.string(&format!("metadata[{entry}].key"))?;
            let value = reader.value(&key)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.push((key, value));
        }

        let alignment = match index.get("general.alignment").map(|&at| &metadata[at].1) {
            None => DEFAULT_ALIGNMENT,
            Some(value) => {
                let alignment = value.as_i64().and_then(|value| u64::try_from(value).ok()).unwrap_or(0);
                if !alignment.is_power_of_two() || alignment > 65536 {
                    return Err(GgufError::Alignment(alignment));
                }
                alignment
            }
        };

        let mut raw_tensors = Vec::with_capacity(tensor_count.min(MAX_RESERVED));
        for entry in 0..tensor_count {
            let name = reader.string(&format!("tensor[{entry}].name"))?;
            let n_dims = reader.u32(&format!("tensor {name:?} n_dims"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(tensor_error(&name, format!("n_dims = {n_dims}, must be 1..={MAX_DIMS}")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for dim in 0..n_dims {
                dims.push(reader.u64(&format!("tensor {name:?} dims[{dim}]"))?);
            }
            let type_id = reader.u32(&format!("tensor {name:?} type"))?;
            let offset = reader.u64(&format!("tensor {name:?} offset"))?;
            raw_tensors.push((name, dims, type_id, offset));
        }

        let data_start = align_up(reader.offset as u64, alignment)
            .filter(|start| *start <= bytes.len() as u64)
            .ok_or_else(|| GgufError::Truncated {
                field: "data section".into(),
                offset: reader.offset,
                needed: alignment,
                available: bytes.len().saturating_sub(reader.offset),
            })?;
        let data_len = bytes.len() as u64 - data_start;

        let mut tensors = Vec::with_capacity(raw_tensors.len());
        let mut tensor_index = HashMap::with_capacity(raw_tensors.len());
        for (name, dims, type_id, offset) in raw_tensors {
            let info = tensor_info(name, dims, type_id, offset, alignment, data_start, data_len)?;
            if tensor_index.insert(info.name.clone(), tensors.len()).is_some() {
                return Err(tensor_error(&info.name, "appears twice".into()));
            }
            tensors.push(info);
        }
        let mut by_start: Vec<&TensorInfo> = tensors.iter().filter(|tensor| tensor.len > 0).collect();
        by_start.sort_by_key(|tensor| tensor.start);
        for pair in by_start.windows(2) {
            if pair[0].start + pair[0].len > pair[1].start {
                return Err(GgufError::Overlap { first: pair[0].name.clone(), second: pair[1].name.clone() });
            }
        }

        let storage = vec![Arc::new(storage)];
        let looked_up = std::sync::Mutex::new(Vec::new());
        Ok(GgufFile { storage, split: Vec::new(), version, metadata, index, tensors, tensor_index, looked_up })
    }

    /// The shards' paths in order when the model is split (empty for a
    /// single file).
    pub fn split(&self) -> &[PathBuf] {
        &self.split
    }

    /// All metadata entries in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// Set a metadata value in memory (draft fixups); the file is never
    /// written.
    pub fn set_metadata(&mut self, key: &str, value: MetaValue) {
        match self.index.get(key) {
            Some(&at) => self.metadata[at].1 = value,
            None => {
                self.index.insert(key.to_owned(), self.metadata.len());
                self.metadata.push((key.to_owned(), value));
            }
        }
    }

    /// Remove a metadata key in memory (absent keys are not an error).
    pub fn remove_metadata(&mut self, key: &str) {
        if let Some(at) = self.index.remove(key) {
            self.metadata.remove(at);
            for position in self.index.values_mut() {
                if *position > at {
                    *position -= 1;
                }
            }
        }
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.index.get(key).map(|&at| &self.metadata[at].1)
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey(key.into()))
    }

    fn wrong(key: &str, expected: &'static str, found: &MetaValue) -> GgufError {
        GgufError::WrongType { key: key.into(), expected, found: found.type_name() }
    }

    /// A string value.
    pub fn str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            MetaValue::Str(value) => Ok(value),
            other => Err(Self::wrong(key, "a string", other)),
        }
    }

    /// An optional string value.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        if self.get(key).is_none() { Ok(None) } else { self.str(key).map(Some) }
    }

    /// A non-negative integer that fits in u32.
    pub fn u32(&self, key: &str) -> Result<u32, GgufError> {
        let value = self.require(key)?;
        value
            .as_i64()
            .and_then(|value| u32::try_from(value).ok())
            .ok_or_else(|| Self::wrong(key, "an integer 0..2^32", value))
    }

    /// An optional u32.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        if self.get(key).is_none() { Ok(None) } else { self.u32(key).map(Some) }
    }

    /// A float (f32, f64 or an integer).
    pub fn f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            MetaValue::F32(value) => Ok(*value),
            MetaValue::F64(value) => Ok(*value as f32),
            other => other.as_i64().map(|value| value as f32).ok_or_else(|| Self::wrong(key, "a number", other)),
        }
    }

    /// An optional float.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        if self.get(key).is_none() { Ok(None) } else { self.f32(key).map(Some) }
    }

    /// An optional boolean.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(MetaValue::Bool(value)) => Ok(Some(*value)),
            Some(other) => Err(Self::wrong(key, "a boolean", other)),
        }
    }

    /// An array value.
    pub fn array(&self, key: &str) -> Result<&MetaArray, GgufError> {
        match self.require(key)? {
            MetaValue::Array(array) => Ok(array),
            other => Err(Self::wrong(key, "an array", other)),
        }
    }

    /// An array of strings.
    pub fn strs(&self, key: &str) -> Result<&[String], GgufError> {
        match self.array(key)? {
            MetaArray::Strs(values) => Ok(values),
            other => Err(Self::wrong(key, "an array of strings", &MetaValue::Array(other.clone()))),
        }
    }

    /// An array of integers.
    pub fn ints(&self, key: &str) -> Result<&[i64], GgufError> {
        match self.array(key)? {
            MetaArray::Ints(values) => Ok(values),
            MetaArray::Strs(values) if values.is_empty() => Ok(&[]),
            other => Err(Self::wrong(key, "an array of integers", &MetaValue::Array(other.clone()))),
        }
    }

    /// An array of floats (integers are converted).
    pub fn floats(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        match self.array(key)? {
            MetaArray::Floats(values) => Ok(values.iter().map(|value| *value as f32).collect()),
            MetaArray::Ints(values) => Ok(values.iter().map(|value| *value as f32).collect()),
            other => Err(Self::wrong(key, "an array of numbers", &MetaValue::Array(other.clone()))),
        }
    }

    /// All tensors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let at = *self.tensor_index.get(name)?;
        let mut looked_up = self.looked_up.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        looked_up.resize(self.tensors.len(), false);
        looked_up[at] = true;
        Some(&self.tensors[at])
    }

    /// The tensors no [`GgufFile::tensor`] call has asked for: after a
    /// model's load, those it does not use.
    pub fn unread_tensors(&self) -> Vec<&TensorInfo> {
        let looked_up = self.looked_up.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.tensors
            .iter()
            .enumerate()
            .filter(|(at, _)| !looked_up.get(*at).copied().unwrap_or(false))
            .map(|(_, t)| t)
            .collect()
    }

    /// The bytes of a tensor (validated at parse time).
    pub fn data(&self, tensor: &TensorInfo) -> &[u8] {
        let shard: &[u8] = (*self.storage[tensor.shard]).as_ref();
        &shard[tensor.start..tensor.start + tensor.len]
    }

    /// The bytes of a tensor, held for as long as the caller keeps them
    /// (a backend's resident weights).
    pub fn shared_data(&self, tensor: &TensorInfo) -> Option<SharedBytes> {
        let storage: Arc<dyn AsRef<[u8]> + Send + Sync> = self.storage.get(tensor.shard)?.clone();
        SharedBytes::new(storage, tensor.start..tensor.start + tensor.len)
    }

    /// An integer tensor's values; `None` for weight tensors.
    pub fn integers(&self, tensor: &TensorInfo) -> Option<Vec<i64>> {
        let data = self.data(tensor);
        match tensor.dtype {
            TensorType::I32 => {
                Some(data.chunks_exact(4).map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect())
            }
            TensorType::I64 => Some(
                data.chunks_exact(8)
                    .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                    .collect(),
            ),
            TensorType::Weights(_) => None,
        }
    }

    /// Reads every page of tensor data once, so the first requests do not
    /// stall on page faults of a cold map; `progress(done, total)` is
    /// called with byte counts as it goes (every 16 MiB and at the end).
    pub fn prefault(&self, mut progress: impl FnMut(u64, u64)) {
        const PAGE: usize = 4096;
        const REPORT: usize = 16 << 20;
        let total: u64 = self.tensors.iter().map(|tensor| tensor.len as u64).sum();
        let mut done = 0u64;
        let mut touched = 0u8;
        for tensor in &self.tensors {
            for chunk in self.data(tensor).chunks(REPORT) {
                for page in chunk.chunks(PAGE) {
                    touched ^= page[0];
                }
                done += chunk.len() as u64;
                progress(done, total);
            }
        }
        // Keeps the reads from being optimized away.
        std::hint::black_box(touched);
    }
}

fn tensor_error(name: &str, problem: String) -> GgufError {
    GgufError::Tensor { tensor: name.into(), problem }
}

fn align_up(value: u64, alignment: u64) -> Option<u64> {
    value.checked_add(alignment - 1).map(|value| value / alignment * alignment)
}

fn tensor_info(
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    offset: u64,
    alignment: u64,
    data_start: u64,
    data_len: u64,
) -> Result<TensorInfo, GgufError> {
    let dtype = TensorType::from_ggml(type_id).ok_or_else(|| {
        let problem = match ggml_type_name(type_id) {
            Some(known) => format!("weight type {known} (type {type_id}) is not supported"),
            None => format!("unknown tensor type {type_id}"),
        };
        tensor_error(&name, problem)
    })?;
    if dims.contains(&0) {
        return Err(tensor_error(&name, format!("dims {dims:?} contain a zero")));
    }
    let elements = dims
        .iter()
        .try_fold(1u64, |total, dim| total.checked_mul(*dim))
        .filter(|elements| *elements <= data_len.saturating_mul(8))
        .ok_or_else(|| tensor_error(&name, format!("dims {dims:?} are absurd for the data section")))?;
    let rows = elements / dims[0];
    let row_bytes = usize::try_from(dims[0]).ok().and_then(|n| dtype.row_bytes(n)).ok_or_else(|| {
        tensor_error(&name, format!("first dimension {} is not a multiple of the {} block size", dims[0], dtype.name()))
    })?;
    let len =
        (row_bytes as u64).checked_mul(rows).ok_or_else(|| tensor_error(&name, format!("dims {dims:?} overflow")))?;
    if !offset.is_multiple_of(alignment) {
        return Err(tensor_error(&name, format!("offset {offset} is not aligned to {alignment}")));
    }
    if offset.checked_add(len).is_none_or(|end| end > data_len) {
        return Err(tensor_error(
            &name,
            format!("data [{offset}, {offset}+{len}) runs past the end of the data section ({data_len} bytes)"),
        ));
    }
    Ok(TensorInfo { name, dims, dtype, shard: 0, start: (data_start + offset) as usize, len: len as usize })
}

struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn available(&self) -> usize {
        self.bytes.len() - self.offset
    }

    fn take(&mut self, field: &str, len: u64) -> Result<&'a [u8], GgufError> {
        let available = self.available();
        if len > available as u64 {
            return Err(GgufError::Truncated { field: field.into(), offset: self.offset, needed: len, available });
        }
        let start = self.offset;
        self.offset += len as usize;
        Ok(&self.bytes[start..self.offset])
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N], GgufError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(field, N as u64)?);
        Ok(out)
    }

    fn u32(&mut self, field: &str) -> Result<u32, GgufError> {
        self.array(field).map(u32::from_le_bytes)
    }

    fn u64(&mut self, field: &str) -> Result<u64, GgufError> {
        self.array(field).map(u64::from_le_bytes)
    }

    /// A count of items each at least `min_item_bytes` long, bounded by what
    /// the rest of the file could hold.
    fn count(&mut self, field: &str, min_item_bytes: u64) -> Result<usize, GgufError> {
        let value = self.u64(field)?;
        if value.saturating_mul(min_item_bytes) > self.available() as u64 {
            return Err(GgufError::AbsurdCount { field: field.into(), value, file_len: self.bytes.len() });
        }
        Ok(value as usize)
    }

    fn string(&mut self, field: &str) -> Result<String, GgufError> {
        let len = self.u64(field)?;
        let bytes = self.take(field, len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::Utf8 { field: field.into() })
    }

    fn value(&mut self, key: &str) -> Result<MetaValue, GgufError> {
        let type_id = self.u32(key)?;
        if type_id == 9 {
            return self.meta_array(key).map(MetaValue::Array);
        }
        self.scalar(key, type_id)
    }

    fn scalar(&mut self, key: &str, type_id: u32) -> Result<MetaValue, GgufError> {
        Ok(match type_id {
            0 => MetaValue::U8(self.array::<1>(key)?[0]),
            1 => MetaValue::I8(self.array::<1>(key)?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(key)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => MetaValue::Bool(self.array::<1>(key)?[0] != 0),
            8 => MetaValue::Str(self.string(key)?),
            10 => MetaValue::U64(u64::from_le_bytes(self.array(key)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(key)?)),
            9 => return Err(GgufError::NestedArray { field: key.into() }),
            type_id => return Err(GgufError::ValueType { field: key.into(), type_id }),
        })
    }

    fn meta_array(&mut self, key: &str) -> Result<MetaArray, GgufError> {
        let element_type = self.u32(key)?;
        let min_bytes = match element_type {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => return Err(GgufError::NestedArray { field: key.into() }),
            type_id => return Err(GgufError::ValueType { field: key.into(), type_id }),
        };
        let len = self.count(&format!("{key} (array length)"), min_bytes)?;
        let field = |index: usize| format!("{key}[{index}]");
        Ok(match element_type {
            8 => MetaArray::Strs((0..len).map(|index| self.string(&field(index))).collect::<Result<_, _>>()?),
            7 => MetaArray::Bools(
                (0..len).map(|index| Ok(self.array::<1>(&field(index))?[0] != 0)).collect::<Result<_, _>>()?,
            ),
            6 => {
                MetaArray::Floats(
                    (0..len)
                        .map(|index| Ok(f64::from(f32::from_le_bytes(self.array(&field(index))?))))
                        .collect::<Result<_, GgufError>>()?,
                )
            }
            12 => MetaArray::Floats(
                (0..len)
                    .map(|index| Ok(f64::from_le_bytes(self.array(&field(index))?)))
                    .collect::<Result<_, GgufError>>()?,
            ),
            10 => {
                let values: Vec<u64> = (0..len).map(|index| self.u64(&field(index))).collect::<Result<_, _>>()?;
                match values.iter().map(|value| i64::try_from(*value)).collect::<Result<Vec<i64>, _>>() {
                    Ok(ints) => MetaArray::Ints(ints),
                    Err(_) => MetaArray::U64s(values),
                }
            }
            _ => MetaArray::Ints(
                (0..len)
                    .map(|index| {
                        let value = self.scalar(&field(index), element_type)?;
                        value
                            .as_i64()
                            .ok_or_else(|| GgufError::ValueType { field: field(index), type_id: element_type })
                    })
                    .collect::<Result<_, GgufError>>()?,
            ),
        })
    }
}
