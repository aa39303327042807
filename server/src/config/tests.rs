//! The config's tests: defaults, every section, errors with file, line and
//! key, flags over the file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::*;
use sluice_engine::OnFault;
use sluice_plugin_host::{PluginLimits, PluginSource};

#[test]
fn defaults_select_chunked_and_fail_closed() {
    let config = Config::parse("").expect("empty config is valid");
    assert_eq!(config.policy.source(), Ok(PluginSource::Builtin("chunked")));
    assert_eq!(config.policy.on_fault, OnFault::FailClosed);
    assert_eq!(config.policy.stall_steps, 64);
    assert_eq!(config.policy.limits(), PluginLimits::default());
}

#[test]
fn limits_and_settings_are_read() {
    let config = Config::parse(
        "[policy]\nplugin = \"my/policy.wasm\"\non_fault = \"fallback\"\nfuel = 5\ndeadline_ms = 7\nmemory_mb = 3\n[policy.settings]\nmax_members = 4\n",
    )
    .expect("valid");
    assert_eq!(config.policy.source(), Ok(PluginSource::Path("my/policy.wasm".into())));
    assert_eq!(config.policy.on_fault, OnFault::Fallback);
    assert_eq!(config.policy.limits(), PluginLimits { fuel: 5, deadline_ms: 7, memory_mb: 3 });
    assert_eq!(config.policy.settings.get("max_members"), Some(&toml::Value::Integer(4)));
}

#[test]
fn errors_name_line_and_key() {
    let unknown = Config::parse("[policy]\nplugin = \"continuous\"\nfule = 5\n").unwrap_err();
    assert!(unknown.contains("line 3") && unknown.contains("unknown field `fule`"), "{unknown}");
    let wrong_type = Config::parse("[policy]\n\nfuel = \"lots\"\n").unwrap_err();
    assert!(wrong_type.contains("line 3") && wrong_type.contains("fuel"), "{wrong_type}");
    let bad_fault = Config::parse("[policy]\non_fault = \"retry\"\n").unwrap_err();
    assert!(bad_fault.contains("line 2") && bad_fault.contains("fail-closed"), "{bad_fault}");
    let zero = Config::parse("[policy]\nmemory_mb = 0\n").unwrap_err();
    assert_eq!(zero, "`policy.memory_mb` must be at least 1");
    let unknown_builtin = Config::parse("[policy]\nplugin = \"fastest\"\n").unwrap_err();
    assert!(unknown_builtin.contains("\"fastest\" is neither a built-in policy (continuous"), "{unknown_builtin}");
}

