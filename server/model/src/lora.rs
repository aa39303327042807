//! LoRA adapters in llama.cpp's GGUF form (`general.type = adapter`,
//! `adapter.type = lora`): for a base weight of GGUF shape `[n_in, n_out]`,
//! tensors `<weight>.lora_a` of `[n_in, rank]` and `<weight>.lora_b` of
//! `[rank, n_out]`, in F32, F16 or a quantized type. A row using the
//! adapter at scale `s` adds `s · (alpha / rank) · B·(A·x)` to the weight's
//! output (just `s · B·(A·x)` when `alpha` is 0, as llama.cpp does).
//!
//! Every tensor is checked against the base model when the adapter loads,
//! so a served adapter never fails in a forward pass. The factors are kept
//! in f32 on the model's backend.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use sluice_kernels::backend::{Backend, LowRankSource, LowRankTerm};
use sluice_kernels::quant::dequantize_row;

use super::batch::ForwardError;
use super::gguf::{GgufFile, TensorInfo};
use super::weights::{LoadError, Weight};

/// What the server shows of a loaded adapter.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterInfo {
    pub path: PathBuf,
    /// `adapter.lora.alpha` (0 when the file has none).
    pub alpha: f32,
    /// `adapter.lora.task_name` and `adapter.lora.prompt_prefix`, as
    /// llama-server lists them (empty when absent).
    pub task_name: String,
    pub prompt_prefix: String,
    /// SHA-256 of the adapter's alpha and tensors: names KV computed under
    /// it across restarts (saved slots).
    pub fingerprint: [u8; 32],
}

/// A loaded model as an adapter sees it: the weights it may change.
pub(crate) trait Targets<B: Backend> {
    fn backend(&self) -> &B;
    /// The model's `general.architecture`.
    fn architecture(&self) -> &'static str;
    fn n_layer(&self) -> usize;
    /// The weight at `site` of `layer`, if the layer has one.
    fn weight(&self, layer: usize, site: Site) -> Option<&Weight<B>>;
    /// The fused tensor (its suffix, e.g. `attn_qkv.weight`) the weight at
    /// `site` of `layer` is a part of, if it is one.
    fn fused(&self, layer: usize, site: Site) -> Option<&'static str>;
    /// The LM head, when the file has an `output.weight` of its own (a tied
    /// head is the embedding table, which adapters do not change).
    fn own_head(&self) -> Option<&Weight<B>>;
}

/// The weights of a layer an adapter may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Site {
    Q,
    K,
    V,
    Output,
    Gate,
    Up,
    Down,
    /// A Gated DeltaNet layer's Q|K|V (`attn_qkv`), output gate z
    /// (`attn_gate`), β and α, and output (`ssm_out`).
    Qkv,
    Z,
    Beta,
    Alpha,
    SsmOut,
}

/// How many [`Site`]s a layer has.
const SITES: usize = 12;

impl Site {
    const ALL: [Site; SITES] = [
        Site::Q,
        Site::K,
        Site::V,
        Site::Output,
        Site::Gate,
        Site::Up,
        Site::Down,
        Site::Qkv,
        Site::Z,
        Site::Beta,
        Site::Alpha,
        Site::SsmOut,
    ];

    fn suffix(self) -> &'static str {
        match self {
            Site::Q => "attn_q.weight",
            Site::K => "attn_k.weight",
            Site::V => "attn_v.weight",
            Site::Output => "attn_output.weight",
            Site::Gate => "ffn_gate.weight",
            Site::Up => "ffn_up.weight",
            Site::Down => "ffn_down.weight",
            Site::Qkv => "attn_qkv.weight",
            Site::Z => "attn_gate.weight",
            Site::Beta => "ssm_beta.weight",
            Site::Alpha => "ssm_alpha.weight",
            Site::SsmOut => "ssm_out.weight",
        }
    }
}

/// One adapter's factors for one weight, with its rank.
pub(super) struct Factors<B: Backend> {
    pub(super) low_rank: B::LowRank,
    pub(super) rank: usize,
}

