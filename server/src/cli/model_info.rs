//! `sluice model info FILE`: what sluice makes of a file (its shards, its
//! family and each layer's kind, its weight types, or why it is refused),
//! then the metadata and the tensor table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use sluice::startup::load_model;
use sluice_kernels::backend::Device;
use sluice_model::gguf::{GgufFile, MetaArray, MetaValue};
use sluice_model::inspect::{self, Summary};

/// `load`: also load every tensor on the CPU, as `serve` would, so a
/// missing or misshapen tensor is named (this takes the model's size in
/// memory, and the time to read it).
pub fn model_info(path: &Path, load: bool) -> anyhow::Result<()> {
    let file = GgufFile::open(path).map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
    let mut out = String::new();
    writeln!(
        out,
        "{}: GGUF v{}, {} metadata entries, {} tensors",
        path.display(),
        file.version,
        file.metadata().len(),
        file.tensors().len()
    )?;
    write_shards(&mut out, &file)?;
    let summary = inspect::summarize(&file);
    match &summary {
        Ok(summary) => write_summary(&mut out, summary)?,
        Err(error) => writeln!(out, "family: refused: {error}")?,
    }
    writeln!(out, "weight types: {}\n", weight_types(&file))?;
    for (key, value) in file.metadata() {
        writeln!(out, "{key} = {}", describe(value))?;
    }
    writeln!(out, "\n{:<40} {:>6} {:>24} {:>12}", "tensor", "type", "shape", "bytes")?;
    let mut total = 0usize;
    for tensor in file.tensors() {
        let shape = tensor.dims.iter().map(u64::to_string).collect::<Vec<_>>().join(" × ");
        writeln!(out, "{:<40} {:>6} {:>24} {:>12}", tensor.name, tensor.dtype.name(), shape, tensor.len)?;
        total += tensor.len;
    }
    writeln!(out, "{:<40} {:>6} {:>24} {:>12}", "total", "", "", total)?;
    emit(&out)?;
    if let Err(error) = summary {
        bail!("{}: sluice does not run this file: {error}", path.display());
    }
    if load {
        drop(file);
        load_model(path, Device::Cpu, 0, &[])
            .map_err(|error| anyhow::anyhow!("sluice does not run this file: {error}"))?;
        emit("\nload: every tensor loaded on the CPU\n")?;
    }
    Ok(())
}

/// `text` on standard output. A reader that has gone (`| head`) is not an
/// error: what it wanted it has read.
fn emit(text: &str) -> anyhow::Result<()> {
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written.context("writing to standard output"),
    }
}

fn write_shards(out: &mut String, file: &GgufFile) -> std::fmt::Result {
    if file.split().is_empty() {
        return Ok(());
    }
    writeln!(out, "split into {} shards:", file.split().len())?;
    for (index, path) in file.split().iter().enumerate() {
        let tensors = file.tensors().iter().filter(|tensor| tensor.shard == index);
        let (count, bytes) = tensors.fold((0, 0), |(count, bytes), tensor| (count + 1, bytes + tensor.len));
        writeln!(out, "  {}: {count} tensors, {bytes} bytes", path.display())?;
    }
    Ok(())
}

fn write_summary(out: &mut String, summary: &Summary) -> std::fmt::Result {
    writeln!(out, "family: {}", summary.family)?;
    writeln!(out, "layers: {}", summary.n_layer)?;
    for (kind, indices) in &summary.layers {
        writeln!(out, "  {}: {kind}", inspect::ranges(indices))?;
    }
    Ok(())
}

/// `Q4_K × 120, F32 × 61`: most used first.
fn weight_types(file: &GgufFile) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for tensor in file.tensors() {
        *counts.entry(tensor.dtype.name()).or_default() += 1;
    }
    let mut counts: Vec<(&str, usize)> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    counts.iter().map(|(name, count)| format!("{name} × {count}")).collect::<Vec<_>>().join(", ")
}

/// Long arrays (vocabularies) are summarized, not dumped.
fn describe(value: &MetaValue) -> String {
    const SHOWN: usize = 8;
    fn list<T: std::fmt::Debug>(values: &[T]) -> String {
        let shown: Vec<String> = values.iter().take(SHOWN).map(|value| format!("{value:?}")).collect();
        let more = if values.len() > SHOWN { format!(", … ({} in all)", values.len()) } else { String::new() };
        format!("[{}{more}]", shown.join(", "))
    }
    match value {
        MetaValue::Str(text) if text.len() > 120 => {
            format!("{:?}… ({} bytes)", &text[..text.floor_char_boundary(120)], text.len())
        }
        MetaValue::Str(text) => format!("{text:?}"),
        MetaValue::Array(MetaArray::Ints(values)) => list(values),
        MetaValue::Array(MetaArray::U64s(values)) => list(values),
        MetaValue::Array(MetaArray::Floats(values)) => list(values),
        MetaValue::Array(MetaArray::Bools(values)) => list(values),
        MetaValue::Array(MetaArray::Strs(values)) => list(values),
        other => format!("{other:?}")
            .split('(')
            .nth(1)
            .map_or_else(|| format!("{other:?}"), |inner| inner.trim_end_matches(')').to_owned()),
    }
}
