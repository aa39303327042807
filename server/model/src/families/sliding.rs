//! Which layers of a sliding-window family attend through the window,
//! read as llama.cpp reads it: `<arch>.attention.sliding_window_pattern`
//! is either one boolean per layer (true: windowed) or a period `P`, in
//! which layer `i` is windowed unless `i % P == P - 1` (every `P`-th layer
//! sees the whole sequence; `P = 0` windows them all).

use crate::gguf::{GgufFile, MetaArray, MetaValue};
use crate::hparams::{HParamsError, invalid};
use crate::layer::{Attention, OwnRope};

/// Whether each of `n_layer` layers is windowed; `period` when the file
/// names no pattern.
pub(super) fn windowed_layers(
    file: &GgufFile,
    arch: &str,
    n_layer: usize,
    period: u32,
) -> Result<Vec<bool>, HParamsError> {
    let key = format!("{arch}.attention.sliding_window_pattern");
    let period = match file.get(&key) {
        Some(MetaValue::Array(MetaArray::Bools(each))) if each.len() == n_layer => return Ok(each.clone()),
        Some(MetaValue::Array(array)) => {
            return Err(invalid(&key, format!("an array of {}", array.len()), format!("must be {n_layer} booleans")));
        }
        Some(_) => file.u32(&key)?,
        None => period,
    };
    Ok((0..n_layer).map(|layer| period == 0 || layer as u64 % u64::from(period) < u64::from(period) - 1).collect())
}

/// `attention` as a layer of `windowed_layers` has it: through a window of
/// `window` positions with its own RoPE (where it has one) if it is local.
pub(super) fn layer_attention(attention: Attention, local: bool, window: usize, rope: Option<OwnRope>) -> Attention {
    match local {
        true => Attention { window: Some(window), own_rope: rope, ..attention },
        false => attention,
    }
}

/// `<arch>.attention.sliding_window`: the window's positions, or `None`
/// when absent or 0 (no layer is windowed).
pub(super) fn window(file: &GgufFile, arch: &str) -> Result<Option<usize>, HParamsError> {
    Ok(file.opt_u32(&format!("{arch}.attention.sliding_window"))?.filter(|&window| window > 0).map(|w| w as usize))
}

#[cfg(test)]
mod tests {
    use sluice_tests::gguf_writer::{TinyModel, Value};

    use super::windowed_layers;
    use crate::gguf::GgufFile;

    #[test]
    fn a_period_leaves_every_last_layer_of_it_global_and_an_array_names_each() {
        let file = |pattern: Option<Value>| {
            let model = TinyModel::recipe("gemma3", 1).build();
            let model = match pattern {
                Some(value) => model.meta("gemma3.attention.sliding_window_pattern", value),
                None => model,
            };
            GgufFile::from_bytes(model.build()).expect("parses")
        };
        let windowed = |file: &GgufFile| windowed_layers(file, "gemma3", 7, 6).map_err(|error| error.to_string());
        let (t, f) = (true, false);
        assert_eq!(windowed(&file(None)), Ok(vec![t, t, t, t, t, f, t]));
        assert_eq!(windowed(&file(Some(Value::U32(2)))), Ok(vec![t, f, t, f, t, f, t]));
        assert_eq!(windowed(&file(Some(Value::U32(1)))), Ok(vec![f; 7]));
        assert_eq!(windowed(&file(Some(Value::U32(0)))), Ok(vec![t; 7]));
        let each = vec![f, t, f, f, t, t, f];
        assert_eq!(windowed(&file(Some(Value::Bools(each.clone())))), Ok(each));
        assert_eq!(
            windowed(&file(Some(Value::Bools(vec![t; 3])))),
            Err("gemma3.attention.sliding_window_pattern = an array of 3: must be 7 booleans".into())
        );
    }
}
