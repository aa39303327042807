//! `[policy.settings]` (a TOML table) → the `list<setting>` of `configure`.

use super::policy_types::{Setting, SettingValue};

/// Flatten a settings table: nested tables become dotted keys; values must be
/// booleans, integers, floats or strings. The error names the offending key.
pub fn settings_from_toml(table: &toml::Table) -> Result<Vec<Setting>, String> {
    let mut settings = Vec::new();
    flatten("", table, &mut settings)?;
    Ok(settings)
}

fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<Setting>) -> Result<(), String> {
    for (key, value) in table {
        let key = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        let value = match value {
            toml::Value::Boolean(value) => SettingValue::Boolean(*value),
            toml::Value::Integer(value) => SettingValue::Integer(*value),
            toml::Value::Float(value) => SettingValue::Float(*value),
            toml::Value::String(value) => SettingValue::Text(value.clone()),
            toml::Value::Table(nested) => {
                flatten(&key, nested, out)?;
                continue;
            }
            toml::Value::Array(_) | toml::Value::Datetime(_) => {
                return Err(format!(
                    "setting `{key}`: {} values are not supported (use booleans, numbers or strings)",
                    value.type_str()
                ));
            }
        };
        out.push(Setting { key, value });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_tables_flatten_to_dotted_keys() {
        let table: toml::Table =
            toml::from_str("max_members = 4\nshare = 0.5\n[slo]\nttft_ms = 200\nname = \"x\"\nstrict = true")
                .expect("valid toml");
        let settings = settings_from_toml(&table).expect("all scalar");
        let keys: Vec<&str> = settings.iter().map(|setting| setting.key.as_str()).collect();
        assert_eq!(keys, ["max_members", "share", "slo.name", "slo.strict", "slo.ttft_ms"]);
        assert_eq!(settings[0].value, SettingValue::Integer(4));
        assert_eq!(settings[1].value, SettingValue::Float(0.5));
    }

    #[test]
    fn arrays_are_refused_by_key() {
        let table: toml::Table = toml::from_str("[a]\nlist = [1, 2]").expect("valid toml");
        let error = settings_from_toml(&table).unwrap_err();
        assert_eq!(error, "setting `a.list`: array values are not supported (use booleans, numbers or strings)");
    }
}