/// A loaded adapter.
pub(crate) struct Adapter<B: Backend> {
    pub(super) info: AdapterInfo,
    /// Per layer, per [`Site`] (in `Site::ALL` order).
    pub(super) layers: Vec<[Option<Factors<B>>; SITES]>,
    /// The LM head's.
    pub(super) head: Option<Factors<B>>,
}

impl<B: Backend> Adapter<B> {
    pub(super) fn at(&self, layer: usize, site: Site) -> Option<&Factors<B>> {
        self.layers.get(layer).and_then(|sites| sites[site as usize].as_ref())
    }

    /// The factor a row at user scale `scale` multiplies `factors`' delta
    /// by, computed as llama.cpp computes it.
    pub(super) fn scale(&self, scale: f32, factors: &Factors<B>) -> f32 {
        let alpha = self.info.alpha;
        if alpha == 0.0 { scale } else { scale * alpha / factors.rank as f32 }
    }
}

fn problem(path: &Path, problem: impl Into<String>) -> LoadError {
    LoadError::Adapter { path: path.to_owned(), problem: problem.into() }
}

/// Open the adapter at `path` and load it against `model`.
pub(super) fn load<B: Backend>(model: &impl Targets<B>, path: &Path) -> Result<Adapter<B>, LoadError> {
    let file = GgufFile::open(path).map_err(|error| problem(path, error.to_string()))?;
    let meta = |key: &str| file.opt_str(key).map_err(|error| problem(path, error.to_string()));
    match meta("general.type")? {
        Some("adapter") => {}
        Some(other) => return Err(problem(path, format!("`general.type` is {other:?}, not \"adapter\""))),
        None => return Err(problem(path, "not an adapter: it has no `general.type`")),
    }
    match meta("adapter.type")? {
        Some("lora") => {}
        Some(other) => return Err(problem(path, format!("`adapter.type` {other:?} is not supported (only \"lora\")"))),
        None => return Err(problem(path, "`adapter.type` is missing")),
    }
    // An activated LoRA is an ordinary LoRA file plus its invocation
    // tokens; applied to every token it would give wrong output silently.
    if file.get("adapter.alora.invocation_tokens").is_some() {
        return Err(problem(path, "activated LoRA (`adapter.alora.invocation_tokens`) is not supported"));
    }
    let base_arch = model.architecture();
    match meta("general.architecture")? {
        Some(arch) if arch == base_arch => {}
        Some(arch) => {
            return Err(problem(path, format!("an adapter for architecture {arch:?}; the model is {base_arch:?}")));
        }
        None => return Err(problem(path, "`general.architecture` is missing")),
    }
    let alpha = file.opt_f32("adapter.lora.alpha").map_err(|error| problem(path, error.to_string()))?.unwrap_or(0.0);
    if !alpha.is_finite() {
        return Err(problem(path, format!("`adapter.lora.alpha` is {alpha}")));
    }

    let pairs = pairs(&file).map_err(|message| problem(path, message))?;
    let mut layers: Vec<[Option<Factors<B>>; SITES]> = (0..model.n_layer()).map(|_| Default::default()).collect();
    let mut head = None;
    for (base, (a, b)) in pairs {
        let (Some(a), Some(b)) = (a, b) else {
            let missing = if a.is_none() { "lora_a" } else { "lora_b" };
            return Err(problem(path, format!("tensor {base}.{missing} is missing (its pair is there)")));
        };
        let (slot, weight) = match target(model, &base) {
            Ok(found) => found,
            Err(reason) => return Err(problem(path, format!("tensor {base}.lora_a: {reason}"))),
        };
        let factors = factors(model, &file, &base, a, b, weight).map_err(|message| problem(path, message))?;
        match slot {
            Some((layer, site)) => layers[layer][site as usize] = Some(factors),
            None => head = Some(factors),
        }
    }
    let info = AdapterInfo {
        path: path.to_owned(),
        alpha,
        task_name: meta("adapter.lora.task_name")?.unwrap_or_default().to_owned(),
        prompt_prefix: meta("adapter.lora.prompt_prefix")?.unwrap_or_default().to_owned(),
        fingerprint: fingerprint(&file, alpha),
    };
    Ok(Adapter { info, layers, head })
}

