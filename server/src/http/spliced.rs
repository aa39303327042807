//! A non-streamed answer: a `Value` tree but for its lists of per-token
//! probabilities, which stay the JSON text they were written to as the
//! tokens came (see `probs`, `generate::collect`). Each list stands in the
//! tree as a `null` at its place and is written there when the answer is
//! serialized, so an answer never holds its probabilities as a tree.

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::error::{ApiError, ErrorType};

/// A list of JSON texts, written as an array.
pub type List<'a> = &'a [Box<RawValue>];

/// An answer and the lists spliced into it.
pub struct Spliced<'a> {
    tree: Value,
    /// Each list and its place: a JSON pointer into `tree`.
    lists: Vec<(String, List<'a>)>,
}

impl<'a> Spliced<'a> {
    pub fn new(tree: Value) -> Self {
        Spliced { tree, lists: Vec::new() }
    }

    /// Put `list` at `path` (object keys and array indices from the root;
    /// the place must exist, or be a new key of an existing object).
    pub fn list(&mut self, path: &[&str], list: List<'a>) {
        self.set(path, Value::Null);
        self.lists.push((pointer(path), list));
    }

    /// Put `other` at `path`, its lists with it.
    pub fn absorb(&mut self, path: &[&str], other: Spliced<'a>) {
        let at = pointer(path);
        self.set(path, other.tree);
        self.lists.extend(other.lists.into_iter().map(|(place, list)| (format!("{at}{place}"), list)));
    }

    /// `items` as one array.
    pub fn array(items: Vec<Spliced<'a>>) -> Self {
        let mut array = Spliced::new(Value::Array(vec![Value::Null; items.len()]));
        for (index, item) in items.into_iter().enumerate() {
            array.absorb(&[&index.to_string()], item);
        }
        array
    }

    /// `response_fields`: only the listed paths (`a/b` reads nested keys),
    /// each under its full path, as llama-server does.
    pub fn project(&self, paths: &[String]) -> Spliced<'a> {
        let mut projected = Spliced::new(Value::Object(Map::new()));
        for path in paths {
            let mut value = Some(&self.tree);
            let mut at = String::new();
            for key in path.split('/') {
                value = value.and_then(|value| value.get(key));
                at = format!("{at}/{}", escape(key));
            }
            match (value, self.lists.iter().find(|(place, _)| *place == at)) {
                (Some(_), Some((_, list))) => projected.list(&[path.as_str()], list),
                (Some(value), None) => projected.set(&[path.as_str()], value.clone()),
                (None, _) => {}
            }
        }
        projected
    }

    /// The answer: `application/json`, written in one buffer sized for it.
    pub fn into_response(self) -> Response {
        json_response(&self.root(), self.size())
    }

    fn root(&self) -> Node<'_, 'a> {
        Node { value: &self.tree, at: String::new(), lists: &self.lists }
    }

    /// About the answer's size: its lists, and room for the rest.
    fn size(&self) -> usize {
        let lists: usize = self.lists.iter().flat_map(|(_, list)| list.iter()).map(|text| text.get().len() + 1).sum();
        lists + 4096
    }

    fn set(&mut self, path: &[&str], value: Value) {
        let Some((last, parent)) = path.split_last() else {
            self.tree = value;
            return;
        };
        match self.tree.pointer_mut(&pointer(parent)) {
            Some(Value::Object(object)) => {
                object.insert((*last).to_owned(), value);
            }
            Some(Value::Array(items)) => {
                if let Some(item) = last.parse::<usize>().ok().and_then(|index| items.get_mut(index)) {
                    *item = value;
                }
            }
            _ => {}
        }
    }
}

/// `value` as an `application/json` answer, written into one buffer of
/// about `size` bytes (growing it by doubling would hold up to twice the
/// answer while it is written).
pub fn json_response(value: &impl Serialize, size: usize) -> Response {
    let mut body = Vec::with_capacity(size);
    match serde_json::to_writer(&mut body, value) {
        Ok(()) => ([(CONTENT_TYPE, "application/json")], body).into_response(),
        Err(error) => ApiError::new(ErrorType::Server, format!("cannot write the answer: {error}")).into_response(),
    }
}

/// A JSON pointer (RFC 6901) to `path`.
fn pointer(path: &[&str]) -> String {
    path.iter().map(|key| format!("/{}", escape(key))).collect()
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// A subtree being written, at pointer `at`.
struct Node<'t, 'a> {
    value: &'t Value,
    at: String,
    lists: &'t [(String, List<'a>)],
}

impl Serialize for Node<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if let Some((_, list)) = self.lists.iter().find(|(place, _)| *place == self.at) {
            return serializer.collect_seq(list.iter());
        }
        let below = |place: &str| place.strip_prefix(self.at.as_str()).is_some_and(|rest| rest.starts_with('/'));
        if !self.lists.iter().any(|(place, _)| below(place)) {
            return self.value.serialize(serializer);
        }
        let child = |key: &str, value| Node { value, at: format!("{}/{}", self.at, escape(key)), lists: self.lists };
        match self.value {
            Value::Object(object) => {
                let mut map = serializer.serialize_map(Some(object.len()))?;
                for (key, value) in object {
                    map.serialize_entry(key, &child(key, value))?;
                }
                map.end()
            }
            Value::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for (index, value) in items.iter().enumerate() {
                    seq.serialize_element(&child(&index.to_string(), value))?;
                }
                seq.end()
            }
            other => other.serialize(serializer),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn raw(texts: &[&str]) -> Vec<Box<RawValue>> {
        texts.iter().map(|text| RawValue::from_string((*text).to_owned()).expect("JSON")).collect()
    }

    fn written(answer: Spliced<'_>) -> Value {
        serde_json::to_value(answer.root()).expect("written")
    }

    #[test]
    fn lists_are_written_in_their_places_and_follow_what_absorbs_them() {
        let (first, second) = (raw(&[r#"{"id":1}"#, r#"{"id":2}"#]), raw(&["3"]));
        let mut choice = Spliced::new(json!({ "index": 0, "logprobs": { "content": null } }));
        choice.list(&["logprobs", "content"], &first);
        let mut verbose = Spliced::new(json!({ "content": "x" }));
        verbose.list(&["completion/probabilities"], &second);
        let mut answer = Spliced::new(json!({ "choices": [null], "id": "a" }));
        answer.absorb(&["choices", "0"], choice);
        answer.absorb(&["__verbose"], verbose);
        let expected = json!({
            "choices": [{ "index": 0, "logprobs": { "content": [{ "id": 1 }, { "id": 2 }] } }],
            "id": "a",
            "__verbose": { "content": "x", "completion/probabilities": [3] },
        });
        assert_eq!(written(answer), expected);
    }

    #[test]
    fn response_fields_keep_full_paths_and_lists() {
        let list = raw(&["1", "2"]);
        let mut result = Spliced::new(json!({ "content": "x", "generation_settings": { "n_predict": 8 }, "p": 1 }));
        result.list(&["completion_probabilities"], &list);
        let paths = ["content", "generation_settings/n_predict", "absent/x", "completion_probabilities"];
        let projected = result.project(&paths.map(str::to_owned));
        let expected =
            json!({ "content": "x", "generation_settings/n_predict": 8, "completion_probabilities": [1, 2] });
        assert_eq!(written(Spliced::array(vec![projected])), json!([expected]));
    }
}
