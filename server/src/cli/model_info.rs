//! `sluice model info FILE`: what sluice makes of a file (its shards, its
//! family and each layer's kind, its weight types, or why it is refused),
//! then the metadata and the tensor table.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::bail;
use sluice::startup::load_model;
use sluice_kernels::backend::Device;
use sluice_model::gguf::{GgufFile, MetaArray, MetaValue};
use sluice_model::inspect::{self, Summary};

/// `load`: also load every tensor on the CPU, as `serve` would, so a
/// missing or misshapen tensor is named (this takes the model's size in
/// memory, and the time to read it).
pub fn model_info(path: &Path, load: bool) -> anyhow::Result<()> {
    let file = GgufFile::open(path).map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
    println!(
        "{}: GGUF v{}, {} metadata entries, {} tensors",
        path.display(),
        file.version,
        file.metadata().len(),
        file.tensors().len()
    );
    print_shards(&file);
    let summary = inspect::summarize(&file);
    match &summary {
        Ok(summary) => print_summary(summary),
        Err(error) => println!("family: refused: {error}"),
    }
    println!("weight types: {}", weight_types(&file));
    println!();
    for (key, value) in file.metadata() {
        println!("{key} = {}", describe(value));
    }
    println!();
    println!("{:<40} {:>6} {:>24} {:>12}", "tensor", "type", "shape", "bytes");
    let mut total = 0usize;
    for tensor in file.tensors() {
        let shape = tensor.dims.iter().map(u64::to_string).collect::<Vec<_>>().join(" × ");
        println!("{:<40} {:>6} {:>24} {:>12}", tensor.name, tensor.dtype.name(), shape, tensor.len);
        total += tensor.len;
    }
    println!("{:<40} {:>6} {:>24} {:>12}", "total", "", "", total);
    if let Err(error) = summary {
        bail!("{}: sluice does not run this file: {error}", path.display());
    }
    if load {
        drop(file);
        load_model(path, Device::Cpu, 0, &[])
            .map_err(|error| anyhow::anyhow!("sluice does not run this file: {error}"))?;
        println!();
        println!("load: every tensor loaded on the CPU");
    }
    Ok(())
}

fn print_shards(file: &GgufFile) {
    if file.split().is_empty() {
        return;
    }
    println!("split into {} shards:", file.split().len());
    for (index, path) in file.split().iter().enumerate() {
        let tensors = file.tensors().iter().filter(|tensor| tensor.shard == index);
        let (count, bytes) = tensors.fold((0, 0), |(count, bytes), tensor| (count + 1, bytes + tensor.len));
        println!("  {}: {count} tensors, {bytes} bytes", path.display());
    }
}

fn print_summary(summary: &Summary) {
    println!("family: {}", summary.family);
    println!("layers: {}", summary.n_layer);
    for (kind, indices) in &summary.layers {
        println!("  {}: {kind}", inspect::ranges(indices));
    }
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
