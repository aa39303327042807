//! `POST /slots/{id_slot}?action=save|restore|erase`, llama-server's slot
//! files under `--slot-save-path` (docs/slot-files.md). The engine hands
//! over or takes a slot's cache (`engine::slot_store`); the files are
//! written and read here, on a blocking thread, and only directly inside
//! the configured folder.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::Json;
use axum::extract::{Path as UrlPath, RawQuery, State};
use serde_json::{Value, json};

use super::error::{ApiError, ErrorType};
use super::extract::RawBody;
use super::generate::blocking;
use super::state::AppState;
use sluice_engine::slot_store::{KvLayout, SlotActionError, SlotFile};

/// The longest file name most file systems take.
const NAME_MAX: usize = 255;

pub async fn action(
    State(state): State<AppState>,
    UrlPath(id_slot): UrlPath<String>,
    RawQuery(query): RawQuery,
    RawBody(body, _turn): RawBody,
) -> Result<Json<Value>, ApiError> {
    let Some(folder) = state.config().server.slot_save_path.clone() else {
        return Err(ApiError::new(
            ErrorType::NotSupported,
            "This server does not support slots action. Start it with `--slot-save-path`",
        ));
    };
    let ready = state.ready()?;
    let engine = &ready.engine;
    let slot = id_slot
        .parse::<usize>()
        .ok()
        .filter(|&slot| slot < engine.config().slots)
        .ok_or_else(|| ApiError::invalid("Invalid slot ID"))?;
    let action = query.as_deref().unwrap_or("").split('&').find_map(|pair| pair.strip_prefix("action="));
    let started = Instant::now();
    let ms = |started: Instant| started.elapsed().as_secs_f64() * 1e3;
    match action {
        Some("save") => {
            let filename = filename(&body)?;
            let file = engine.save_slot(slot).await.map_err(slot_error)?;
            let n_saved = file.tokens.len();
            let (layout, name) = (engine.kv_layout().clone(), filename.clone());
            let n_written = blocking(move || write(&folder, &name, &file, &layout)).await?;
            Ok(Json(json!({
                "id_slot": slot,
                "filename": filename,
                "n_saved": n_saved,
                "n_written": n_written,
                "timings": { "save_ms": ms(started) },
            })))
        }
        Some("restore") => {
            let filename = filename(&body)?;
            let (layout, name, max_tokens) = (engine.kv_layout().clone(), filename.clone(), engine.config().ctx);
            let (file, n_read) = blocking(move || read(&folder, &name, &layout, max_tokens)).await?;
            let n_restored = engine.restore_slot(slot, file).await.map_err(slot_error)?;
            Ok(Json(json!({
                "id_slot": slot,
                "filename": filename,
                "n_restored": n_restored,
                "n_read": n_read,
                "timings": { "restore_ms": ms(started) },
            })))
        }
        Some("erase") => {
            let n_erased = engine.erase_slot(slot).await.map_err(slot_error)?;
            Ok(Json(json!({ "id_slot": slot, "n_erased": n_erased })))
        }
        _ => Err(ApiError::invalid("Invalid action")),
    }
}

/// The body's `filename`, if it names a file directly inside the folder.
fn filename(body: &[u8]) -> Result<String, ApiError> {
    let body: Value = serde_json::from_slice(body)
        .map_err(|error| ApiError::invalid(format!("Invalid filename: the body is not JSON ({error})")))?;
    match body.get("filename") {
        Some(Value::String(name)) if valid_filename(name) => Ok(name.clone()),
        Some(Value::String(_)) => Err(ApiError::invalid("Invalid filename")),
        _ => Err(ApiError::invalid("Invalid filename: the body needs `filename`, a file name in --slot-save-path")),
    }
}

/// llama.cpp's `fs_validate_filename` without subfolders: one path
/// component that means the same on every file system, so that no name
/// reaches outside the folder or collides with another after a system
/// rewrites it (Windows drops trailing dots and spaces).
fn valid_filename(name: &str) -> bool {
    let refused = |c: char| {
        matches!(c, '\0'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '/' | '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|')
            // Look-alikes of the full stop and the slashes, and
            // invisible marks that make one name look like another.
            || matches!(c, '\u{ff0e}' | '\u{2215}' | '\u{2216}' | '\u{feff}' | '\u{200b}'..='\u{200f}' | '\u{2028}' | '\u{2029}')
    };
    !name.is_empty()
        && name.len() <= NAME_MAX
        && !name.starts_with(' ')
        && !name.ends_with([' ', '.'])
        && !name.contains("..")
        && !name.chars().any(refused)
}

