//! Split models, as llama.cpp's `gguf-split` writes them: shards named
//! `PREFIX-00001-of-0000N.gguf` … `PREFIX-0000N-of-0000N.gguf`, each a
//! complete GGUF file (its own header, alignment and data section) carrying
//! `split.no` (0-based), `split.count` and `split.tensors.count`; the
//! model's metadata is in the first shard only. A model loads from its first
//! shard's path and finds the others by that naming rule, as llama-server
//! does.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::{GgufError, GgufFile, Storage};

const NO: &str = "split.no";
const COUNT: &str = "split.count";
const TENSORS: &str = "split.tensors.count";

/// Where a file sits in its split model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    /// 0-based.
    no: u16,
    count: u16,
}

impl Position {
    /// The file name suffix the naming rule gives this shard.
    fn suffix(self) -> String {
        format!("-{:05}-of-{:05}.gguf", u32::from(self.no) + 1, self.count)
    }
}

/// The split keys of a file; `None` for a file that is not a shard (no
/// `split.count`, or a count of 0 or 1, which llama.cpp loads as one file).
fn position(file: &GgufFile) -> Result<Option<Position>, GgufError> {
    let Some(count) = file.get(COUNT) else { return Ok(None) };
    let count = small(COUNT, count)?;
    if count <= 1 {
        return Ok(None);
    }
    Ok(Some(Position { no: small(NO, file.require(NO)?)?, count }))
}

/// A split key's value: gguf-split writes u16; any integer that fits is
/// taken.
fn small(key: &str, value: &super::MetaValue) -> Result<u16, GgufError> {
    value.as_i64().and_then(|value| u16::try_from(value).ok()).ok_or_else(|| GgufError::WrongType {
        key: key.into(),
        expected: "an integer 0..65536",
        found: value.type_name(),
    })
}

/// A file parsed from memory: a shard of a split model is refused, its
/// siblings having no path to be found by.
pub(super) fn whole(file: GgufFile) -> Result<GgufFile, GgufError> {
    match position(&file)? {
        None => Ok(file),
        Some(Position { no, count }) => {
            Err(GgufError::SplitInMemory { no: u32::from(no) + 1, count: u32::from(count) })
        }
    }
}

/// `first`, opened from `path`, with the rest of its split model when it is
/// the first shard of one: each other shard is found by the naming rule,
/// opened by `open`, and checked to belong (its index and count), and the
/// tensors of all are one table, no name twice, as many as
/// `split.tensors.count` says.
pub(super) fn join(
    mut first: GgufFile,
    path: &Path,
    open: impl Fn(&Path) -> Result<GgufFile, GgufError>,
) -> Result<GgufFile, GgufError> {
    let Some(place) = position(&first)? else { return Ok(first) };
    let split_error = |path: &Path, problem: String| GgufError::Split { path: path.to_owned(), problem };
    if place.no >= place.count {
        return Err(split_error(path, format!("{NO} = {} is not below {COUNT} = {}", place.no, place.count)));
    }
    let name = path.file_name().and_then(OsStr::to_str).unwrap_or_default();
    let prefix = name.strip_suffix(&place.suffix()).filter(|prefix| !prefix.is_empty());
    if place.no != 0 {
        let first_name = prefix.map_or_else(
            || format!("the file whose {NO} is 0"),
            |prefix| format!("{prefix}{}", Position { no: 0, ..place }.suffix()),
        );
        let problem = format!(
            "shard {} of {} of a split model; load the model from its first shard, {first_name}",
            u32::from(place.no) + 1,
            place.count
        );
        return Err(split_error(path, problem));
    }
    let Some(prefix) = prefix else {
        let problem = format!(
            "the first of {} shards must be named PREFIX{} for the others to be found",
            place.count,
            place.suffix()
        );
        return Err(split_error(path, problem));
    };
    let expected_tensors = first.require(TENSORS)?;
    let expected_tensors = expected_tensors
        .as_i64()
        .and_then(|count| usize::try_from(count).ok())
        .ok_or_else(|| GgufFile::wrong(TENSORS, "a tensor count", expected_tensors))?;

    let mut paths = vec![path.to_owned()];
    for no in 1..place.count {
        let shard = Position { no, ..place };
        let shard_path = path.with_file_name(format!("{prefix}{}", shard.suffix()));
        let label = format!("shard {} of {}", u32::from(no) + 1, place.count);
        if !shard_path.is_file() {
            // The error names the missing file, and whoever loads names the first.
            return Err(split_error(&shard_path, format!("{label} is missing")));
        }
        let in_shard = |error| GgufError::Shard { path: shard_path.clone(), source: Box::new(error) };
        let file = open(&shard_path).map_err(in_shard)?;
        match position(&file).map_err(in_shard)? {
            Some(found) if found == shard => {}
            found => {
                let (found_no, found_count) = found.map_or((0, 1), |found| (found.no, found.count));
                let problem = if found_count != place.count {
                    format!(
                        "{COUNT} = {found_count}, but {} says {}: a shard of another split",
                        path.display(),
                        place.count
                    )
                } else {
                    format!("{NO} = {found_no}, but the file named as {label} must say {no}")
                };
                return Err(split_error(&shard_path, problem));
            }
        }
        adopt(&mut first, file, paths.len(), &paths).map_err(|problem| split_error(&shard_path, problem))?;
        paths.push(shard_path);
    }
    if first.tensors.len() != expected_tensors {
        let problem = format!(
            "{TENSORS} = {expected_tensors}, but the {} shards hold {} tensors",
            place.count,
            first.tensors.len()
        );
        return Err(split_error(path, problem));
    }
    first.split = paths;
    Ok(first)
}

/// Moves `shard`'s tensors and data into `into` as shard number `index`;
/// a tensor name already there is refused, naming the shard that has it.
fn adopt(into: &mut GgufFile, shard: GgufFile, index: usize, paths: &[PathBuf]) -> Result<(), String> {
    let Some(storage) = shard.storage.into_iter().next() else { return Err("a shard with no data".into()) };
    for mut tensor in shard.tensors {
        if let Some(&at) = into.tensor_index.get(&tensor.name) {
            let other = paths.get(into.tensors[at].shard).map_or_else(String::new, |path| path.display().to_string());
            return Err(format!("tensor {:?} is also in {other}", tensor.name));
        }
        tensor.shard = index;
        into.tensor_index.insert(tensor.name.clone(), into.tensors.len());
        into.tensors.push(tensor);
    }
    into.storage.push(storage);
    Ok(())
}

/// The entry points that open a file, here because a split model's first
/// shard brings the others.
impl GgufFile {
    /// Memory-map and parse a file; pages are read as tensors are first used.
    /// The first shard of a split model brings the others, found by name.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        Self::map(path, &memmap2::MmapOptions::new())
    }

    /// Memory-map and parse a file with every page read in now, for files
    /// whose tensors are all used by every request (a projector): the
    /// first image then pays no page faults, as with a loader that copies
    /// the weights into memory.
    pub fn open_resident(path: &Path) -> Result<Self, GgufError> {
        Self::map(path, memmap2::MmapOptions::new().populate())
    }

    fn map(path: &Path, options: &memmap2::MmapOptions) -> Result<Self, GgufError> {
        let first = Self::map_one(path, options)?;
        join(first, path, |shard| Self::map_one(shard, options))
    }

    /// Parse a file already in memory (a shard of a split model is
    /// refused: its siblings are found by path).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        whole(Self::parse(Storage::Owned(bytes))?)
    }
}

#[cfg(test)]
mod tests;
