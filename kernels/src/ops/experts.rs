//! Moving rows between a mixture of experts' groups and the rows of a
//! pass, and the weighted sum of each row's expert outputs. Element-wise
//! only (no reduction across lanes), so any vector width gives the same
//! bits as this code.

/// Row i of `x` into row `rows[i]` of `out` (rows of `width`); a row past
/// `out` or named twice is refused, and `out` is left as it was.
pub fn scatter_rows(x: &[f32], rows: &[usize], width: usize, out: &mut [f32]) -> Result<(), String> {
    let n_out = out.len().checked_div(width).unwrap_or(0);
    if x.len() != rows.len() * width {
        return Err(format!("{} values are not {} rows of {width}", x.len(), rows.len()));
    }
    let mut seen = vec![false; n_out];
    for &row in rows {
        match seen.get_mut(row) {
            Some(seen) if !*seen => *seen = true,
            Some(_) => return Err(format!("row {row} is named twice")),
            None => return Err(format!("row {row} of {n_out}")),
        }
    }
    for (&row, values) in rows.iter().zip(x.chunks_exact(width.max(1))) {
        out[row * width..(row + 1) * width].copy_from_slice(values);
    }
    Ok(())
}

/// Row r of `out` = `Σ_k weights[r·n + k] · parts[r·n + k]`, each product
/// rounded and then added in order of `k`; `out` is sized to the rows.
pub fn weighted_sum(parts: &[f32], weights: &[f32], n: usize, out: &mut Vec<f32>) -> Result<(), String> {
    let width = parts.len().checked_div(weights.len()).unwrap_or(0);
    if n == 0 || !weights.len().is_multiple_of(n) || width * weights.len() != parts.len() {
        return Err(format!("{} values and {} weights are not rows of {n} parts", parts.len(), weights.len()));
    }
    out.clear();
    out.resize(weights.len() / n * width, 0.0);
    for (r, row) in out.chunks_exact_mut(width.max(1)).enumerate() {
        for k in 0..n {
            let (part, weight) = (&parts[(r * n + k) * width..][..width], weights[r * n + k]);
            for (sum, &value) in row.iter_mut().zip(part) {
                // The first product is the sum so far: `0 + p` would turn
                // a product of -0 into +0.
                *sum = if k == 0 { value * weight } else { *sum + value * weight };
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{scatter_rows, weighted_sum};

    #[test]
    fn scattered_rows_land_where_named_and_bad_names_are_refused() {
        let mut out = vec![9.0; 6];
        scatter_rows(&[1.0, 2.0, 3.0, 4.0], &[2, 0], 2, &mut out).expect("fits");
        assert_eq!(out, [3.0, 4.0, 9.0, 9.0, 1.0, 2.0]);
        assert_eq!(scatter_rows(&[1.0, 2.0], &[3], 2, &mut out), Err("row 3 of 3".into()));
        assert_eq!(scatter_rows(&[0.0; 4], &[1, 1], 2, &mut out), Err("row 1 is named twice".into()));
        assert_eq!(scatter_rows(&[0.0; 3], &[1, 2], 2, &mut out), Err("3 values are not 2 rows of 2".into()));
        assert_eq!(out, [3.0, 4.0, 9.0, 9.0, 1.0, 2.0], "refusals leave it");
    }

    #[test]
    fn each_row_sums_its_weighted_parts_in_order() {
        // Two rows of three parts of width 2.
        let parts = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -1.0, 0.5, 1e8, 1.0, -1e8, -0.0];
        let weights = [0.5, 0.25, 0.25, 1.0, 1.0, 1.0];
        let mut out = Vec::new();
        weighted_sum(&parts, &weights, 3, &mut out).expect("shaped");
        let row0 = [0.5 + 0.75 + 1.25, 1.0 + 1.0 + 1.5];
        // (-1 + 1e8) - 1e8 in f32 is 0; (0.5 + 1) + -0 is 1.5.
        assert_eq!(out, [row0[0], row0[1], 0.0, 1.5]);
        weighted_sum(&[-0.0, 1.0], &[1.0], 1, &mut out).expect("shaped");
        assert!(out[0].is_sign_negative(), "a lone -0 product stays -0");
        assert!(weighted_sum(&parts, &weights, 4, &mut out).is_err());
        assert!(weighted_sum(&parts[..11], &weights, 3, &mut out).is_err());
        assert!(weighted_sum(&parts, &weights, 0, &mut out).is_err());
    }
}
