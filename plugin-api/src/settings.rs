//! Typed access to a policy's `[policy.settings]`, with errors that name the
//! offending key (they reach the operator verbatim).

use crate::{Setting, SettingValue};

/// The settings a policy was configured with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    entries: Vec<Setting>,
}

impl Settings {
    /// Wrap the list the host passed to `configure`.
    pub fn new(entries: Vec<Setting>) -> Self {
        Settings { entries }
    }

    /// Build settings from key/value pairs (native tests).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, SettingValue)>) -> Self {
        Settings::new(pairs.into_iter().map(|(key, value)| Setting { key: key.to_owned(), value }).collect())
    }

    /// Fail on any key not in `known`, naming it and the accepted keys.
    pub fn expect_only(&self, known: &[&str]) -> Result<(), String> {
        match self.entries.iter().find(|entry| !known.contains(&entry.key.as_str())) {
            None => Ok(()),
            Some(entry) if known.is_empty() => {
                Err(format!("unknown setting `{}`: this policy takes no settings", entry.key))
            }
            Some(entry) => Err(format!("unknown setting `{}` (expected one of: {})", entry.key, known.join(", "))),
        }
    }

    fn get(&self, key: &str) -> Option<&SettingValue> {
        self.entries.iter().rev().find(|entry| entry.key == key).map(|entry| &entry.value)
    }

    /// An integer setting within `range`, or `default` when absent.
    pub fn integer(&self, key: &str, default: i64, range: std::ops::RangeInclusive<i64>) -> Result<i64, String> {
        let value = match self.get(key) {
            None => return Ok(default),
            Some(SettingValue::Integer(value)) => *value,
            Some(other) => return Err(format!("setting `{key}` must be an integer, got {}", describe(other))),
        };
        if range.contains(&value) {
            Ok(value)
        } else {
            Err(format!("setting `{key}` = {value} is out of range {}..={}", range.start(), range.end()))
        }
    }

    /// An optional integer setting within `range`.
    pub fn optional_integer(&self, key: &str, range: std::ops::RangeInclusive<i64>) -> Result<Option<i64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.integer(key, 0, range).map(Some),
        }
    }

    /// A float setting within `range` (integers are accepted), or `default`.
    pub fn float(&self, key: &str, default: f64, range: std::ops::RangeInclusive<f64>) -> Result<f64, String> {
        let value = match self.get(key) {
            None => return Ok(default),
            Some(SettingValue::Float(value)) => *value,
            Some(SettingValue::Integer(value)) => *value as f64,
            Some(other) => return Err(format!("setting `{key}` must be a number, got {}", describe(other))),
        };
        if range.contains(&value) {
            Ok(value)
        } else {
            Err(format!("setting `{key}` = {value} is out of range {}..={}", range.start(), range.end()))
        }
    }

    /// An optional float setting within `range` (integers are accepted).
    pub fn optional_float(&self, key: &str, range: std::ops::RangeInclusive<f64>) -> Result<Option<f64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.float(key, 0.0, range).map(Some),
        }
    }

    /// A boolean setting, or `default`.
    pub fn boolean(&self, key: &str, default: bool) -> Result<bool, String> {
        match self.get(key) {
            None => Ok(default),
            Some(SettingValue::Boolean(value)) => Ok(*value),
            Some(other) => Err(format!("setting `{key}` must be true or false, got {}", describe(other))),
        }
    }

    /// A text setting restricted to `choices`, or `default`.
    pub fn choice<'c>(&self, key: &str, default: &'c str, choices: &[&'c str]) -> Result<&'c str, String> {
        match self.get(key) {
            None => Ok(default),
            Some(SettingValue::Text(text)) => choices
                .iter()
                .find(|choice| **choice == text.as_str())
                .copied()
                .ok_or_else(|| format!("setting `{key}` = \"{text}\" is not one of: {}", choices.join(", "))),
            Some(other) => Err(format!("setting `{key}` must be a string, got {}", describe(other))),
        }
    }
}

fn describe(value: &SettingValue) -> String {
    match value {
        SettingValue::Boolean(value) => format!("boolean {value}"),
        SettingValue::Integer(value) => format!("integer {value}"),
        SettingValue::Float(value) => format!("float {value}"),
        SettingValue::Text(value) => format!("string \"{value}\""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings::from_pairs([
            ("max_members", SettingValue::Integer(4)),
            ("share", SettingValue::Float(0.25)),
            ("strict", SettingValue::Boolean(true)),
            ("mode", SettingValue::Text("fifo".into())),
        ])
    }

    #[test]
    fn typed_getters_read_values_and_defaults() {
        let settings = settings();
        assert_eq!(settings.integer("max_members", 1, 1..=64), Ok(4));
        assert_eq!(settings.integer("absent", 7, 1..=64), Ok(7));
        assert_eq!(settings.optional_integer("absent", 0..=5), Ok(None));
        assert_eq!(settings.float("share", 0.5, 0.0..=1.0), Ok(0.25));
        assert_eq!(settings.float("max_members", 0.5, 0.0..=10.0), Ok(4.0));
        assert_eq!(settings.optional_float("share", 0.0..=1.0), Ok(Some(0.25)));
        assert_eq!(settings.optional_float("absent", 0.0..=1.0), Ok(None));
        assert!(settings.optional_float("share", 0.5..=1.0).is_err());
        assert_eq!(settings.boolean("strict", false), Ok(true));
        assert_eq!(settings.choice("mode", "lifo", &["fifo", "lifo"]), Ok("fifo"));
    }

    #[test]
    fn errors_name_the_key() {
        let settings = settings();
        let out_of_range = settings.integer("max_members", 1, 8..=64).unwrap_err();
        assert!(out_of_range.contains("`max_members` = 4 is out of range 8..=64"), "{out_of_range}");
        let wrong_type = settings.boolean("mode", false).unwrap_err();
        assert!(wrong_type.contains("`mode` must be true or false, got string \"fifo\""), "{wrong_type}");
        let bad_choice = settings.choice("mode", "a", &["a", "b"]).unwrap_err();
        assert!(bad_choice.contains("`mode` = \"fifo\" is not one of: a, b"), "{bad_choice}");
        let unknown = settings.expect_only(&["max_members", "share", "strict"]).unwrap_err();
        assert!(unknown.starts_with("unknown setting `mode`"), "{unknown}");
        assert!(Settings::default().expect_only(&[]).is_ok());
        let none_taken = settings.expect_only(&[]).unwrap_err();
        assert!(none_taken.contains("takes no settings"), "{none_taken}");
    }
}