/// The action failed in the engine.
fn slot_error(error: SlotActionError) -> ApiError {
    let kind = match &error {
        SlotActionError::NoSlot { .. } | SlotActionError::Malformed { .. } => ErrorType::InvalidRequest,
        SlotActionError::NoRoom { .. } | SlotActionError::Stopped => ErrorType::Unavailable,
        SlotActionError::NoPrefixCache | SlotActionError::Draft | SlotActionError::Window => ErrorType::NotSupported,
        SlotActionError::Backend(_) => ErrorType::Server,
    };
    let message = match std::error::Error::source(&error) {
        Some(source) => format!("{error}: {source}"),
        None => error.to_string(),
    };
    ApiError::new(kind, message)
}

/// Temporary files are told apart by process and by this count.
static WRITES: AtomicU64 = AtomicU64::new(0);

/// Write `file` as `name` in `folder` (made if missing); the bytes written.
/// The file is written under a temporary name and renamed over `name`:
/// nobody reads half a file, and a link already at `name` is replaced,
/// never followed out of the folder.
fn write(folder: &Path, name: &str, file: &SlotFile, layout: &KvLayout) -> Result<u64, ApiError> {
    let failed = |error: io::Error| {
        ApiError::new(ErrorType::Server, format!("cannot write slot file {name:?} in {}: {error}", folder.display()))
    };
    std::fs::create_dir_all(folder).map_err(failed)?;
    let temporary = folder.join(format!(".slot-{}-{}.tmp", std::process::id(), WRITES.fetch_add(1, Ordering::Relaxed)));
    let written =
        write_new(&temporary, file, layout).and_then(|n| std::fs::rename(&temporary, folder.join(name)).map(|()| n));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.map_err(failed)
}

fn write_new(path: &Path, file: &SlotFile, layout: &KvLayout) -> io::Result<u64> {
    let mut out = BufWriter::new(File::create_new(path)?);
    let n = file.write_to(layout, &mut out)?;
    out.flush()?;
    Ok(n)
}

/// Read slot file `name` of `folder`, refusing one larger than a slot of
/// `max_tokens` can be before reading it; the file and its length.
fn read(folder: &Path, name: &str, layout: &KvLayout, max_tokens: usize) -> Result<(SlotFile, u64), ApiError> {
    let path = folder.join(name);
    let invalid = |problem: String| ApiError::invalid(format!("slot file {name:?}: {problem}"));
    let failed = |error: io::Error| match error.kind() {
        io::ErrorKind::NotFound => invalid(format!("no such file in the slot save path {}", folder.display())),
        _ => ApiError::new(ErrorType::Server, format!("cannot read slot file {name:?}: {error}")),
    };
    // Checked before opening too: opening a FIFO would wait for a writer.
    if !std::fs::metadata(&path).map_err(failed)?.is_file() {
        return Err(invalid("not a regular file".into()));
    }
    let file = File::open(&path).map_err(failed)?;
    let metadata = file.metadata().map_err(failed)?;
    if !metadata.is_file() {
        return Err(invalid("not a regular file".into()));
    }
    let limit = layout.file_len(max_tokens as u64);
    if metadata.len() > limit {
        return Err(invalid(format!(
            "{} bytes, more than a slot of {max_tokens} tokens here takes ({limit})",
            metadata.len()
        )));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    // Bounded even if the file grows meanwhile.
    file.take(limit + 1).read_to_end(&mut bytes).map_err(failed)?;
    let n_read = bytes.len() as u64;
    let slot_file = SlotFile::parse(bytes, layout, max_tokens).map_err(|error| invalid(error.to_string()))?;
    Ok((slot_file, n_read))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_inside_the_folder_are_valid() {
        for good in ["slot1.bin", "a", "a.b.c", "名前.bin", "x y", ".hidden", &"n".repeat(NAME_MAX)] {
            assert!(valid_filename(good), "{good:?}");
        }
        let paths = ["", ".", "..", "../x", "x/..", "a/b", "/abs", "a\\b", "..\\x", "a..b", "\u{2215}etc", "a\u{ff0e}"];
        let tricks = ["x\0y", "a\nb", "x\u{85}", "\u{feff}x", "c:x", "x?", "x*", "a|b", " lead", "trail ", "dot."];
        for bad in paths.into_iter().chain(tricks).chain([&*"n".repeat(NAME_MAX + 1)]) {
            assert!(!valid_filename(bad), "{bad:?}");
        }
    }

    #[test]
    fn filenames_come_from_the_body() {
        assert_eq!(filename(br#"{"filename":"s.bin"}"#), Ok("s.bin".to_owned()));
        for body in [&br#"{"filename":"../s.bin"}"#[..], br#"{"filename":7}"#, b"{}", b"", b"not json"] {
            let error = filename(body).expect_err("refused");
            assert!(error.message.starts_with("Invalid filename"), "{error:?}");
            assert_eq!(error.status().as_u16(), 400);
        }
    }
}
