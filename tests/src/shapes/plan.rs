//! What a shape's file holds, tensor by tensor: each tensor's header entry
//! and how its values are drawn.

pub(super) const F32: u32 = 0;
pub(super) const F16: u32 = 1;
pub(super) const Q4_K: u32 = 12;

/// Bytes of a Q4_K block of 256 values: f16 `d` and `dmin`, 12 bytes of
/// 6-bit scales and mins, 128 bytes of 4-bit quants.
pub(super) const Q4_K_BLOCK: u64 = 144;

/// One tensor of the file: its header entry and how its values are drawn.
pub(super) struct Planned {
    pub(super) name: String,
    pub(super) dims: Vec<u64>,
    pub(super) type_id: u32,
    pub(super) fill: Fill,
}

#[derive(Clone, Copy)]
pub(super) enum Fill {
    /// Uniform in ±scale.
    Uniform(f32),
    /// 1 ± 0.2 (norm weights).
    NearOne,
    /// -1 ± 0.5 (a Gated DeltaNet layer's `ssm_a`: each step's decay).
    Decay,
}

impl Planned {
    pub(super) fn bytes(&self) -> u64 {
        let values = self.dims.iter().product::<u64>();
        match self.type_id {
            F16 => values * 2,
            Q4_K => values / 256 * Q4_K_BLOCK,
            _ => values * 4,
        }
    }
}
