//! Memory for packed weights: an anonymous mapping the kernel is asked to
//! back with transparent huge pages.
//!
//! Decoding streams every packed matrix once per token. On 4 KiB pages a
//! Phi-3-shaped model's weights streamed at about 0.8 of a 2-core Zen 4's
//! read-only bandwidth; on 2 MiB pages the same kernels decoded about a
//! sixth faster (fewer TLB walks, and longer runs for prefetchers that
//! stop at page ends: the likely reasons, not measured apart). Linux's
//! default THP mode (`madvise`) gives huge pages only to memory that
//! asks, which a `Vec` does not.

use memmap2::MmapMut;

/// Zeroed bytes, page-aligned, huge pages requested where the system has
/// them (elsewhere, or if the request is refused, ordinary pages).
pub(crate) struct WeightBytes {
    map: MmapMut,
}

impl WeightBytes {
    /// `len` zeroed bytes, or `None` if the system refuses the mapping.
    pub(crate) fn zeroed(len: usize) -> Option<WeightBytes> {
        let map = MmapMut::map_anon(len).ok()?;
        // Advice only: a kernel without THP answers with an error and the
        // mapping keeps ordinary pages, which is correct, only slower.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Some(WeightBytes { map })
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map
    }
}

#[cfg(test)]
mod tests {
    use super::WeightBytes;

    #[test]
    fn weight_bytes_are_zeroed_writable_and_of_the_asked_length() {
        for len in [0, 1, 4095, 4096, 3 << 20] {
            let mut bytes = WeightBytes::zeroed(len).expect("an anonymous mapping");
            assert_eq!(bytes.bytes().len(), len);
            assert!(bytes.bytes().iter().all(|&b| b == 0));
            for (i, b) in bytes.bytes_mut().iter_mut().enumerate() {
                *b = i as u8;
            }
            assert!(bytes.bytes().iter().enumerate().all(|(i, &b)| b == i as u8));
        }
    }
}
