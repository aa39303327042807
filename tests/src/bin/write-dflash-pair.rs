//! Writes the synthetic DFlash pair `cargo xtask bench spec` measures: a
//! random-weight qwen3 target and a one-layer DFlash draft tapping two of
//! its layers (sizes chosen so a forward pass costs about a millisecond).

use std::path::PathBuf;

use sluice_tests::gguf_writer::TinyModel;

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "target/bench".into()));
    std::fs::create_dir_all(&dir)?;
    let target = TinyModel {
        n_vocab: 4096,
        n_embd: 256,
        n_layer: 6,
        n_head: 8,
        n_head_kv: 4,
        n_ff: 768,
        ..TinyModel::recipe("qwen3", 21)
    };
    let draft = TinyModel { n_layer: 1, ..target.clone() };
    std::fs::write(dir.join("dflash-target.gguf"), target.build().build())?;
    std::fs::write(dir.join("dflash-draft.gguf"), draft.dflash(&[1, 4], target.n_embd, 16).build())?;
    println!("{}", dir.display());
    Ok(())
}
