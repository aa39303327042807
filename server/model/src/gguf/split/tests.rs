use std::path::{Path, PathBuf};

use sluice_tests::gguf_writer::{GgufBuilder, TinyModel, Value};

use crate::gguf::{GgufFile, MetaValue};

/// A scratch folder of the test's own, emptied first.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-split-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn model() -> GgufBuilder {
    TinyModel { n_layer: 3, ..TinyModel::llama(5) }.build()
}

/// `shards` written under gguf-split's names for a split of their number.
fn write(dir: &Path, shards: &[GgufBuilder]) -> Vec<PathBuf> {
    let n = shards.len();
    shards
        .iter()
        .enumerate()
        .map(|(no, shard)| {
            let path = dir.join(format!("m-{:05}-of-{n:05}.gguf", no + 1));
            std::fs::write(&path, shard.build()).expect("write a shard");
            path
        })
        .collect()
}

fn error(path: &Path) -> String {
    GgufFile::open(path).expect_err("refused").to_string()
}

#[test]
fn a_split_model_opens_from_its_first_shard_with_the_tensors_of_the_whole_file() {
    let dir = scratch("whole");
    let builder = model();
    let paths = builder.write_split(&dir, "m", 3);
    let whole = GgufFile::from_bytes(builder.build()).expect("the unsplit file");
    let split = GgufFile::open(&paths[0]).expect("the split model");

    assert_eq!(split.split(), &paths[..]);
    assert!(whole.split().is_empty());
    // Metadata comes from the first shard: the model's, then the split keys.
    assert_eq!(&split.metadata()[..whole.metadata().len()], whole.metadata());
    assert_eq!(split.get("split.count"), Some(&MetaValue::U16(3)));
    // The same tensors in the same order (what a slot file's model
    // fingerprint hashes), each with the same bytes, spread over all three.
    assert_eq!(split.tensors().len(), whole.tensors().len());
    for (ours, theirs) in split.tensors().iter().zip(whole.tensors()) {
        assert_eq!((&ours.name, &ours.dims, ours.dtype), (&theirs.name, &theirs.dims, theirs.dtype));
        assert_eq!(split.data(ours), whole.data(theirs), "{}", ours.name);
        let shared = split.shared_data(ours).expect("in bounds");
        assert_eq!(shared.as_slice(), whole.data(theirs), "{}", ours.name);
    }
    let mut shards: Vec<usize> = split.tensors().iter().map(|tensor| tensor.shard).collect();
    shards.dedup();
    assert_eq!(shards, [0, 1, 2]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_first_shard_without_tensors_loads_as_gguf_split_writes_it() {
    let dir = scratch("empty-first");
    let mut shards = model().split(2);
    let moved: Vec<_> = shards[0].tensors.drain(..).collect();
    shards[1].tensors.splice(0..0, moved);
    let paths = write(&dir, &shards);
    let split = GgufFile::open(&paths[0]).expect("loads");
    assert_eq!(split.tensors().len(), model().tensors.len());
    assert!(split.tensors().iter().all(|tensor| tensor.shard == 1));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn another_shard_than_the_first_is_refused_naming_the_first() {
    let dir = scratch("not-first");
    let paths = model().write_split(&dir, "m", 3);
    assert_eq!(
        error(&paths[1]),
        format!(
            "{}: shard 2 of 3 of a split model; load the model from its first shard, m-00001-of-00003.gguf",
            paths[1].display()
        )
    );
}

#[test]
fn a_missing_shard_is_named() {
    let dir = scratch("missing");
    let paths = model().write_split(&dir, "m", 3);
    std::fs::remove_file(&paths[2]).expect("remove");
    assert_eq!(error(&paths[0]), format!("{}: shard 3 of 3 is missing", paths[2].display()));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_first_shard_not_named_by_the_rule_is_refused() {
    let dir = scratch("misnamed");
    let path = dir.join("model.gguf");
    std::fs::write(&path, model().split(3)[0].build()).expect("write");
    assert_eq!(
        error(&path),
        format!(
            "{}: the first of 3 shards must be named PREFIX-00001-of-00003.gguf for the others to be found",
            path.display()
        )
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_shard_of_another_split_or_out_of_place_is_refused() {
    let dir = scratch("foreign");
    let mut shards = model().split(3);
    // The second shard of a split of the same model into four.
    shards[1] = model().split(4)[1].clone();
    let paths = write(&dir, &shards);
    assert_eq!(
        error(&paths[0]),
        format!("{}: split.count = 4, but {} says 3: a shard of another split", paths[1].display(), paths[0].display())
    );

    let mut shards = model().split(3);
    shards.swap(1, 2);
    let paths = write(&dir, &shards);
    assert_eq!(
        error(&paths[0]),
        format!("{}: split.no = 2, but the file named as shard 2 of 3 must say 1", paths[1].display())
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_tensor_in_two_shards_or_a_wrong_total_is_refused() {
    let dir = scratch("tensors");
    let mut shards = model().split(3);
    let twice = shards[1].tensors[0].clone();
    shards[2].tensors.push(twice.clone());
    let paths = write(&dir, &shards);
    assert_eq!(
        error(&paths[0]),
        format!("{}: tensor {:?} is also in {}", paths[2].display(), twice.name, paths[1].display())
    );

    let mut shards = model().split(3);
    shards[0] = shards[0].clone().meta("split.tensors.count", Value::I32(5));
    let paths = write(&dir, &shards);
    let total = model().tensors.len();
    assert_eq!(
        error(&paths[0]),
        format!("{}: split.tensors.count = 5, but the 3 shards hold {total} tensors", paths[0].display())
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_truncated_shard_is_refused_naming_it_and_the_field() {
    let dir = scratch("truncated");
    let paths = model().write_split(&dir, "m", 3);
    let bytes = std::fs::read(&paths[2]).expect("read");
    std::fs::write(&paths[2], &bytes[..bytes.len() - 1]).expect("truncate");
    let message = error(&paths[0]);
    assert!(message.starts_with(&format!("{}: tensor ", paths[2].display())), "{message}");
    assert!(message.contains("runs past the end of the data section"), "{message}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_shard_read_from_memory_is_refused() {
    let first = model().split(3)[0].build();
    assert_eq!(
        GgufFile::from_bytes(first).expect_err("refused").to_string(),
        "shard 1 of 3 of a split model read from memory: the other shards are found by path"
    );
    // A count of 1 is a whole file, as llama.cpp reads it.
    assert!(GgufFile::from_bytes(model().split(1)[0].build()).is_ok());
}
