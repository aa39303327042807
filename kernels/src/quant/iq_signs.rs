//! The sign bytes of GGML's grid formats (IQ2_XXS, IQ2_XS, IQ3_XXS): a
//! 7-bit field gives the signs of eight weights (bit j set: weight j is
//! negative), the eighth sign being the parity of the seven, so that every
//! group has an even number of negative weights. This is GGML's
//! `ksigns_iq2xs` table (a fact of the file format) as its rule.

/// The sign byte of a 7-bit field (bits above 6 are ignored).
#[inline(always)]
pub(crate) const fn ksign(bits: u32) -> u8 {
    let bits = (bits & 127) as u8;
    bits | (((bits.count_ones() & 1) as u8) << 7)
}

#[cfg(test)]
mod tests {
    use super::ksign;

    #[test]
    fn sign_bytes_are_ggmls_table() {
        // The first and last rows of GGML's `ksigns_iq2xs`.
        let first = [0, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141, 142, 15];
        let last = [240, 113, 114, 243, 116, 245, 246, 119, 120, 249, 250, 123, 252, 125, 126, 255];
        assert_eq!(first, std::array::from_fn(|i| ksign(i as u32)));
        assert_eq!(last, std::array::from_fn(|i| ksign(112 + i as u32)));
        for bits in 0..128 {
            assert_eq!(ksign(bits).count_ones() % 2, 0, "{bits}: an even number of signs");
            assert_eq!(u32::from(ksign(bits) & 127), bits);
        }
    }
}