/// The adapter's tensors by base weight: (`lora_a`, `lora_b`).
type Pairs<'a> = BTreeMap<String, (Option<&'a TensorInfo>, Option<&'a TensorInfo>)>;

fn pairs(file: &GgufFile) -> Result<Pairs<'_>, String> {
    let mut pairs = Pairs::new();
    for tensor in file.tensors() {
        let name = &tensor.name;
        let (base, is_a) = match (name.strip_suffix(".lora_a"), name.strip_suffix(".lora_b")) {
            (Some(base), _) => (base, true),
            (_, Some(base)) => (base, false),
            _ => return Err(format!("tensor {name} is neither a `.lora_a` nor a `.lora_b`")),
        };
        let entry = pairs.entry(base.to_owned()).or_default();
        let place = if is_a { &mut entry.0 } else { &mut entry.1 };
        if place.replace(tensor).is_some() {
            return Err(format!("tensor {name} appears twice"));
        }
    }
    if pairs.is_empty() {
        return Err("it has no lora_a/lora_b tensors".into());
    }
    Ok(pairs)
}

/// Where a base weight named `base` sits in `model` (`None` for the LM
/// head), and the weight.
type Target<'a, B> = (Option<(usize, Site)>, &'a Weight<B>);

fn target<'a, B: Backend>(model: &'a impl Targets<B>, base: &str) -> Result<Target<'a, B>, String> {
    if base == "token_embd.weight" {
        return Err("adapters of the token embeddings are not supported".into());
    }
    if base == "output.weight" {
        return match model.own_head() {
            Some(head) => Ok((None, head)),
            None => Err("the model has no tensor output.weight (its LM head is the embedding table)".into()),
        };
    }
    let unknown = || format!("the model has no weight {base} an adapter can change");
    let (layer, suffix) = base.strip_prefix("blk.").and_then(|rest| rest.split_once('.')).ok_or_else(unknown)?;
    let layer: usize = layer.parse().map_err(|_| unknown())?;
    // The model runs a fused tensor as separate parts; an adapter's delta
    // on the fused output is not split to match them.
    if Site::ALL.into_iter().any(|site| model.fused(layer, site) == Some(suffix)) {
        return Err(format!("{base} is a fused tensor: adapters of fused tensors are not supported"));
    }
    let site = Site::ALL.into_iter().find(|site| site.suffix() == suffix).ok_or_else(unknown)?;
    if let Some(fused) = model.fused(layer, site) {
        return Err(format!("the model has no {base}: it is a part of the fused tensor blk.{layer}.{fused}"));
    }
    let weight = model.weight(layer, site).ok_or_else(unknown)?;
    Ok((Some((layer, site)), weight))
}

/// The factors of `base`, checked against `weight`'s shape and made
/// resident.
fn factors<B: Backend>(
    model: &impl Targets<B>,
    file: &GgufFile,
    base: &str,
    a: &TensorInfo,
    b: &TensorInfo,
    weight: &Weight<B>,
) -> Result<Factors<B>, String> {
    let (n_in, n_out) = (weight.n_in as u64, weight.n_out as u64);
    let shape = |tensor: &TensorInfo| match tensor.dims[..] {
        [first, second] => Ok((first, second)),
        _ => Err(format!("tensor {}: shape {:?} is not a matrix", tensor.name, tensor.dims)),
    };
    let ((a_in, a_rank), (b_rank, b_out)) = (shape(a)?, shape(b)?);
    if a_in != n_in || b_out != n_out {
        return Err(format!(
            "tensors {base}.lora_a {:?} and .lora_b {:?} do not fit the model's {base} [{n_in}, {n_out}]: expected \
             [{n_in}, rank] and [rank, {n_out}]",
            a.dims, b.dims
        ));
    }
    if a_rank != b_rank || a_rank == 0 {
        return Err(format!("tensors {base}.lora_a {:?} and .lora_b {:?} disagree on the rank", a.dims, b.dims));
    }
    let rank = a_rank as usize;
    let values = |tensor: &TensorInfo| -> Result<Vec<f32>, String> {
        let dtype = tensor
            .dtype
            .weights()
            .ok_or_else(|| format!("tensor {}: type {} is not a weight format", tensor.name, tensor.dtype.name()))?;
        let mut out = vec![0.0; tensor.elements() as usize];
        dequantize_row(dtype, file.data(tensor), &mut out)
            .map_err(|error| format!("tensor {}: {error}", tensor.name))?;
        match out.iter().any(|value| !value.is_finite()) {
            true => Err(format!("tensor {}: holds values that are not finite", tensor.name)),
            false => Ok(out),
        }
    };
    let source = LowRankSource { a: values(a)?, b: values(b)?, rank, n_in: weight.n_in, n_out: weight.n_out };
    let low_rank = model.backend().low_rank(source).map_err(|error| format!("tensor {base}.lora_a: {error}"))?;
    Ok(Factors { low_rank, rank })
}

