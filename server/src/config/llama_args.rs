//! llama-server's command line, as `sluice serve` reads it: every flag of
//! llama-server b11434 is either one of sluice's own (perhaps under another
//! spelling), accepted and ignored with a logged reason, or refused with
//! the missing feature named. Nothing llama-server accepts reads as an
//! "unexpected argument".

use std::ffi::OsString;

use super::llama_table::{Action, FLAGS};

/// The `serve` command line with llama-server's spellings translated, and
/// what was ignored.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LlamaArgs {
    pub args: Vec<OsString>,
    /// One line per ignored flag: the flag (and value) and why.
    pub ignored: Vec<String>,
}

/// Translate llama-server's spellings in the arguments after `serve`:
/// the multi-letter short flags (`-np`, `-ngl`), other long names
/// (`--temperature`) and underscores (`--ctx_size`) become sluice's flags;
/// ignored flags are dropped with their values and noted; a refused flag
/// is an error naming it. Arguments of other subcommands pass unchanged.
pub fn llama_style_args(args: impl IntoIterator<Item = OsString>) -> Result<LlamaArgs, String> {
    let mut out = LlamaArgs::default();
    let mut args = args.into_iter();
    for arg in args.by_ref() {
        let serving = arg == "serve";
        out.args.push(arg);
        if serving {
            break;
        }
    }
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else {
            out.args.push(arg);
            continue;
        };
        let (name, inline) = match text.split_once('=') {
            Some((name, value)) if name.starts_with('-') => (name, Some(value.to_owned())),
            _ => (text, None),
        };
        let name = if name.starts_with("--") { name.replace('_', "-") } else { name.to_owned() };
        let Some(flag) = FLAGS.iter().find(|flag| flag.names.contains(&name.as_str())) else {
            out.args.push(arg);
            continue;
        };
        let value = match (flag.value, inline) {
            (true, Some(value)) => Some(value),
            (true, None) => {
                let value = args.next().ok_or_else(|| format!("`{name}` needs a value"))?;
                Some(value.into_string().map_err(|_| format!("`{name}`: the value is not UTF-8"))?)
            }
            (false, Some(_)) => return Err(format!("`{name}` takes no value")),
            (false, None) => None,
        };
        let shown = match &value {
            Some(value) => format!("{name} {value}"),
            None => name.clone(),
        };
        match flag.action {
            Action::Native | Action::Alias(_) => {
                let to = if let Action::Alias(to) = flag.action { to.to_owned() } else { name };
                out.args.push(to.into());
                out.args.extend(value.map(OsString::from));
            }
            Action::Ignore(why) => out.ignored.push(format!("`{shown}` is ignored: {why}")),
            Action::Unless { off, missing } => match value.as_deref() {
                Some(value) if off.iter().any(|off| same_value(off, value)) => {
                    out.ignored.push(format!("`{shown}` is ignored: it is llama-server's default, as sluice behaves"));
                }
                _ => return Err(format!("`{shown}`: {missing}")),
            },
            Action::Refuse(missing) => return Err(format!("`{shown}`: {missing}")),
        }
    }
    Ok(out)
}

/// Equal as text, or as numbers (`0` and `0.00`).
fn same_value(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b) || matches!((a.parse::<f64>(), b.parse::<f64>()), (Ok(a), Ok(b)) if a == b)
}

/// The Markdown table of every llama-server flag and what `sluice serve`
/// does with it (README's copy is checked against this).
pub fn flag_table() -> String {
    let mut table = String::from("| llama-server flag | value | in sluice |\n|---|---|---|\n");
    for flag in FLAGS {
        let names: Vec<String> = flag.names.iter().map(|name| format!("`{name}`")).collect();
        let what = match flag.action {
            Action::Native => "the same".to_owned(),
            Action::Alias(to) => format!("`{to}`"),
            Action::Ignore(why) => format!("ignored: {why}"),
            Action::Refuse(missing) => format!("refused: {missing}"),
            Action::Unless { off, missing } => {
                let off: Vec<String> = off.iter().map(|off| format!("`{off}`")).collect();
                format!("ignored for {}; otherwise refused: {missing}", off.join(", "))
            }
        };
        table.push_str(&format!("| {} | {} | {what} |\n", names.join(", "), if flag.value { "yes" } else { "" }));
    }
    table
}

