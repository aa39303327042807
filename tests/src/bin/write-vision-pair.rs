//! Writes what `cargo xtask bench vision` measures and compares: the
//! synthetic pair the HTTP tests use (a 64-wide qwen2vl text model and a
//! small Qwen2-VL projector) with a 56 × 56 image, and a projector at
//! Qwen2-VL-2B's vision shapes (32 blocks, width 1280, f32 weights) with a
//! text model of 2B's width (1536) and a 448 × 448 image.

use std::path::PathBuf;

use sluice_tests::gguf_writer::TinyModel;
use sluice_tests::projector::{TinyProjector, test_png, vision_model};

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "target/bench".into()));
    std::fs::create_dir_all(&dir)?;
    let small = TinyModel { sections: Some([2, 3, 3, 0]), ..TinyModel::recipe("qwen2vl", 21) };
    std::fs::write(dir.join("vision-model.gguf"), vision_model(&small).build())?;
    std::fs::write(dir.join("vision-mmproj.gguf"), TinyProjector::qwen2vl(small.n_embd, 5).build().build())?;
    std::fs::write(dir.join("image-56.png"), test_png(56, 56))?;
    let wide = TinyModel {
        n_embd: 1536,
        n_layer: 1,
        n_head: 12,
        n_head_kv: 2,
        n_ff: 256,
        sections: Some([16, 24, 24, 0]),
        ..TinyModel::recipe("qwen2vl", 22)
    };
    std::fs::write(dir.join("vision-model-2b.gguf"), vision_model(&wide).build())?;
    std::fs::write(dir.join("vision-mmproj-2b.gguf"), TinyProjector::qwen2vl_2b(wide.n_embd, 6).build().build())?;
    std::fs::write(dir.join("image-448.png"), test_png(448, 448))?;
    println!("{}", dir.display());
    Ok(())
}
