//! A loaded model: its family's declarations composed from the shared
//! blocks, with every tensor checked and resident on the model's
//! [`Backend`]. Running it is `forward`'s business.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_kernels::backend::Backend;
use sluice_kernels::ops::{HeadShape, Rope};

use super::blocks::{CacheLayout, Layer};
use super::families;
use super::gguf::GgufFile;
use super::hparams::HParams;
use super::lora::{self, Adapter, Site, Targets};
use super::rope::{local_rope, model_rope};
use super::weights::{LoadError, Weight, tensor_problem, vector, weight};

/// A loaded model: hyper-parameters, and its weights on a backend.
pub struct Transformer<B: Backend> {
    pub(super) backend: Arc<B>,
    pub(super) file: GgufFile,
    pub(super) hparams: HParams,
    /// A DFlash draft without its own uses its target's.
    pub(super) token_embd: Option<Arc<Weight<B>>>,
    pub(super) output_norm: B::Vector,
    /// A DFlash draft without its own uses its target's LM head.
    pub(super) output: Option<Arc<Weight<B>>>,
    pub(super) layers: Vec<Layer<B>>,
    /// Where the layers keep their per-sequence state.
    pub(super) caches: CacheLayout,
    /// A DFlash draft's feature fusion: `fc` (the target taps, concatenated,
    /// to n_embd), then RMSNorm with `enc.output_norm`.
    pub(super) fusion: Option<(Weight<B>, B::Vector)>,
    pub(super) rope: Rope,
    /// The RoPE of layers with a base of their own (Gemma 3's local
    /// layers); one per model.
    pub(super) local_rope: Option<Rope>,
    /// Token embeddings are multiplied by this.
    pub(super) embed_scale: Option<f32>,
    /// Logits are multiplied by this, then soft-capped at this.
    pub(super) logit_scale: Option<f32>,
    pub(super) logit_softcap: Option<f32>,
    /// Queries are scaled by position (Llama 4's temperature, this factor
    /// times the log of the position's bucket of original contexts).
    pub(super) q_temperature: Option<f32>,
    pub(super) heads: HeadShape,
    /// LoRA adapters, by id (load order).
    pub(super) adapters: Vec<Adapter<B>>,
}

impl<B: Backend> Transformer<B> {
    /// Open a GGUF file and load it onto `backend`.
    pub fn load(path: &Path, backend: Arc<B>) -> Result<Self, LoadError> {
        Self::from_file(GgufFile::open(path)?, backend)
    }

    pub fn from_file(file: GgufFile, backend: Arc<B>) -> Result<Self, LoadError> {
        Self::lending(file, backend, None)
    }

    /// Load `file`; a family whose files may lack an embedding table and
    /// LM head (a DFlash draft) takes them from `target` (its weights, not
    /// copies).
    pub(super) fn lending(file: GgufFile, backend: Arc<B>, target: Option<&Self>) -> Result<Self, LoadError> {
        let hparams = HParams::from_gguf(&file)?;
        let hp = &hparams;
        let b = &*backend;
        let family = families::of(hp.arch)?;
        let outer = family.outer(&file, hp)?;
        let lent = |pick: fn(&Self) -> &Option<Arc<Weight<B>>>| target.and_then(|target| pick(target).clone());
        let token_embd = match file.tensor("token_embd.weight") {
            None if outer.lent => lent(|target| &target.token_embd),
            _ => Some(Arc::new(weight(b, &file, "token_embd.weight", hp.n_embd, hp.n_vocab)?)),
        };
        let output = match (file.tensor("output.weight"), &token_embd) {
            (Some(_), _) => Some(Arc::new(weight(b, &file, "output.weight", hp.n_embd, outer.head_rows)?)),
            (None, _) if outer.lent => lent(|target| &target.output),
            // Tied embeddings: the LM head is the embedding table.
            (None, token_embd) => token_embd.clone(),
        };
        let output_norm = vector(b, &file, "output_norm.weight", hp.n_embd)?;
        let mut caches = CacheLayout::default();
        let kinds = family.layers(&file, hp)?;
        let local_rope = local_rope(&file, &kinds, hp)?;
        let layers = kinds
            .into_iter()
            .enumerate()
            .map(|(index, kind)| Layer::load(b, &file, hp, index, kind, &mut caches))
            .collect::<Result<_, LoadError>>()?;
        let fusion = match outer.fusion {
            Some(n_in) => Some((
                weight(b, &file, "fc.weight", n_in, hp.n_embd)?,
                vector(b, &file, "enc.output_norm.weight", hp.n_embd)?,
            )),
            None => None,
        };
        // Until told the served context, the model serves its trained one.
        let rope = model_rope(&file, hp, hp.n_ctx_train)?;
        refuse_unread(&file, hp, family.name())?;
        let heads = HeadShape::new(hp.n_head, hp.n_head_kv, hp.head_dim)
            .map_err(|error| tensor_problem("attention", &error.to_string()))?;
        let adapters = Vec::new();
        Ok(Transformer {
            backend,
            file,
            hparams,
            token_embd,
            output_norm,
            output,
            layers,
            caches,
            fusion,
            rope,
            local_rope,
            embed_scale: outer.embed_scale,
            logit_scale: outer.logit_scale,
            logit_softcap: outer.logit_softcap,
            q_temperature: outer.q_temperature,
            heads,
            adapters,
        })
    }

