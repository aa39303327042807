//! The tower's forward pass on the backend: patch embedding, the ViT
//! blocks with 2-D rope (window attention where the projector has it), and
//! the 2 × 2 merger. Output row `i` is the image's row `i / nx`, column
//! `i % nx` of merged patches, `nx = width / (2 × patch)`.
//!
//! Patches are taken in merge order — for each 2 × 2 unit, row-major, its
//! four patches row-major — so each unit's four rows are adjacent and the
//! merger reads them as one row of four times the width. Attention is the
//! backend's `attend_within` over a pass whose sequences are the windows
//! (or the whole image): every row sees all of its sequence, as the
//! tower's bidirectional attention does. A unit is a block of 4 cells of
//! the KV store that a backend without a kernel of its own attends
//! through.

use sluice_kernels::backend::{Backend, BackendError, KvShape, KvTypes, PassLayout, PassRow, PassSequence};
use sluice_kernels::ops::Gelu;

use super::image::Prepared;
use super::projector::{Activation, Linear, Norm, Projector};

/// Cells of a KV block: one merge unit.
const UNIT: usize = 4;

/// Why an image could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("a {width} × {height} image is not a whole number of {side} × {side} merge units")]
    Shape { width: u32, height: u32, side: u32 },
    #[error("the vision tower failed on the backend: {0}")]
    Backend(#[from] BackendError),
}

/// An image's output rows: `nx × ny` rows of the text model's width.
#[derive(Clone, Debug, PartialEq)]
pub struct Encoded {
    pub nx: u32,
    pub ny: u32,
    pub rows: Vec<f32>,
}