#[test]
fn relative_plugin_paths_resolve_against_the_config_file() {
    let dir = std::env::temp_dir().join(format!("sluice-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("sluice.toml");
    std::fs::write(&file, "[policy]\nplugin = \"plugins/mine.wasm\"\n").expect("write config");
    let config = Config::load(&file).expect("valid");
    assert_eq!(config.policy.source(), Ok(PluginSource::Path(dir.join("plugins/mine.wasm"))));
    let missing = Config::load(&dir.join("absent.toml")).unwrap_err().to_string();
    assert!(missing.contains("absent.toml: cannot read"), "{missing}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn shadows_come_from_the_file_or_the_flags_which_replace_them() {
    let text = "[policy]\nshadow_budget_us = 500\n[[policy.shadow]]\nplugin = \"cohort\"\n\
                [policy.shadow.settings]\nmax_members = 2\n[[policy.shadow]]\nplugin = \"prefill-first\"\n";
    let mut config = Config::parse(text).expect("valid");
    assert_eq!(config.policy.shadow_budget_us, 500);
    assert_eq!(config.policy.shadow.len(), 2);
    assert_eq!(config.policy.shadow[0].settings.get("max_members"), Some(&toml::Value::Integer(2)));
    let shadow = config.policy.for_shadow(&config.policy.shadow[0]);
    assert_eq!((shadow.plugin.as_str(), shadow.limits(), shadow.shadow.len()), ("cohort", config.policy.limits(), 0));
    let flags = Overrides {
        policy_shadow: vec!["chunked,target_step_ms=50,label=x".into()],
        record_trace: Some("steps.jsonl".into()),
        ..Overrides::default()
    };
    config.apply(&flags).expect("valid flags");
    assert_eq!(config.policy.shadow.len(), 1);
    let settings = &config.policy.shadow[0].settings;
    assert_eq!(settings.get("target_step_ms"), Some(&toml::Value::Integer(50)));
    assert_eq!(settings.get("label"), Some(&toml::Value::String("x".into())));
    assert_eq!(config.server.record_trace, Some(PathBuf::from("steps.jsonl")));
    let unknown = Config::parse("[[policy.shadow]]\nplugin = \"fastest\"\n").unwrap_err();
    assert!(unknown.contains("`policy.shadow[0].plugin` = \"fastest\" is neither"), "{unknown}");
    let twice = Config::parse("[[policy.shadow]]\nplugin = \"cohort\"\n[[policy.shadow]]\nplugin = \"cohort\"\n");
    assert!(twice.unwrap_err().contains("`policy.shadow[1].plugin` = \"cohort\" is listed twice"));
    let bad = Overrides { policy_shadow: vec!["cohort,max_members".into()], ..Overrides::default() };
    assert_eq!(
        Config::default().apply(&bad).unwrap_err(),
        "--policy-shadow cohort,max_members: `max_members` is not KEY=VALUE"
    );
}

#[test]
fn every_section_parses_with_its_defaults() {
    let config = Config::parse("").expect("valid");
    assert_eq!(config.server, ServerConfig::default());
    assert_eq!((config.server.host.as_str(), config.server.port), ("127.0.0.1", 8080));
    assert_eq!(config.model.path(), PathBuf::from(DEFAULT_MODEL));
    assert_eq!(config.engine, EngineSection::default());
    assert_eq!(config.defaults, RequestDefaults::default());
    assert_eq!(config.speculative, SpeculativeConfig::default());
    assert!(config.lora.is_empty());
    assert_eq!(config.log.format, LogFormat::Text);
    assert_eq!(config.model.device, "cpu");
    // What the engine makes of these defaults: startup's tests.
}

#[test]
fn the_shipped_config_is_valid_and_points_at_the_default_model() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/sluice.toml");
    let config = Config::load(&file).expect("config/sluice.toml is valid");
    let model = config.model.path();
    assert!(model.ends_with("../target/models/SmolLM2-135M-Instruct.Q4_1.gguf"), "{}", model.display());
    assert_eq!(config.engine, EngineSection::default());
    // The shipped config serves /metrics, which llama-server (and the
    // default) leave off.
    assert_eq!(config.server, ServerConfig { metrics: true, ..ServerConfig::default() });
    assert_eq!(config.defaults, RequestDefaults::default());
    assert_eq!(config.policy.plugin, PolicyConfig::default().plugin);
}

#[test]
fn all_sections_are_read() {
    let text = r#"
[server]
host = "0.0.0.0"
port = 0
api_key = "secret"
threads_http = 3
metrics = false
slots = false
sse_ping_interval = 5
[server.limits]
body_bytes = 1024
n_probs = 20
response_mib = 8
[model]
path = "m.gguf"
alias = "tiny"
chat_template = "chatml"
threads = 2
[engine]
slots = 2
ctx = 0
batch_tokens = 64
kv_block_tokens = 32
prefix_cache = false
queue_limit = 9
[defaults]
n_predict = 16
temperature = 0.0
seed = 42
cache_prompt = false
[speculative]
type = "draft-simple"
draft_model = "draft.gguf"
n_max = 8
n_min = 2
p_min = 0.5
fixups = ["mrope-temporal", "plugins/extra.wasm"]
[[lora]]
path = "a.gguf"
[[lora]]
path = "b.gguf"
scale = 0.5
[log]
level = "sluice=debug"
format = "json"
"#;
    let config = Config::parse(text).expect("valid");
    assert_eq!(config.server.limits.body_bytes, 1024);
    assert_eq!((config.server.limits.n_probs, config.server.limits.response_mib), (20, 8));
    assert_eq!(config.server.api_key.as_deref(), Some("secret"));
    assert_eq!(config.model.name(), "tiny");
    assert_eq!(config.engine.ctx, 0);
    assert_eq!(config.defaults.seed, 42);
    assert_eq!(config.speculative.kind, SpecType::DraftSimple);
    assert_eq!(config.lora[1], LoraConfig { path: "b.gguf".into(), scale: 0.5, name: None });
    assert_eq!(config.log.format, LogFormat::Json);
    assert_eq!(
        config.speculative.fixup_sources(),
        Ok(vec![PluginSource::Builtin("mrope-temporal"), PluginSource::Path("plugins/extra.wasm".into())])
    );
    assert_eq!(SpeculativeConfig::default().fixup_sources(), Ok(vec![PluginSource::Builtin("mrope-temporal")]));
}

#[test]
fn validation_errors_name_file_line_and_key() {
    let dir = std::env::temp_dir().join(format!("sluice-config-lines-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("bad.toml");
    std::fs::write(&file, "[server]\nport = 1\n\n[engine]\nctx = 10\nslots = 0\n").expect("write config");
    let error = Config::load(&file).unwrap_err().to_string();
    assert_eq!(error, format!("{}: line 6: `engine.slots` must be at least 1", file.display()));
    std::fs::write(&file, "[speculative]\nn_max = 1\nn_min = 2\n").expect("write config");
    let error = Config::load(&file).unwrap_err().to_string();
    assert!(error.contains("line 3: `speculative.n_min` (2) must not exceed"), "{error}");
    std::fs::write(&file, "[[lora]]\nscale = 2.0\n").expect("write config");
    let error = Config::load(&file).unwrap_err().to_string();
    assert!(error.contains("missing field `path`"), "{error}");
    std::fs::remove_dir_all(&dir).expect("clean up");
    for (text, key) in [
        ("[engine]\nbatch_tokens = 0\n", "`engine.batch_tokens` must be at least 1"),
        ("[server]\napi_key = \"\"\n", "`server.api_key` must not be empty"),
        ("[server]\nslot_save_path = \"\"\n", "`server.slot_save_path` must not be empty"),
        ("[defaults]\nn_predict = -2\n", "`defaults.n_predict` must be -1"),
        ("[defaults]\nseed = 4294967296\n", "`defaults.seed` must be -1"),
        ("[speculative]\ntype = \"draft-simple\"\n", "needs `speculative.draft_model`"),
        ("[speculative]\nfixups = [\"mrope\"]\n", "`speculative.fixups` entry \"mrope\" is neither"),
        ("[log]\nlevel = \"sluice=loud\"\n", "`log.level`"),
        ("[model]\ndevice = \"gpu\"\n", "`model.device`: \"gpu\" is not a device"),
        ("[model]\nimage_min_tokens = 0\n", "`model.image_min_tokens` must be 1 to 65536"),
        ("[model]\nimage_max_tokens = 65537\n", "`model.image_max_tokens` must be 1 to 65536"),
        (
            "[model]\nimage_min_tokens = 300\nimage_max_tokens = 200\n",
            "`model.image_min_tokens` (300) must not exceed `model.image_max_tokens` (200)",
        ),
    ] {
        let error = Config::parse(text).unwrap_err();
        assert!(error.contains(key), "{text}: {error}");
    }
    let wrong = Config::parse("[speculative]\ntype = \"ngram-simple\"\n").unwrap_err();
    assert!(wrong.contains("line 2") && wrong.contains("draft-simple"), "{wrong}");
}

#[test]
fn relative_model_paths_resolve_against_the_config_file() {
    let dir = std::env::temp_dir().join(format!("sluice-config-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("sluice.toml");
    let text =
        "[server]\nslot_save_path = \"slots\"\n[model]\npath = \"models/m.gguf\"\n[[lora]]\npath = \"/abs/a.gguf\"\n";
    std::fs::write(&file, text).expect("write");
    let config = Config::load(&file).expect("valid");
    assert_eq!(config.model.path(), dir.join("models/m.gguf"));
    assert_eq!(config.server.slot_save_path, Some(dir.join("slots")));
    assert_eq!(config.lora[0].path, PathBuf::from("/abs/a.gguf"));
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn flags_override_the_file() {
    let mut config = Config::parse("[engine]\nslots = 2\n[server]\nslots = true\n").expect("valid");
    let flags = Overrides {
        parallel: Some(1),
        port: Some(0),
        n_predict: Some(8),
        seed: Some(7),
        no_slots: true,
        no_cache_prompt: true,
        model: Some("x.gguf".into()),
        device: Some("cuda:1".into()),
        slot_save_path: Some("slots".into()),
        ..Overrides::default()
    };
    config.apply(&flags).expect("valid flags");
    assert_eq!(config.server.slot_save_path, Some(PathBuf::from("slots")));
    assert_eq!((config.engine.slots, config.server.port, config.server.slots), (1, 0, false));
    assert_eq!((config.defaults.n_predict, config.defaults.seed, config.defaults.cache_prompt), (8, 7, false));
    assert_eq!(config.model.path(), PathBuf::from("x.gguf"));
    assert_eq!(config.model.device, "cuda:1");
    let bad = Overrides { n_predict: Some(-3), ..Overrides::default() };
    assert!(config.apply(&bad).unwrap_err().contains("defaults.n_predict"));
    let scaled = Overrides { lora_scaled: vec!["a.gguf:0.5,b.gguf:1".into()], ..Overrides::default() };
    let mut config = Config::default();
    config.apply(&scaled).expect("valid");
    assert_eq!(config.lora.len(), 2);
    assert_eq!(config.lora[0].scale, 0.5);
    let broken = Overrides { lora_scaled: vec!["a.gguf".into()], ..Overrides::default() };
    assert!(config.apply(&broken).unwrap_err().contains("FILE:SCALE"));
}

#[test]
fn adapters_are_named_apart_and_can_start_unapplied() {
    let flags = Overrides {
        lora: vec!["x/adapter.gguf".into(), "y/adapter.gguf".into()],
        lora_scaled: vec!["sql.gguf:0.5".into()],
        lora_init_without_apply: true,
        ..Overrides::default()
    };
    let mut config = Config::parse("[[lora]]\npath = \"chat.gguf\"\nname = \"chat\"\n").expect("valid");
    config.apply(&flags).expect("valid");
    assert_eq!(adapter_names(&config.lora), ["chat", "adapter", "adapter-2", "sql"]);
    assert!(config.lora.iter().all(|lora| lora.scale == 0.0), "--lora-init-without-apply");
    let taken = "[[lora]]\npath = \"a.gguf\"\nname = \"b\"\n[[lora]]\npath = \"c.gguf\"\nname = \"b\"\n";
    let error = Config::parse(taken).unwrap_err().to_string();
    assert!(error.contains("`lora.name` \"b\" of c.gguf is an earlier adapter's name"), "{error}");
    let model = Config::parse("[model]\nalias = \"m\"\n[[lora]]\npath = \"m.gguf\"\n");
    assert!(model.unwrap_err().to_string().contains("is the model's name"));
}

#[test]
fn flags_parse_with_llama_server_names() {
    use clap::{Args, FromArgMatches};
    let command = Overrides::augment_args(clap::Command::new("serve"));
    command.clone().debug_assert();
    let args = ["serve", "-m", "m.gguf", "-n", "-1", "--temp", "0.5", "--seed", "-1", "--no-slots", "--lora", "a.gguf"];
    let args = llama_style_args(["sluice"].into_iter().chain(args).map(OsString::from)).unwrap().args.split_off(1);
    let matches = command.clone().try_get_matches_from(args).expect("flags parse");
    let flags = Overrides::from_arg_matches(&matches).expect("flags convert");
    assert_eq!((flags.model, flags.n_predict, flags.seed), (Some("m.gguf".into()), Some(-1), Some(-1)));
    assert_eq!((flags.temp, flags.no_slots, flags.lora.len()), (Some(0.5), true, 1));
    let args = ["serve", "-np", "0"].map(OsString::from);
    assert!(command.clone().try_get_matches_from(llama_style_args(args).unwrap().args).is_err(), "at least one slot");
    let args = ["serve", "--image-min-tokens", "64", "--image-max-tokens", "1024"].map(OsString::from);
    let matches = command.clone().try_get_matches_from(llama_style_args(args).unwrap().args).expect("flags parse");
    let flags = Overrides::from_arg_matches(&matches).expect("flags convert");
    let mut config = Config::default();
    config.apply(&flags).expect("valid");
    assert_eq!((config.model.image_min_tokens, config.model.image_max_tokens), (Some(64), Some(1024)));
    let args = ["serve", "--image-max-tokens", "0"].map(OsString::from);
    assert!(command.try_get_matches_from(llama_style_args(args).unwrap().args).is_err(), "at least one row");
}

#[test]
fn the_context_flag_counts_as_llama_server_s_does() {
    let ctx = |flags: Overrides| {
        let mut config = Config::default();
        config.apply(&flags).expect("valid flags");
        config.engine.ctx
    };
    let base = Overrides { ctx_size: Some(2048), ..Overrides::default() };
    assert_eq!(ctx(base.clone()), 2048, "without -np, each slot's");
    assert_eq!(ctx(Overrides { parallel: Some(4), ..base.clone() }), 512, "shared out among -np slots");
    assert_eq!(ctx(Overrides { parallel: Some(4), kv_unified: true, ..base.clone() }), 2048, "unified");
    assert_eq!(ctx(Overrides { parallel: Some(4), kv_unified_per_slot: Some(100), ..base }), 100);
}

#[test]
fn reasoning_defaults_come_from_the_file_and_llama_server_flags() {
    let mut config = Config::parse("[defaults]\nreasoning_format = \"none\"\nreasoning = \"off\"\n").expect("valid");
    assert_eq!((config.defaults.reasoning_format, config.defaults.reasoning), (ReasoningFormat::None, Thinking::Off));
    assert_eq!(
        (RequestDefaults::default().reasoning_format, RequestDefaults::default().reasoning),
        (ReasoningFormat::Auto, Thinking::Auto)
    );
    let wrong = Config::parse("[defaults]\n\nreasoning_format = \"deepseek_legacy\"\n").unwrap_err();
    assert!(wrong.contains("line 3") && wrong.contains("deepseek-legacy"), "{wrong}");

    use clap::{Args, FromArgMatches};
    let command = Overrides::augment_args(clap::Command::new("serve"));
    let args = ["sluice", "serve", "-rea", "enabled", "--reasoning-format", "deepseek-legacy"].map(OsString::from);
    let matches = command.try_get_matches_from(llama_style_args(args).unwrap().args.split_off(1)).expect("parse");
    let flags = Overrides::from_arg_matches(&matches).expect("flags convert");
    config.apply(&flags).expect("valid flags");
    assert_eq!(
        (config.defaults.reasoning_format, config.defaults.reasoning),
        (ReasoningFormat::DeepseekLegacy, Thinking::On)
    );
    assert_eq!([Thinking::On, Thinking::Auto, Thinking::Off].map(Thinking::enable_thinking), [true, true, false]);
    let bad_format = Overrides { reasoning_format: Some("nothink".into()), ..Overrides::default() };
    assert!(config.apply(&bad_format).unwrap_err().starts_with("--reasoning-format nothink"));
    let bad_mode = Overrides { reasoning: Some("maybe".into()), ..Overrides::default() };
    assert!(config.apply(&bad_mode).unwrap_err().starts_with("--reasoning maybe"));
}

#[test]
fn kv_cache_types_come_from_the_file_and_llama_server_flags() {
    use sluice_kernels::backend::KvType;
    let defaults = Config::default();
    assert_eq!((defaults.engine.cache_type_k, defaults.engine.cache_type_v), (KvType::F16, KvType::F16));
    let mut config = Config::parse("[engine]\ncache_type_k = \"q8_0\"\n").expect("valid");
    assert_eq!((config.engine.cache_type_k, config.engine.cache_type_v), (KvType::Q8_0, KvType::F16));
    let wrong = Config::parse("[engine]\n\ncache_type_v = \"q4_0\"\n").unwrap_err();
    assert!(wrong.contains("line 3") && wrong.contains("the KV cache holds f16 or q8_0, not \"q4_0\""), "{wrong}");

    use clap::{Args, FromArgMatches};
    let command = Overrides::augment_args(clap::Command::new("serve"));
    let args = ["sluice", "serve", "-ctk", "f16", "-ctv", "q8_0"].map(OsString::from);
    let matches =
        command.clone().try_get_matches_from(llama_style_args(args).unwrap().args.split_off(1)).expect("parse");
    config.apply(&Overrides::from_arg_matches(&matches).expect("flags convert")).expect("valid flags");
    assert_eq!((config.engine.cache_type_k, config.engine.cache_type_v), (KvType::F16, KvType::Q8_0));
    for other in ["f32", "bf16", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"] {
        let args = ["sluice", "serve", "-ctk", other].map(OsString::from);
        let error = command.clone().try_get_matches_from(llama_style_args(args).unwrap().args.split_off(1));
        let error = error.expect_err(other).to_string();
        assert!(error.contains("--cache-type-k") && error.contains("the KV cache holds f16 or q8_0"), "{error}");
    }
}
