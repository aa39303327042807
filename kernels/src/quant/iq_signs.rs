//! The sign table the 2- and 3-bit i-quants share (IQ2_XXS, IQ2_XS,
//! IQ3_XXS): a 7-bit field stored in a block names the signs of a group of
//! eight values, and the eighth sign is implied by the group having an even
//! number of negative values. Entry `i` is the full sign byte (bit `j` set:
//! element `j` negated).

/// GGML's `ksigns_iq2xs` (ggml-common.h of the GGML file formats): `i` with
/// bit 7 set to the parity of `i`'s bits, so that every entry has an even
/// number of set bits.
#[rustfmt::skip]
pub(crate) const KSIGNS_IQ2XS: [u8; 128] = [
    0, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141, 142, 15,
    144, 17, 18, 147, 20, 149, 150, 23, 24, 153, 154, 27, 156, 29, 30, 159,
    160, 33, 34, 163, 36, 165, 166, 39, 40, 169, 170, 43, 172, 45, 46, 175,
    48, 177, 178, 51, 180, 53, 54, 183, 184, 57, 58, 187, 60, 189, 190, 63,
    192, 65, 66, 195, 68, 197, 198, 71, 72, 201, 202, 75, 204, 77, 78, 207,
    80, 209, 210, 83, 212, 85, 86, 215, 216, 89, 90, 219, 92, 221, 222, 95,
    96, 225, 226, 99, 228, 101, 102, 231, 232, 105, 106, 235, 108, 237, 238, 111,
    240, 113, 114, 243, 116, 245, 246, 119, 120, 249, 250, 123, 252, 125, 126, 255,
];

#[cfg(test)]
mod tests {
    use super::KSIGNS_IQ2XS;

    #[test]
    fn each_entry_is_its_index_with_an_even_parity_bit() {
        for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(usize::from(s & 0x7F), i);
            assert_eq!(s.count_ones() % 2, 0, "entry {i}");
        }
    }
}