impl<B: Backend> Projector<B> {
    /// Encode a prepared image.
    pub fn encode(&self, image: &Prepared) -> Result<Encoded, EncodeError> {
        let b = &*self.backend;
        let p = self.info.image.patch_size as usize;
        let side = 2 * p as u32;
        let (width, height) = (image.width, image.height);
        if width == 0 || height == 0 || !width.is_multiple_of(side) || !height.is_multiple_of(side) {
            return Err(EncodeError::Shape { width, height, side });
        }
        let (px, py) = (width as usize / p, height as usize / p);
        let (nx, ny) = (px / 2, py / 2);
        let n = px * py;
        let e = self.info.n_embd;
        // (patch row, patch column) of each cell, in merge order.
        let cells: Vec<(usize, usize)> = (0..ny)
            .flat_map(|uy| (0..nx).flat_map(move |ux| (0..UNIT).map(move |i| (2 * uy + i / 2, 2 * ux + i % 2))))
            .collect();
        let mut patches = Vec::with_capacity(n * 3 * p * p);
        let plane = width as usize * height as usize;
        for &(row, col) in &cells {
            for c in 0..3 {
                for y in row * p..(row + 1) * p {
                    let at = c * plane + y * width as usize + col * p;
                    patches.extend_from_slice(&image.pixels[at..at + p]);
                }
            }
        }
        let mut x = B::Rows::default();
        b.upload(&patches, &mut x)?;
        drop(patches);
        let mut hidden = B::Rows::default();
        b.matmul_batch(&self.patch.matrix, &x, n, &mut hidden);
        if let Some(norm) = &self.pre_norm {
            self.norm(norm, &hidden, &mut x)?;
            std::mem::swap(&mut hidden, &mut x);
        }

        let units: Vec<u32> = (0..(n / UNIT) as u32).collect();
        let rows = |seq: &dyn Fn(usize) -> usize, lens: &[usize]| -> Vec<PassRow> {
            cells
                .iter()
                .enumerate()
                .map(|(slot, &(row, col))| {
                    let s = seq(slot / UNIT);
                    PassRow { pos: [row as u32, col as u32, 0, 0], slot, seq: s, visible: lens[s] }
                })
                .collect()
        };
        let full_rows = rows(&|_| 0, &[n]);
        let full = PassLayout { rows: &full_rows, sequences: &[PassSequence { blocks: &units, hidden: &[] }] };
        let mut full_pass = B::Pass::default();
        b.prepare(&self.rope, &full, &mut full_pass)?;
        let mut window_pass = None;
        if let Some(windows) = self.info.windows {
            let per_row = nx.div_ceil(windows.side);
            let window = |unit: usize| (unit / nx / windows.side) * per_row + (unit % nx) / windows.side;
            let count = per_row * ny.div_ceil(windows.side);
            let mut members: Vec<Vec<u32>> = vec![Vec::new(); count];
            for unit in 0..n / UNIT {
                members[window(unit)].push(unit as u32);
            }
            let lens: Vec<usize> = members.iter().map(|units| units.len() * UNIT).collect();
            let window_rows = rows(&window, &lens);
            let sequences: Vec<PassSequence> =
                members.iter().map(|units| PassSequence { blocks: units, hidden: &[] }).collect();
            let mut pass = B::Pass::default();
            b.prepare(&self.rope, &PassLayout { rows: &window_rows, sequences: &sequences }, &mut pass)?;
            window_pass = Some((windows.pattern, pass));
        }
        let mut kv = b.kv(KvShape {
            n_layer: 1,
            kv_dim: e,
            head_dim: self.heads.head_dim(),
            n_blocks: n / UNIT,
            block_tokens: UNIT,
            types: KvTypes::default(),
        })?;

        let scale = 1.0 / (self.heads.head_dim() as f32).sqrt();
        // The MLP has buffers of its own: each keeps one size across the
        // blocks, so none is regrown (and zero-filled) per block.
        let [mut q, mut k, mut v, mut attended, mut t, mut up, mut gate, mut gated] =
            std::array::from_fn(|_| B::Rows::default());
        for (index, block) in self.blocks.iter().enumerate() {
            let pass = match &window_pass {
                Some((pattern, pass)) if (index + 1) % pattern != 0 => pass,
                _ => &full_pass,
            };
            self.norm(&block.ln1, &hidden, &mut x)?;
            for (linear, rows) in [(&block.q, &mut q), (&block.k, &mut k), (&block.v, &mut v)] {
                self.linear(linear, &x, n, rows);
            }
            b.rope(&self.rope, pass, &mut q);
            b.rope(&self.rope, pass, &mut k);
            b.attend_within(&mut kv, &q, &k, &v, pass, self.heads, scale, &mut attended)?;
            self.linear(&block.output, &attended, n, &mut t);
            b.add(&mut hidden, &t);

            self.norm(&block.ln2, &hidden, &mut x)?;
            self.linear(&block.up, &x, n, &mut up);
            let activated = match (&block.gate, self.activation) {
                (Some(weights), _) => {
                    self.linear(weights, &x, n, &mut gate);
                    b.swiglu(&gate, &up, &mut gated);
                    &gated
                }
                (None, Activation::Gelu(kind)) => {
                    b.gelu(&mut up, kind)?;
                    &up
                }
                // The loader pairs SwiGLU with a gate.
                (None, Activation::SwiGlu) => &up,
            };
            self.linear(&block.down, activated, n, &mut t);
            b.add(&mut hidden, &t);
        }
        if let Some(norm) = &self.post_norm {
            self.norm(norm, &hidden, &mut x)?;
            std::mem::swap(&mut hidden, &mut x);
        }
        // Each unit's four rows, adjacent, are one row of the merger.
        self.linear(&self.merge_in, &hidden, n / UNIT, &mut x);
        b.gelu(&mut x, Gelu::Tanh)?;
        self.linear(&self.merge_out, &x, n / UNIT, &mut t);
        Ok(Encoded { nx: nx as u32, ny: ny as u32, rows: b.download_owned(t)? })
    }

    fn norm(&self, norm: &Norm<B>, x: &B::Rows, out: &mut B::Rows) -> Result<(), BackendError> {
        match norm {
            Norm::Layer { weight, bias } => self.backend.layer_norm(x, weight, bias, self.eps, out),
            Norm::Rms { weight, bias } => {
                self.backend.rms_norm(x, weight, self.eps, out);
                if let Some(bias) = bias {
                    self.backend.add_bias(out, bias);
                }
                Ok(())
            }
        }
    }

    fn linear(&self, linear: &Linear<B>, x: &B::Rows, m: usize, out: &mut B::Rows) {
        // An image's rows are always multiplied together.
        self.backend.matmul_batch(&linear.weight.matrix, x, m, out);
        if let Some(bias) = &linear.bias {
            self.backend.add_bias(out, bias);
        }
    }
}
