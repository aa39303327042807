//! The vision tower against an independent reference: a plain f32
//! implementation of the Qwen2-VL and Qwen2.5-VL towers written from
//! their definitions (patches in raster order, attention with an explicit
//! window mask, the 2 × 2 merge done by hand), reading the synthetic
//! projector's weights straight from the test's own writer. And the
//! projector files that are refused, each naming what is wrong.

use std::collections::HashMap;
use std::sync::Arc;

use sluice_kernels::backend::CpuBackend;
use sluice_model::gguf::GgufFile;
use sluice_model::vision::Projector;
use sluice_model::vision::image::Prepared;
use sluice_tests::gguf_writer::{GgufBuilder, Rng, Tensor, Value};
use sluice_tests::projector::TinyProjector;

struct Weights(HashMap<String, Vec<f32>>);

impl Weights {
    fn of(builder: &GgufBuilder) -> Self {
        Weights(
            builder
                .tensors
                .iter()
                .map(|tensor| {
                    let values = tensor.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    (tensor.name.clone(), values.collect())
                })
                .collect(),
        )
    }

    fn get(&self, name: &str) -> &[f32] {
        &self.0[name]
    }

    /// `x · Wᵀ + b` for a GGUF `[n_in, n_out]` matrix `name.weight`.
    fn linear(&self, name: &str, x: &[f32]) -> Vec<f32> {
        let (w, b) = (self.get(&format!("{name}.weight")), self.get(&format!("{name}.bias")));
        let n_in = x.len();
        b.iter().enumerate().map(|(o, bias)| bias + dot(&w[o * n_in..(o + 1) * n_in], x)).collect()
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() as f32
}

fn norm(w: &Weights, name: &str, x: &[f32], layer_norm: bool) -> Vec<f32> {
    let n = x.len() as f32;
    let weight = w.get(&format!("{name}.weight"));
    if layer_norm {
        let bias = w.get(&format!("{name}.bias"));
        let mean = x.iter().sum::<f32>() / n;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
        x.iter().zip(weight).zip(bias).map(|((v, g), b)| (v - mean) / (var + 1e-6).sqrt() * g + b).collect()
    } else {
        let rms = (x.iter().map(|v| v * v).sum::<f32>() / n + 1e-6).sqrt();
        x.iter().zip(weight).map(|(v, g)| v / rms * g).collect()
    }
}

fn reference(shape: &TinyProjector, w: &Weights, image: &Prepared) -> Vec<f32> {
    let (p, e, heads) = (shape.patch_size, shape.n_embd, shape.n_head);
    let d = e / heads;
    let (px, py) = (image.width as usize / p, image.height as usize / p);
    let layer_norm = !shape.gated();
    let (k0, k1) = (w.get("v.patch_embd.weight"), w.get("v.patch_embd.weight.1"));
    let kernel = 3 * p * p;
    let plane = (image.width * image.height) as usize;
    // Raster order: patch (y, x) is row y * px + x.
    let mut h: Vec<Vec<f32>> = Vec::new();
    for y in 0..py {
        for x in 0..px {
            let mut input = Vec::with_capacity(kernel);
            for c in 0..3 {
                for ky in 0..p {
                    for kx in 0..p {
                        input.push(image.pixels[c * plane + (y * p + ky) * image.width as usize + x * p + kx]);
                    }
                }
            }
            h.push(
                (0..e)
                    .map(|o| {
                        dot(&k0[o * kernel..(o + 1) * kernel], &input) + dot(&k1[o * kernel..(o + 1) * kernel], &input)
                    })
                    .collect(),
            );
        }
    }
    let n = h.len();
    let window = |i: usize, full: bool| {
        if full || shape.pattern == 0 {
            return 0;
        }
        let side = shape.window_size as usize / p / 2;
        let (y, x) = (i / px / 2 / side, i % px / 2 / side);
        y * 1000 + x
    };
    let rope = |v: &mut [f32], i: usize| {
        let (y, x) = ((i / px) as f64, (i % px) as f64);
        for head in v.chunks_exact_mut(d) {
            for j in 0..d / 2 {
                let (pos, k) = if j < d / 4 { (y, j) } else { (x, j - d / 4) };
                let angle = pos * 10_000f64.powf(-4.0 * k as f64 / d as f64);
                let (a, b) = (f64::from(head[j]), f64::from(head[j + d / 2]));
                head[j] = (a * angle.cos() - b * angle.sin()) as f32;
                head[j + d / 2] = (a * angle.sin() + b * angle.cos()) as f32;
            }
        }
    };
    for layer in 0..shape.n_layer {
        let name = |part: &str| format!("v.blk.{layer}.{part}");
        let full = shape.pattern == 0 || (layer + 1) % shape.pattern as usize == 0;
        let x1: Vec<Vec<f32>> = h.iter().map(|row| norm(w, &name("ln1"), row, layer_norm)).collect();
        let project = |part: &str, rotate: bool| -> Vec<Vec<f32>> {
            x1.iter()
                .enumerate()
                .map(|(i, row)| {
                    let mut out = w.linear(&name(part), row);
                    if rotate {
                        rope(&mut out, i);
                    }
                    out
                })
                .collect()
        };
        let (q, k, v) = (project("attn_q", true), project("attn_k", true), project("attn_v", false));
        for i in 0..n {
            let mut attended = vec![0.0f32; e];
            for hd in 0..heads {
                let span = hd * d..(hd + 1) * d;
                let seen: Vec<usize> = (0..n).filter(|&j| window(j, full) == window(i, full)).collect();
                let scores: Vec<f64> = seen
                    .iter()
                    .map(|&j| f64::from(dot(&q[i][span.clone()], &k[j][span.clone()])) / (d as f64).sqrt())
                    .collect();
                let max = scores.iter().copied().fold(f64::MIN, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for (&j, weight) in seen.iter().zip(&weights) {
                    for c in span.clone() {
                        attended[c] += (weight / total * f64::from(v[j][c])) as f32;
                    }
                }
            }
            let out = w.linear(&name("attn_out"), &attended);
            h[i].iter_mut().zip(out).for_each(|(h, o)| *h += o);
            let x2 = norm(w, &name("ln2"), &h[i], layer_norm);
            let up = w.linear(&name("ffn_up"), &x2);
            let act: Vec<f32> = if shape.gated() {
                let gate = w.linear(&name("ffn_gate"), &x2);
                gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect()
            } else {
                up.iter().map(|u| u / (1.0 + (-1.702 * u).exp())).collect()
            };
            let down = w.linear(&name("ffn_down"), &act);
            h[i].iter_mut().zip(down).for_each(|(h, o)| *h += o);
        }
    }
    let h: Vec<Vec<f32>> = h.iter().map(|row| norm(w, "v.post_ln", row, layer_norm)).collect();
    let mut out = Vec::new();
    for uy in 0..py / 2 {
        for ux in 0..px / 2 {
            let mut merged = Vec::with_capacity(4 * e);
            for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                merged.extend_from_slice(&h[(2 * uy + dy) * px + 2 * ux + dx]);
            }
            let hidden: Vec<f32> = w
                .linear("mm.0", &merged)
                .iter()
                .map(|&x| {
                    let x = f64::from(x);
                    (0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())) as f32
                })
                .collect();
            out.extend(w.linear("mm.2", &hidden));
        }
    }
    out
}

