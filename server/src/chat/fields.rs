//! Typed access to a JSON request body's fields: every error names the
//! field, and `null` reads as absent.

use serde_json::{Map, Value};

use super::error::Error;

/// The body as an object, or 400.
pub fn object(body: &Value) -> Result<&Map<String, Value>, Error> {
    body.as_object().ok_or_else(|| Error::invalid("the request body must be a JSON object"))
}

/// Typed access to a JSON object's fields; errors name the field.
#[derive(Clone, Copy)]
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl<'a> Fields<'a> {
    /// The value of `key`, with `null` read as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|value| !value.is_null())
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, Error> {
        self.get(key).map(|value| value.as_bool().ok_or_else(|| wrong(key, "a boolean"))).transpose()
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, Error> {
        Ok(self.bool(key)?.unwrap_or(default))
    }

    /// An integer; integral floats (`8.0`) are accepted.
    pub fn int(&self, key: &str) -> Result<Option<i64>, Error> {
        self.get(key).map(|value| integer(key, value)).transpose()
    }

    pub fn float(&self, key: &str) -> Result<Option<f64>, Error> {
        self.get(key).map(|value| value.as_f64().ok_or_else(|| wrong(key, "a number"))).transpose()
    }

    pub fn str(&self, key: &str) -> Result<Option<&'a str>, Error> {
        self.get(key).map(|value| value.as_str().ok_or_else(|| wrong(key, "a string"))).transpose()
    }

    /// An integer within `range`, else 400 naming the field.
    pub fn int_in(&self, key: &str, range: std::ops::RangeInclusive<i64>) -> Result<Option<i64>, Error> {
        match self.int(key)? {
            Some(value) if !range.contains(&value) => {
                Err(Error::invalid(format!("`{key}` must be in {}..={}, not {value}", range.start(), range.end())))
            }
            value => Ok(value),
        }
    }

    /// A finite float, as f32.
    pub fn f32(&self, key: &str) -> Result<Option<f32>, Error> {
        match self.float(key)? {
            Some(value) if !(value.is_finite() && value.abs() <= f64::from(f32::MAX)) => {
                Err(Error::invalid(format!("`{key}` must be a finite number")))
            }
            value => Ok(value.map(|value| value as f32)),
        }
    }

    /// A list of strings, also accepting one string.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<String>>, Error> {
        let Some(value) = self.get(key) else { return Ok(None) };
        match value {
            Value::String(text) => Ok(Some(vec![text.clone()])),
            Value::Array(items) => items
                .iter()
                .map(|item| {
                    item.as_str().map(str::to_owned).ok_or_else(|| wrong(key, "a string or an array of strings"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            _ => Err(wrong(key, "a string or an array of strings")),
        }
    }
}

pub fn wrong(key: &str, expected: &str) -> Error {
    Error::invalid(format!("`{key}` must be {expected}"))
}

pub fn integer(key: &str, value: &Value) -> Result<i64, Error> {
    if let Some(int) = value.as_i64() {
        return Ok(int);
    }
    let out_of_range = || Error::invalid(format!("`{key}` is out of range"));
    if value.is_u64() {
        return Err(out_of_range());
    }
    match value.as_f64() {
        Some(float) if float.fract() == 0.0 && float.abs() < 9.0e18 => Ok(float as i64),
        Some(float) if float.fract() == 0.0 => Err(out_of_range()),
        _ => Err(wrong(key, "an integer")),
    }
}