    /// The model for sequences of up to `n_ctx_seq` positions, the
    /// context each sequence is configured for (the server's per-slot
    /// context): it picks LongRoPE's long or short factors, once, as
    /// llama.cpp picks them from its per-sequence context.
    pub fn for_context(mut self, n_ctx_seq: usize) -> Result<Self, LoadError> {
        self.rope = model_rope(&self.file, &self.hparams, n_ctx_seq)?;
        Ok(self)
    }

    /// Load LoRA adapters (ids in this order), each checked against this
    /// model's weights.
    pub fn with_adapters(mut self, paths: &[PathBuf]) -> Result<Self, LoadError> {
        for path in paths {
            let adapter = lora::load(&self, path)?;
            self.adapters.push(adapter);
        }
        Ok(self)
    }
}

impl<B: Backend> Targets<B> for Transformer<B> {
    fn backend(&self) -> &B {
        &self.backend
    }

    fn architecture(&self) -> &'static str {
        self.hparams.arch.name()
    }

    fn n_layer(&self) -> usize {
        self.layers.len()
    }

    fn weight(&self, layer: usize, site: Site) -> Option<&Weight<B>> {
        self.layers.get(layer)?.weight(site)
    }

    fn fused(&self, layer: usize, site: Site) -> Option<&'static str> {
        self.layers.get(layer)?.fused(site)
    }

    fn own_head(&self) -> Option<&Weight<B>> {
        self.output.as_deref().filter(|_| self.file.tensor("output.weight").is_some())
    }
}