fn check(shape: TinyProjector, width: u32, height: u32) {
    let builder = shape.build();
    let file = GgufFile::from_bytes(builder.build()).expect("projector parses");
    let projector = Projector::load(&file, Arc::new(CpuBackend::new(2)), shape.n_out).expect("projector loads");
    let mut rng = Rng::new(7);
    let image = Prepared { width, height, pixels: rng.vec(3 * (width * height) as usize, 2.0) };
    let encoded = projector.encode(&image).expect("encodes");
    let p = shape.patch_size as u32;
    assert_eq!((encoded.nx, encoded.ny), (width / p / 2, height / p / 2));
    let want = reference(&shape, &Weights::of(&builder), &image);
    assert_eq!(encoded.rows.len(), want.len());
    // sluice's attention rounds q, K and V to f16 as llama.cpp's does; the
    // reference stays in f32.
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let worst = encoded.rows.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    eprintln!("{}: {width} × {height}, largest {scale}, worst difference {worst}", shape.kind);
    assert!(worst <= 2e-3 * scale.max(1.0), "{}: worst difference {worst} at scale {scale}", shape.kind);
}

#[test]
fn qwen2vl_tower_matches_the_reference() {
    check(TinyProjector::qwen2vl(24, 3), 24, 40);
}

#[test]
fn qwen25vl_tower_with_windows_matches_the_reference() {
    // 48 × 40 pixels: 6 × 5 output rows in windows of 2 × 2, the last
    // windows cut short on both sides.
    check(TinyProjector::qwen25vl(24, 4), 48, 40);
}

#[test]
fn bad_projectors_are_refused_naming_the_problem() {
    let good = TinyProjector::qwen2vl(24, 3);
    let refusal = |builder: GgufBuilder, n_out: usize| {
        let file = GgufFile::from_bytes(builder.build()).expect("parses");
        match Projector::load(&file, Arc::new(CpuBackend::new(1)), n_out) {
            Ok(_) => panic!("loaded"),
            Err(error) => error.to_string(),
        }
    };
    let type_named = |name: &str| good.build().meta("clip.projector_type", Value::Str(name.into()));
    let wrong_shape = good.build().tensor(Tensor::f32("v.blk.0.ffn_up.weight", &[32, 48], &[0.5; 32 * 48]));
    let cases = [
        (type_named("qwen3vl_merger"), 24, "\"qwen3vl_merger\" is not supported"),
        (type_named("gemma3"), 24, "\"gemma3\" is not supported"),
        (good.build().meta("general.architecture", Value::Str("llama".into())), 24, "is not a projector"),
        (good.build().meta("clip.vision.spatial_merge_size", Value::U32(3)), 24, "spatial_merge_size"),
        (TinyProjector::qwen25vl(24, 3).build().without_meta("clip.vision.n_wa_pattern"), 24, "n_wa_pattern"),
        (good.build().without_tensor("v.blk.1.attn_k.weight"), 24, "v.blk.1.attn_k.weight"),
        (wrong_shape, 24, "v.blk.0.ffn_up.weight"),
        // The merger's output must be the text model's embedding width.
        (good.build(), 32, "mm.2.weight"),
    ];
    for (builder, n_out, says) in cases {
        let message = refusal(builder, n_out);
        assert!(message.contains(says), "expected {says:?} in {message:?}");
    }
}