/// `sluice serve --help`'s last part: the llama-server flags that are not
/// sluice's own, by what happens to them.
pub fn help_epilogue() -> String {
    let list = |pick: fn(&Action) -> bool| {
        let names: Vec<&str> =
            FLAGS.iter().filter(|flag| pick(&flag.action)).filter_map(|f| f.names.last().copied()).collect();
        names.join(" ")
    };
    format!(
        "llama-server's other flags are accepted too (README lists what each does).\n\
         Ignored, with the reason logged at start:\n  {}\n\
         Ignored at llama-server's default value, refused otherwise:\n  {}\n\
         Refused, naming what sluice lacks:\n  {}",
        list(|action| matches!(action, Action::Ignore(_))),
        list(|action| matches!(action, Action::Unless { .. })),
        list(|action| matches!(action, Action::Refuse(_))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translate(args: &[&str]) -> Result<LlamaArgs, String> {
        llama_style_args(["sluice", "serve"].iter().chain(args).map(OsString::from))
    }

    fn strings(args: &LlamaArgs) -> Vec<&str> {
        args.args.iter().skip(2).map(|arg| arg.to_str().expect("utf-8")).collect()
    }

    #[test]
    fn llama_spellings_become_sluice_flags() {
        let args = ["-np", "4", "-md", "d.gguf", "--ctx_size=128", "--temperature", "0.5", "-n", "-1", "-a", "x"];
        let out = translate(&args).unwrap();
        assert_eq!(
            strings(&out),
            [
                "--parallel",
                "4",
                "--model-draft",
                "d.gguf",
                "--ctx-size",
                "128",
                "--temp",
                "0.5",
                "-n",
                "-1",
                "--alias",
                "x"
            ]
        );
        assert!(out.ignored.is_empty());
        let other = llama_style_args(["sluice", "generate", "-np"].map(OsString::from)).unwrap();
        assert_eq!(other.args, ["sluice", "generate", "-np"].map(OsString::from));
    }

    #[test]
    fn ignored_flags_drop_with_their_values_and_say_why() {
        let out = translate(&["-ngl", "99", "-fa", "on", "--jinja", "-m", "m.gguf", "-ctkd", "f16", "--cont_batching"])
            .unwrap();
        assert_eq!(strings(&out), ["-m", "m.gguf"]);
        assert_eq!(out.ignored.len(), 5, "{:?}", out.ignored);
        assert!(out.ignored[0].starts_with("`-ngl 99` is ignored: "), "{}", out.ignored[0]);
        assert!(out.ignored[3].contains("llama-server's default"), "{}", out.ignored[3]);
    }

    #[test]
    fn refused_flags_name_the_flag_and_the_missing_feature() {
        let error = translate(&["-m", "m.gguf", "--embedding"]).unwrap_err();
        assert!(error.starts_with("`--embedding`: ") && error.contains("embeddings"), "{error}");
        let error = translate(&["-ctkd", "q8_0"]).unwrap_err();
        assert!(error.starts_with("`-ctkd q8_0`: "), "{error}");
        assert!(translate(&["--mirostat", "0.0"]).is_ok(), "the disabled value is llama-server's default");
        assert!(translate(&["--mirostat", "2"]).is_err());
        assert_eq!(translate(&["-ngl"]).unwrap_err(), "`-ngl` needs a value");
        assert_eq!(translate(&["--jinja=1"]).unwrap_err(), "`--jinja` takes no value");
    }

    #[test]
    fn kv_cache_types_are_sluice_s_own_flags() {
        let out = translate(&["-ctk", "q8_0", "-ctv=f16", "--cache_type_v", "q8_0"]).unwrap();
        assert_eq!(strings(&out), ["--cache-type-k", "q8_0", "--cache-type-v", "f16", "--cache-type-v", "q8_0"]);
        assert!(out.ignored.is_empty());
    }

    #[test]
    fn every_llama_server_flag_is_in_the_table_once() {
        let listed = include_str!("../../../tests/fixtures/llama-server-b11434-flags.txt");
        let mut seen = std::collections::HashSet::new();
        for flag in FLAGS {
            for name in flag.names {
                assert!(seen.insert(*name), "{name} is in the table twice");
            }
        }
        for name in listed.split_whitespace() {
            assert!(seen.contains(name), "llama-server's {name} is not in the table");
        }
        assert_eq!(seen.len(), listed.split_whitespace().count(), "the table has names llama-server lacks");
    }

    #[test]
    fn native_and_alias_flags_exist_in_sluice() {
        use clap::Args;
        let command = super::super::Overrides::augment_args(clap::Command::new("serve"));
        let known = |name: &str| {
            command.get_arguments().any(|arg| {
                let long = name.strip_prefix("--").is_some_and(|long| {
                    arg.get_long() == Some(long) || arg.get_all_aliases().is_some_and(|a| a.contains(&long))
                });
                let short = name.len() == 2 && name.starts_with('-') && arg.get_short() == name.chars().nth(1);
                long || short
            }) || ["-h", "--help", "--version"].contains(&name)
        };
        for flag in FLAGS {
            match flag.action {
                Action::Native => {
                    for name in flag.names {
                        assert!(known(name), "{name} is marked native but sluice serve lacks it");
                    }
                }
                Action::Alias(to) => assert!(known(to), "{to} (for {:?}) is not a sluice serve flag", flag.names),
                _ => {}
            }
        }
    }

    #[test]
    fn readme_lists_every_flag_as_the_table_does() {
        let readme = include_str!("../../../README.md");
        let table = flag_table();
        assert!(
            readme.contains(&table),
            "README's llama-server flag table differs from flag_table(), which is:\n{table}"
        );
    }
}
