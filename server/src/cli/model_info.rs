//! `sluice model info FILE`: metadata and the tensor table.

use std::path::Path;

use sluice_model::gguf::{GgufFile, MetaArray, MetaValue};

pub fn model_info(path: &Path) -> anyhow::Result<()> {
    let file = GgufFile::open(path).map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
    println!(
        "{}: GGUF v{}, {} metadata entries, {} tensors",
        path.display(),
        file.version,
        file.metadata().len(),
        file.tensors().len()
    );
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
    Ok(())
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