fn fingerprint(file: &GgufFile, alpha: f32) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(alpha.to_bits().to_le_bytes());
    for tensor in file.tensors() {
        hash.update(tensor.name.as_bytes());
        hash.update(tensor.dtype.name());
        tensor.dims.iter().for_each(|dim| hash.update(dim.to_le_bytes()));
        hash.update(file.data(tensor));
    }
    hash.finalize().into()
}

/// Rows of a pass and their scales.
type RowScales = Vec<(usize, f32)>;

/// The rows of one pass that use each adapter, with their scales.
pub(crate) struct PassAdapters {
    /// By adapter id: (row, scale), scale not 0.
    rows: Vec<RowScales>,
}

impl PassAdapters {
    /// Row `i` uses what `configs[seq_of(i)]` lists: (adapter id, scale).
    pub(super) fn new(
        seqs: impl Iterator<Item = usize>,
        configs: &[Vec<(u32, f32)>],
        n_adapters: usize,
    ) -> Result<Self, ForwardError> {
        let mut rows = vec![Vec::new(); n_adapters];
        for (row, seq) in seqs.enumerate() {
            for &(id, scale) in configs.get(seq).map_or(&[][..], Vec::as_slice) {
                let used = rows.get_mut(id as usize).ok_or(ForwardError::Adapter { row, id, n_adapters })?;
                if !scale.is_finite() {
                    return Err(ForwardError::AdapterScale { row, id });
                }
                if scale != 0.0 {
                    used.push((row, scale));
                }
            }
        }
        Ok(PassAdapters { rows })
    }

    /// The same for a pass over rows `picked` of this one (row `i` of the
    /// new pass is row `picked[i]` here).
    pub(super) fn select(&self, picked: &[usize]) -> Self {
        let rows = self
            .rows
            .iter()
            .map(|rows| {
                rows.iter()
                    .filter_map(|&(row, scale)| picked.iter().position(|&p| p == row).map(|at| (at, scale)))
                    .collect()
            })
            .collect();
        PassAdapters { rows }
    }

    /// Add to `out` (the product of `x` with the weight at `site` of
    /// `layer`, or the LM head for `None`) every adapter's delta for the
    /// rows using it, in adapter id order.
    pub(crate) fn apply<B: Backend>(
        &self,
        backend: &B,
        adapters: &[Adapter<B>],
        site: Option<(usize, Site)>,
        x: &B::Rows,
        out: &mut B::Rows,
    ) {
        let scaled: Vec<(&Factors<B>, RowScales)> = adapters
            .iter()
            .zip(&self.rows)
            .filter(|(_, rows)| !rows.is_empty())
            .filter_map(|(adapter, rows)| {
                let factors = match site {
                    Some((layer, site)) => adapter.at(layer, site),
                    None => adapter.head.as_ref(),
                }?;
                Some((factors, rows.iter().map(|&(row, scale)| (row, adapter.scale(scale, factors))).collect()))
            })
            .collect();
        if scaled.is_empty() {
            return;
        }
        let terms: Vec<_> =
            scaled.iter().map(|(factors, rows)| LowRankTerm { factors: &factors.low_rank, rows }).collect();
        backend.add_low_rank(x, &terms, out);
    }
}
