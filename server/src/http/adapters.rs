//! The loaded LoRA adapters (docs/lora.md), their global scales and a
//! request's own. As in llama-server, an adapter a list leaves out gets
//! scale 0, and a request without `lora` takes the global scales as they
//! are when it arrives (a later change never alters a running request).
//!
//! Beyond llama-server, each adapter has a name (`[[lora]] name`, else its
//! file's stem): a request whose `model` is an adapter's name and which
//! has no `lora` runs with that adapter alone at scale 1, the way vLLM and
//! the gateways routing to it name adapters.

use std::path::PathBuf;
use std::sync::Mutex;

use serde_json::Value;

use super::error::ApiError;
use crate::chat::fields::{Fields, wrong};
use crate::config::{LoraConfig, adapter_names};
use sluice_model::AdapterInfo;

/// One loaded adapter, as the API shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Adapter {
    pub name: String,
    pub path: PathBuf,
    pub task_name: String,
    pub prompt_prefix: String,
}

/// The adapters and their global scales.
#[derive(Debug)]
pub struct Adapters {
    list: Vec<Adapter>,
    scales: Mutex<Vec<f32>>,
}

impl Adapters {
    /// The model's adapters (ids in order), named and scaled as configured.
    pub fn new(loaded: &[&AdapterInfo], configured: &[LoraConfig]) -> Self {
        let list = loaded
            .iter()
            .zip(adapter_names(configured))
            .map(|(info, name)| Adapter {
                name,
                path: info.path.clone(),
                task_name: info.task_name.clone(),
                prompt_prefix: info.prompt_prefix.clone(),
            })
            .collect();
        let scales = configured.iter().map(|config| config.scale).take(loaded.len()).collect();
        Adapters { list, scales: Mutex::new(scales) }
    }

    pub fn list(&self) -> &[Adapter] {
        &self.list
    }

    /// The global scales now, one per adapter.
    pub fn scales(&self) -> Vec<f32> {
        self.scales.lock().map(|scales| scales.clone()).unwrap_or_default()
    }

    /// The configuration of a request with `lora` (absent: the global
    /// scales, or the adapter `model` names), as the engine takes it.
    pub fn request(&self, lora: Option<&Value>, model: Option<&str>) -> Result<Vec<(u32, f32)>, ApiError> {
        let scales = match (lora, model.and_then(|model| self.list.iter().position(|adapter| adapter.name == model))) {
            (Some(lora), _) => self.parse(lora, "lora")?,
            (None, Some(named)) => (0..self.list.len()).map(|id| if id == named { 1.0 } else { 0.0 }).collect(),
            (None, None) => self.scales(),
        };
        Ok(configuration(&scales))
    }

    /// Set the global scales from `value` (`[{"id", "scale"}, …]`; unlisted
    /// adapters: 0), for requests that arrive from now on.
    pub fn set_scales(&self, value: &Value, field: &str) -> Result<(), ApiError> {
        let scales = self.parse(value, field)?;
        if let Ok(mut global) = self.scales.lock() {
            *global = scales;
        }
        Ok(())
    }

    /// `[{"id", "scale"}, …]` as one scale per adapter (unlisted: 0).
    fn parse(&self, value: &Value, field: &str) -> Result<Vec<f32>, ApiError> {
        let expected = "an array of {\"id\", \"scale\"}";
        let items = value.as_array().ok_or_else(|| wrong(field, expected))?;
        let mut scales = vec![0.0; self.list.len()];
        for (index, item) in items.iter().enumerate() {
            let entry = Fields(item.as_object().ok_or_else(|| wrong(field, expected))?);
            let id = entry.int("id")?.ok_or_else(|| ApiError::invalid(format!("`{field}[{index}].id` is required")))?;
            let scale = entry
                .f32("scale")
                .map_err(|_| ApiError::invalid(format!("`{field}[{index}].scale` must be a finite number")))?
                .ok_or_else(|| ApiError::invalid(format!("`{field}[{index}].scale` is required")))?;
            let slot = usize::try_from(id).ok().and_then(|id| scales.get_mut(id)).ok_or_else(|| {
                ApiError::invalid(match self.list.len() {
                    0 => format!("`{field}[{index}].id`: there is no LoRA adapter with id {id} (none are loaded)"),
                    n => format!("`{field}[{index}].id`: there is no LoRA adapter with id {id} (ids are 0..{n})"),
                })
            })?;
            *slot = scale;
        }
        Ok(scales)
    }
}

/// Scales as the engine's configuration: (id, scale), scale 0 left out.
fn configuration(scales: &[f32]) -> Vec<(u32, f32)> {
    scales.iter().enumerate().filter(|(_, scale)| **scale != 0.0).map(|(id, &scale)| (id as u32, scale)).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn adapters(n: usize) -> Adapters {
        let info = |id: usize| AdapterInfo {
            path: format!("a{id}.gguf").into(),
            alpha: 0.0,
            task_name: String::new(),
            prompt_prefix: String::new(),
            fingerprint: [id as u8; 32],
        };
        let infos: Vec<AdapterInfo> = (0..n).map(info).collect();
        let configs: Vec<LoraConfig> =
            (0..n).map(|id| LoraConfig { path: format!("a{id}.gguf").into(), scale: 0.5, name: None }).collect();
        Adapters::new(&infos.iter().collect::<Vec<_>>(), &configs)
    }

    #[test]
    fn requests_list_scales_and_leave_the_rest_at_zero() {
        let adapters = adapters(3);
        assert_eq!(adapters.request(None, None).unwrap(), vec![(0, 0.5), (1, 0.5), (2, 0.5)], "the global scales");
        let lora = json!([{"id": 2, "scale": 0.3}, {"id": 0, "scale": 0}]);
        assert_eq!(adapters.request(Some(&lora), None).unwrap(), vec![(2, 0.3)]);
        assert_eq!(adapters.request(Some(&json!([])), None).unwrap(), Vec::new(), "an empty list: none");
        assert_eq!(adapters.request(None, Some("a1")).unwrap(), vec![(1, 1.0)], "named by `model`");
        assert_eq!(adapters.request(None, Some("base")).unwrap().len(), 3);
    }

    #[test]
    fn bad_entries_name_the_field() {
        let two = adapters(2);
        let error = |lora: Value| two.request(Some(&lora), None).unwrap_err().message;
        assert!(error(json!([{"id": 2, "scale": 1}])).contains("`lora[0].id`: there is no LoRA adapter with id 2"));
        assert!(error(json!([{"id": 0, "scale": 1}, {"id": -1, "scale": 1}])).contains("`lora[1].id`"));
        assert!(error(json!([{"id": 0, "scale": 1e39}])).contains("`lora[0].scale` must be a finite number"));
        assert!(error(json!([{"id": 0}])).contains("`lora[0].scale` is required"));
        assert!(error(json!([{"scale": 1}])).contains("`lora[0].id` is required"));
        assert!(error(json!({"id": 0})).contains("`lora` must be an array"));
        assert!(adapters(0).request(Some(&json!([{"id": 0, "scale": 1}])), None).is_err());
    }
}
