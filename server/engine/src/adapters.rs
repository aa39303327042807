//! LoRA configurations as the engine sees them. A request's configuration
//! is its list of (adapter id, scale), ids ascending, no scale 0 (the HTTP
//! layer expands llama-server's "unlisted adapters get 0" into that form).
//! Requests with different configurations run in the same forward pass;
//! what the configuration decides here is:
//!
//! * the **adapter group** policies see: equal configurations share a
//!   number, 0 is "no adapters", and a number no waiting or running
//!   request holds any more is given to the next new configuration, so the
//!   table stays as small as the set of live configurations;
//! * the **prefix-cache root**: KV is reused only under the configuration
//!   that computed it. The root hashes each adapter's fingerprint (its
//!   file's contents) with its scale, so it names the same KV across
//!   restarts and `--lora` orders, and saved slots carry it.

use sha2::{Digest, Sha256};

/// A request's adapter configuration: (adapter id, scale).
pub type LoraConfig = [(u32, f32)];

/// Why a configuration cannot run on this model.
pub fn check(lora: &LoraConfig, n_adapters: usize) -> Result<(), String> {
    if let Some(&(id, _)) = lora.iter().find(|(id, _)| *id as usize >= n_adapters) {
        return Err(match n_adapters {
            0 => format!("there is no LoRA adapter with id {id} (none are loaded)"),
            n => format!("there is no LoRA adapter with id {id} (ids are 0..{n})"),
        });
    }
    if let Some(&(id, scale)) = lora.iter().find(|(_, scale)| !scale.is_finite() || *scale == 0.0) {
        return Err(format!("LoRA adapter {id}: scale {scale} (a configuration lists finite, non-zero scales)"));
    }
    if lora.windows(2).any(|pair| pair[0].0 >= pair[1].0) {
        return Err("LoRA adapters must be listed once each, by ascending id".into());
    }
    Ok(())
}

/// The prefix-cache root of KV computed under `lora`, whose adapters have
/// these fingerprints (checked: every id has one).
pub fn cache_root(lora: &LoraConfig, fingerprints: &[[u8; 32]]) -> u64 {
    if lora.is_empty() {
        return 0;
    }
    let mut hash = Sha256::new();
    for &(id, scale) in lora {
        if let Some(fingerprint) = fingerprints.get(id as usize) {
            hash.update(fingerprint);
        }
        hash.update(scale.to_bits().to_le_bytes());
    }
    let digest = hash.finalize();
    let mut root = [0; 8];
    root.copy_from_slice(&digest[..8]);
    // 0 is the chain of KV without adapters.
    u64::from_le_bytes(root).max(1)
}

/// The adapter groups of live configurations (index = group; 0 is no
/// adapters).
#[derive(Debug)]
pub(super) struct AdapterGroups {
    groups: Vec<Vec<(u32, f32)>>,
}

impl Default for AdapterGroups {
    fn default() -> Self {
        AdapterGroups { groups: vec![Vec::new()] }
    }
}

impl AdapterGroups {
    /// The group of `lora`; a configuration not seen before takes the
    /// lowest group no request in `live` holds.
    pub(super) fn group(&mut self, lora: &LoraConfig, live: impl Iterator<Item = u32>) -> u32 {
        let same = |group: &Vec<(u32, f32)>| {
            group.len() == lora.len()
                && group.iter().zip(lora).all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits())
        };
        if let Some(found) = self.groups.iter().position(same) {
            return found as u32;
        }
        let mut held = vec![false; self.groups.len()];
        for group in live {
            if let Some(held) = held.get_mut(group as usize) {
                *held = true;
            }
        }
        match (1..self.groups.len()).find(|&group| !held[group]) {
            Some(free) => {
                self.groups[free] = lora.to_vec();
                free as u32
            }
            None => {
                self.groups.push(lora.to_vec());
                (self.groups.len() - 1) as u32
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_are_checked_against_the_loaded_adapters() {
        assert!(check(&[], 0).is_ok());
        assert!(check(&[(0, 0.5), (2, 1.0)], 3).is_ok());
        assert_eq!(check(&[(3, 1.0)], 3).unwrap_err(), "there is no LoRA adapter with id 3 (ids are 0..3)");
        assert!(check(&[(0, f32::NAN)], 1).is_err());
        assert!(check(&[(0, 0.0)], 1).is_err());
        assert!(check(&[(1, 1.0), (0, 1.0)], 2).is_err(), "out of order");
        assert!(check(&[(0, 1.0), (0, 2.0)], 2).is_err(), "twice");
    }

    #[test]
    fn roots_name_adapters_by_content_and_scale() {
        let prints = [[1; 32], [2; 32]];
        assert_eq!(cache_root(&[], &prints), 0);
        let one = cache_root(&[(0, 1.0)], &prints);
        assert_ne!(one, 0);
        assert_eq!(one, cache_root(&[(1, 1.0)], &[[9; 32], [1; 32]]), "another id, the same file");
        assert_ne!(one, cache_root(&[(0, 0.5)], &prints));
        assert_ne!(one, cache_root(&[(1, 1.0)], &prints));
        assert_ne!(one, cache_root(&[(0, 1.0), (1, 1.0)], &prints));
    }

    #[test]
    fn groups_are_shared_by_equal_configurations_and_reused_once_free() {
        let mut groups = AdapterGroups::default();
        assert_eq!(groups.group(&[], std::iter::empty()), 0);
        let a = groups.group(&[(0, 1.0)], std::iter::empty());
        let b = groups.group(&[(0, 0.5)], [a].into_iter());
        assert_eq!((a, b), (1, 2));
        assert_eq!(groups.group(&[(0, 1.0)], [a, b].into_iter()), a);
        // Only group 2 is still held: group 1 goes to the next newcomer.
        assert_eq!(groups.group(&[(1, 1.0)], [b].into_iter()), 1);
        assert_eq!(groups.group(&[(0, 0.25)], [1, 2].into_iter()), 3);
        assert_eq!(groups.groups.len(), 4, "as many as were live at once");
    }
}
