//! ggml's names for tensor type ids, so a file sluice refuses names the
//! type it uses as llama.cpp's tools do. The ids and names are those of the
//! GGUF format (ggml's `ggml_type` enum); ids ggml retired are absent.

/// ggml's name for a tensor type id, known or not to sluice.
pub fn ggml_type_name(type_id: u32) -> Option<&'static str> {
    Some(match type_id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        40 => "NVFP4",
        41 => "Q1_0",
        42 => "Q2_0",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use sluice_kernels::quant::DType;

    use super::ggml_type_name;

    #[test]
    fn every_type_sluice_reads_has_its_own_name() {
        for type_id in 0..64 {
            if let Some(dtype) = DType::from_ggml(type_id) {
                assert_eq!(ggml_type_name(type_id), Some(dtype.name()), "type {type_id}");
            }
        }
        assert_eq!(ggml_type_name(4), None, "Q4_2 was retired");
    }
}