/// Refuses a file holding a tensor the load did not read, as llama.cpp
/// refuses one holding tensors its architecture does not load: computing
/// without it (a bias, a norm) would give wrong outputs without a word.
/// Allowed unread: the blocks past the layers run and within
/// `block_count` (multi-token prediction, which no family runs) and a
/// vision tower's tensors (`v.…`, `mm.…`), which a projector file serves.
fn refuse_unread(file: &GgufFile, hp: &HParams, family: &str) -> Result<(), LoadError> {
    let blocks = file.opt_u32(&hp.arch.key("block_count")).ok().flatten().map_or(hp.n_layer, |n| n as usize);
    let past_the_layers = |name: &str| {
        let block = name.strip_prefix("blk.").and_then(|rest| rest.split('.').next());
        block.and_then(|block| block.parse::<usize>().ok()).is_some_and(|block| (hp.n_layer..blocks).contains(&block))
    };
    let vision = |name: &str| name.starts_with("v.") || name.starts_with("mm.");
    match file.unread_tensors().into_iter().find(|tensor| !past_the_layers(&tensor.name) && !vision(&tensor.name)) {
        Some(tensor) => Err(tensor_problem(
            &tensor.name,
            &format!("sluice's `{family}` models have no such tensor; refusing the file rather than ignoring it"),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sluice_kernels::backend::CpuBackend;
    use sluice_tests::gguf_writer::{GgufBuilder, Tensor, TinyExperts, TinyModel, Value};
    use sluice_tests::lora::{LoraSpec, Target};
    use sluice_tests::models::tiny_family;

    use super::Transformer;
    use crate::families::FAMILIES;
    use crate::gguf::GgufFile;
    use crate::layer::{Cache, Mixer};

    /// A tiny file of the family `name`, three layers.
    fn tiny(name: &'static str) -> GgufBuilder {
        let model = TinyModel { n_layer: 3, ..TinyModel::recipe(name, 7) };
        let experts = |shared| TinyExperts { count: 4, used: 2, n_ff: 16, shared };
        match name {
            "dflash" => model.dflash(&[1], model.n_embd, 4),
            "qwen2vl" | "qwen3vl" => TinyModel { sections: Some([4, 2, 2, 0]), ..model }.build(),
            "qwen3moe" => TinyModel { experts: Some(experts(None)), ..model }.build(),
            "qwen2moe" => TinyModel { experts: Some(experts(Some(24))), ..model }.build(),
            // Its dense first layer and experts after, as the fixture has them.
            "glm4moe" | "qwen35" | "qwen35moe" | "qwen3next" | "qwen3vlmoe" => {
                tiny_family(name).expect("the fixture's tiny model")
            }
            "gpt-oss" => {
                let model = TinyModel { experts: Some(experts(None)), ..model };
                sluice_tests::models::gpt_oss(&model, model.build())
            }
            _ => model.build(),
        }
    }

    fn load(builder: &GgufBuilder) -> Result<Transformer<CpuBackend>, String> {
        let file = GgufFile::from_bytes(builder.build()).map_err(|error| error.to_string())?;
        Transformer::from_file(file, Arc::new(CpuBackend::new(1))).map_err(|error| error.to_string())
    }

    #[test]
    fn every_family_loads_and_its_layers_keep_what_their_kind_declares() {
        for family in FAMILIES {
            let model = load(&tiny(family.name())).unwrap_or_else(|error| panic!("{}: {error}", family.name()));
            let kinds = family.layers(&model.file, &model.hparams).expect("declared");
            assert_eq!(kinds.len(), model.hparams.n_layer, "{}", family.name());
            let paged = kinds.iter().filter(|kind| kind.mixer.cache() == Cache::Paged).count();
            let window = kinds.iter().filter(|kind| matches!(kind.mixer.cache(), Cache::Window(_))).count();
            assert_eq!((model.caches.paged, model.caches.window), (paged, window), "{}", family.name());
            let recurrent: Vec<_> = kinds
                .iter()
                .filter_map(|kind| if let Mixer::DeltaNet(shape) = kind.mixer { Some(shape) } else { None })
                .collect();
            assert_eq!(model.caches.recurrent, recurrent, "{}", family.name());
            assert_eq!(paged + window + model.caches.recurrent.len(), kinds.len(), "{}", family.name());
        }
    }

    /// Phi-3's Q|K|V and gate|up and GLM-4's gate|up load as their parts;
    /// a fused tensor of the wrong width is refused by name (one of `n_ff`
    /// rows is a plain `ffn_up` whose gate is missing, and is refused so).
    #[test]
    fn fused_tensors_load_as_their_parts_and_a_wrong_width_is_refused() {
        let [phi3, glm4] = ["phi3", "glm4"].map(|arch| tiny_family(arch).expect("a tiny model"));
        assert_eq!(load(&phi3).map(|model| model.layers.len()), Ok(4));
        for (model, name, dims, expected) in [
            (&phi3, "blk.1.attn_qkv.weight", [64, 100], "[64, 128]"),
            (&phi3, "blk.0.ffn_up.weight", [64, 192], "[64, 256]"),
            (&glm4, "blk.3.ffn_up.weight", [64, 192], "[64, 256]"),
        ] {
            let wrong = Tensor::f32(name, &dims, &vec![0.0; (dims[0] * dims[1]) as usize]);
            let error = load(&model.clone().tensor(wrong)).err().expect("refused");
            assert_eq!(error, format!("tensor {name:?}: shape {dims:?}, expected {expected}"));
        }
    }

    /// A model of experts names the expert tensor that is missing or of
    /// the wrong shape.
    #[test]
    fn expert_tensors_are_checked_by_name() {
        let qwen2moe = tiny_family("qwen2moe").expect("a tiny model");
        assert_eq!(load(&qwen2moe).map(|model| model.layers.len()), Ok(4));
        let error = load(&qwen2moe.clone().without_tensor("blk.2.ffn_up_exps.weight")).err().expect("refused");
        assert_eq!(error, "tensor \"blk.2.ffn_up_exps.weight\": missing");
        let wrong = Tensor::f32("blk.0.ffn_down_exps.weight", &[32, 64, 7], &vec![0.0; 32 * 64 * 7]);
        let error = load(&qwen2moe.clone().tensor(wrong)).err().expect("refused");
        assert_eq!(error, "tensor \"blk.0.ffn_down_exps.weight\": shape [32, 64, 7], expected [32, 64, 8]");
        let error = load(&qwen2moe.without_tensor("blk.1.ffn_gate_inp_shexp.weight")).err().expect("refused");
        assert_eq!(error, "tensor \"blk.1.ffn_gate_inp_shexp.weight\": missing");
    }

    /// GLM-4's trailing multi-token-prediction layer is not loaded, and a
    /// count that leaves no layer to run is refused.
    #[test]
    fn next_n_prediction_layers_are_left_out_and_must_leave_a_layer() {
        let glm4 = tiny_family("glm4").expect("a tiny model");
        assert_eq!(load(&glm4).map(|model| (model.layers.len(), model.hparams.n_layer)), Ok((4, 4)));
        let error = load(&glm4.meta("glm4.nextn_predict_layers", Value::U32(5))).err().expect("refused");
        assert_eq!(error, "glm4.nextn_predict_layers = 5: must be less than glm4.block_count 5");
    }

    /// An adapter of a fused tensor, or of a weight the model has only as
    /// a part of one, is refused naming it.
    #[test]
    fn an_adapter_of_a_fused_tensor_is_refused_naming_it() {
        let phi3 = tiny_family("phi3").expect("a tiny model");
        let dir = std::env::temp_dir().join(format!("sluice-fused-lora-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch folder");
        let target = |name: &str, n_out| Target { name: name.into(), n_in: 64, n_out };
        let mut refusals = Vec::new();
        for (file, target) in [
            ("qkv.gguf", target("blk.0.attn_qkv.weight", 128)),
            ("q.gguf", target("blk.0.attn_q.weight", 64)),
            ("up.gguf", target("blk.2.ffn_up.weight", 256)),
        ] {
            let path = dir.join(file);
            std::fs::write(&path, LoraSpec::new("phi3", 1, 0.1).build(&[target]).build()).expect("written");
            let model = load(&phi3).expect("loads");
            let error = model.with_adapters(std::slice::from_ref(&path)).err().expect("refused").to_string();
            refusals.push(error.replace(&*path.to_string_lossy(), "F"));
        }
        std::fs::remove_dir_all(&dir).expect("cleaned up");
        assert_eq!(
            refusals,
            [
                "LoRA adapter F: tensor blk.0.attn_qkv.weight.lora_a: blk.0.attn_qkv.weight is a fused tensor: adapters of fused tensors are not supported",
                "LoRA adapter F: tensor blk.0.attn_q.weight.lora_a: the model has no blk.0.attn_q.weight: it is a part of the fused tensor blk.0.attn_qkv.weight",
                "LoRA adapter F: tensor blk.2.ffn_up.weight.lora_a: blk.2.ffn_up.weight is a fused tensor: adapters of fused tensors are not supported",
            ]
        );
    }

    /// A tensor the load does not read (here a bias on a norm) is
    /// refused by name; a vision tower's are left for a projector file.
    #[test]
    fn a_tensor_the_model_does_not_read_is_refused_naming_it() {
        let bias = Tensor::f32("blk.1.ffn_norm.bias", &[8], &[0.5; 8]);
        assert_eq!(
            load(&tiny("llama").tensor(bias)).err().expect("refused"),
            "tensor \"blk.1.ffn_norm.bias\": sluice's `llama` models have no such tensor; refusing the file \
             rather than ignoring it"
        );
        let tower = Tensor::f32("v.blk.0.attn_q.weight", &[8], &[0.5; 8]);
        assert!(load(&tiny("gemma3").tensor(tower)).is_ok());
        // A block past `block_count` is not a multi-token-prediction one.
        let extra = Tensor::f32("blk.3.attn_norm.weight", &[8], &[0.5; 8]);
        assert_eq!(
            load(&tiny("llama").tensor(extra)).err().expect("refused"),
            "tensor \"blk.3.attn_norm.weight\": sluice's `llama` models have no such tensor; refusing the file \
             rather than ignoring it"
        );
    }

    #[test]
    fn a_tensor_a_layer_kind_requires_is_named_when_missing() {
        for (name, missing) in [("qwen2", "blk.2.attn_v.bias"), ("qwen3", "blk.0.attn_k_norm.weight")] {
            let error = load(&tiny(name).without_tensor(missing)).err().expect("refused");
            assert_eq!(error, format!("tensor {missing:?}: missing"), "{name}");
        }
    }
}
