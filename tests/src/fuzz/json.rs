//! Structure-aware mutations of JSON documents (request bodies, message
//! lists): one node of the tree is replaced by a value of another type, a
//! null, an extreme number, a long or strange string, a deep nest (bounded)
//! or a subtree of another corpus entry; objects lose keys or gain the known
//! field names with values of the wrong type; arrays lose, repeat or gain
//! elements. [`to_text`] writes a document with a key twice, which a
//! `Value` cannot hold.

use serde_json::{Map, Number, Value};

use super::Rng;

/// The deepest nest a mutation builds: past serde_json's recursion limit
/// (128), so that parsers see both sides of it, and far below what would
/// overflow a test thread's stack.
pub const MAX_NEST: usize = 160;
/// The longest string a mutation builds.
const MAX_STRING: usize = 16 << 10;
/// The most nodes a document grows to; past it mutations only prune.
const MAX_NODES: usize = 2048;
/// The longest a document's text grows to: a mutation that would make it
/// longer is undone.
pub const MAX_TEXT: usize = 256 << 10;
/// The longest array a mutation builds by repeating an element.
const MAX_REPEAT: usize = 600;

/// Strings that mean something to some layer: template syntax, special
/// tokens, roles, part types, paths, escapes, control characters and
/// characters that are not what they look like.
const STRINGS: &[&str] = &[
    "",
    " ",
    "\n",
    "\r\n",
    "\t",
    "\u{0}",
    "\u{1b}[31m",
    "\u{7f}",
    "\u{85}",
    "\u{a0}",
    "\u{200b}",
    "\u{202e}",
    "\u{2581}",
    "\u{fffd}",
    "\u{feff}",
    "\u{10ffff}",
    "é",
    "a\u{301}",
    "🙂",
    "👨‍👩‍👧‍👦",
    "日本語",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<s>",
    "</s>",
    "<think>",
    "</think>",
    "{{ messages }}",
    "{% for m in messages %}",
    "{{ raise_exception('x') }}",
    "%s%n%x",
    "\\",
    "\"",
    "'",
    "null",
    "true",
    "-1",
    "1e308",
    "NaN",
    "Infinity",
    "0x10",
    "../x",
    "/etc/passwd",
    "a/b",
    "..",
    "user",
    "assistant",
    "system",
    "tool",
    "developer",
    "function",
    "model",
    "text",
    "image_url",
    "input_text",
    "output_text",
    "input_image",
    "tool_use",
    "tool_result",
    "thinking",
    "json_object",
    "json_schema",
    "none",
    "auto",
    "low",
    "high",
    "save",
    "restore",
    "erase",
    "continuous",
    "chatCompletions",
    "completions",
];

/// Numbers at the edges: of i32, u32, i64, u64 and f64, negative and
/// fractional, integral floats.
fn number(rng: &mut Rng) -> Value {
    let float = |value: f64| Number::from_f64(value).map_or(Value::Null, Value::Number);
    match rng.below(24) {
        0 => Value::from(0),
        1 => Value::from(-1),
        2 => Value::from(1),
        3 => Value::from(2),
        4 => Value::from(8),
        5 => Value::from(255),
        6 => Value::from(65536),
        7 => Value::from(i64::from(i32::MAX)),
        8 => Value::from(i64::from(i32::MAX) + 1),
        9 => Value::from(i64::from(i32::MIN) - 1),
        10 => Value::from(u32::MAX),
        11 => Value::from(u64::from(u32::MAX) + 1),
        12 => Value::from(i64::MAX),
        13 => Value::from(i64::MIN),
        14 => Value::from(u64::MAX),
        15 => float(1e308),
        16 => float(-1e308),
        17 => float(18_446_744_073_709_551_616.0),
        18 => float(0.5),
        19 => float(-0.0),
        20 => float(1e-308),
        21 => float(3.0),
        22 => float(9.1e18),
        _ => Value::from(rng.below(100) as i64 - 50),
    }
}

fn string(rng: &mut Rng, names: &[String]) -> String {
    match rng.below(5) {
        0 if !names.is_empty() => rng.pick(names).clone(),
        1 => {
            let piece = rng.pick(&["a", "ab ", "🙂", "<|im_start|>", "\n", "{{"]);
            piece.repeat(1 + rng.below(MAX_STRING / piece.len()))
        }
        _ => (*rng.pick(STRINGS)).to_owned(),
    }
}

/// A small random value of any type; objects take known field names.
pub fn random_value(rng: &mut Rng, names: &[String], depth: usize) -> Value {
    match rng.below(if depth == 0 { 4 } else { 6 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.one_in(2)),
        2 => number(rng),
        3 => Value::String(string(rng, names)),
        4 => Value::Array((0..rng.below(4)).map(|_| random_value(rng, names, depth - 1)).collect()),
        _ => Value::Object(
            (0..rng.below(4)).map(|_| (string(rng, names), random_value(rng, names, depth - 1))).collect(),
        ),
    }
}

/// A step of the path from a document's root to a node.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// How many nodes `value` has.
fn count(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(count).sum::<usize>(),
        Value::Object(map) => 1 + map.values().map(count).sum::<usize>(),
        _ => 1,
    }
}

/// The path to the node `index` of `value` in pre-order (the root is 0).
fn select(value: &Value, index: usize) -> Vec<Step> {
    fn walk(value: &Value, left: &mut usize, path: &mut Vec<Step>) -> bool {
        if *left == 0 {
            return true;
        }
        *left -= 1;
        let children: Box<dyn Iterator<Item = (Step, &Value)>> = match value {
            Value::Array(items) => Box::new(items.iter().enumerate().map(|(at, item)| (Step::Index(at), item))),
            Value::Object(map) => Box::new(map.iter().map(|(key, item)| (Step::Key(key.clone()), item))),
            _ => return false,
        };
        for (step, child) in children {
            path.push(step);
            if walk(child, left, path) {
                return true;
            }
            path.pop();
        }
        false
    }
    let (mut path, mut left) = (Vec::new(), index);
    walk(value, &mut left, &mut path);
    path
}

/// A node of `value` chosen uniformly: its path.
fn random_path(rng: &mut Rng, value: &Value) -> Vec<Step> {
    let index = rng.below(count(value));
    select(value, index)
}

fn node<'v>(value: &'v Value, path: &[Step]) -> Option<&'v Value> {
    path.iter().try_fold(value, |node, step| match step {
        Step::Key(key) => node.get(key),
        Step::Index(index) => node.get(index),
    })
}

fn node_mut<'v>(value: &'v mut Value, path: &[Step]) -> Option<&'v mut Value> {
    path.iter().try_fold(value, |node, step| match step {
        Step::Key(key) => node.get_mut(key),
        Step::Index(index) => node.get_mut(index),
    })
}

/// How deep the deepest node of `value` lies.
fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// A random node of a random corpus entry.
fn donor(rng: &mut Rng, corpus: &[Value]) -> Option<Value> {
    let entry = corpus.get(rng.below(corpus.len()))?;
    let path = random_path(rng, entry);
    node(entry, &path).cloned()
}

/// One mutation of `document`: a node chosen uniformly, changed by a rule
/// of its type or replaced. `names` are the field names worth adding;
/// `corpus` gives subtrees to graft. The document stays within
/// [`MAX_NEST`] levels and [`MAX_TEXT`] bytes.
pub fn mutate(rng: &mut Rng, document: &mut Value, corpus: &[Value], names: &[String]) {
    let before = document.clone();
    mutate_node(rng, document, corpus, names);
    if document.to_string().len() > MAX_TEXT {
        *document = before;
    }
}

fn mutate_node(rng: &mut Rng, document: &mut Value, corpus: &[Value], names: &[String]) {
    let path = random_path(rng, document);
    if count(document) > MAX_NODES {
        if let Some(target) = node_mut(document, &path) {
            *target = Value::Null;
        }
        return;
    }
    let room = MAX_NEST.saturating_sub(path.len() + depth(node(document, &path).unwrap_or(&Value::Null)));
    let grafted = if rng.one_in(8) { donor(rng, corpus) } else { None };
    let Some(target) = node_mut(document, &path) else { return };
    if let Some(graft) = grafted.filter(|graft| depth(graft) < room) {
        *target = graft;
        return;
    }
    if rng.one_in(4) {
        replace(rng, target, names, room);
        return;
    }
    // A value of depth `room` or less keeps the document within MAX_NEST.
    let small = room.min(2);
    match target {
        Value::Object(map) => mutate_object(rng, map, names, small),
        Value::Array(items) => mutate_array(rng, items, names, small),
        Value::String(text) => mutate_string(rng, text, names),
        Value::Number(_) => *target = number(rng),
        Value::Bool(flag) => *flag = !*flag,
        Value::Null => *target = random_value(rng, names, small),
    }
}

/// Replaces a node by another type, or nests it (within `room` levels).
fn replace(rng: &mut Rng, target: &mut Value, names: &[String], room: usize) {
    match rng.below(5) {
        0 => *target = Value::Null,
        1 if room > 1 => {
            let levels = 1 + rng.below(room.min(MAX_NEST) - 1);
            let inner = std::mem::take(target);
            *target = (0..levels).fold(inner, |nested, _| {
                if rng.one_in(2) {
                    Value::Array(vec![nested])
                } else {
                    let mut map = Map::new();
                    map.insert(string(rng, names), nested);
                    Value::Object(map)
                }
            });
        }
        2 if room > 0 => {
            let inner = std::mem::take(target);
            *target = Value::Array(vec![inner]);
        }
        _ => *target = random_value(rng, names, room.min(2)),
    }
}

fn mutate_object(rng: &mut Rng, map: &mut Map<String, Value>, names: &[String], small: usize) {
    let keys: Vec<String> = map.keys().cloned().collect();
    match rng.below(4) {
        0 if !keys.is_empty() => {
            map.remove(rng.pick(&keys));
        }
        1 if !keys.is_empty() => {
            // The value under another (known) name.
            if let Some(value) = map.remove(rng.pick(&keys)) {
                map.insert(string(rng, names), value);
            }
        }
        2 if !keys.is_empty() => {
            let key = rng.pick(&keys).clone();
            map.insert(key, random_value(rng, names, small));
        }
        _ => {
            map.insert(string(rng, names), random_value(rng, names, small));
        }
    }
}

fn mutate_array(rng: &mut Rng, items: &mut Vec<Value>, names: &[String], small: usize) {
    match rng.below(6) {
        0 if !items.is_empty() => {
            items.remove(rng.below(items.len()));
        }
        1 if !items.is_empty() => {
            let copy = items[rng.below(items.len())].clone();
            items.insert(rng.below(items.len() + 1), copy);
        }
        2 if !items.is_empty() => {
            // A very long list: one element repeated.
            let copy = items[rng.below(items.len())].clone();
            let times = 1 + rng.below(MAX_REPEAT.saturating_sub(items.len()));
            items.extend(std::iter::repeat_n(copy, times));
        }
        3 if items.len() > 1 => {
            let (a, b) = (rng.below(items.len()), rng.below(items.len()));
            items.swap(a, b);
        }
        4 => items.clear(),
        _ => items.insert(rng.below(items.len() + 1), random_value(rng, names, small)),
    }
}

fn mutate_string(rng: &mut Rng, text: &mut String, names: &[String]) {
    match rng.below(4) {
        0 => *text = string(rng, names),
        1 => {
            let at = boundary(rng, text);
            text.insert_str(at, &string(rng, names));
        }
        2 if !text.is_empty() => {
            let cut = boundary(rng, text);
            text.truncate(cut);
        }
        _ => {
            let times = 1 + rng.below((MAX_STRING / text.len().max(1)).max(1));
            *text = text.repeat(times);
        }
    }
    if text.len() > MAX_STRING {
        let cut = (0..=MAX_STRING).rev().find(|&at| text.is_char_boundary(at)).unwrap_or(0);
        text.truncate(cut);
    }
}

fn boundary(rng: &mut Rng, text: &str) -> usize {
    let boundaries: Vec<usize> = text.char_indices().map(|(at, _)| at).chain([text.len()]).collect();
    *rng.pick(&boundaries)
}

/// How many non-empty objects `value` holds, itself included.
fn objects(value: &Value) -> usize {
    match value {
        Value::Array(items) => items.iter().map(objects).sum(),
        Value::Object(map) => usize::from(!map.is_empty()) + map.values().map(objects).sum::<usize>(),
        _ => 0,
    }
}

/// `value` as JSON text; with `duplicate`, one object somewhere gets one of
/// its keys a second time (with another value), which parsers resolve each
/// their own way.
pub fn to_text(rng: &mut Rng, value: &Value, duplicate: bool) -> String {
    let mut out = String::new();
    let objects = objects(value);
    let mut chosen = if duplicate && objects > 0 { Some(rng.below(objects)) } else { None };
    write(rng, value, &mut chosen, &mut out);
    out
}

/// Writes `value`; `chosen` counts down the non-empty objects met, and the
/// one it reaches zero at writes a key twice.
fn write(rng: &mut Rng, value: &Value, chosen: &mut Option<usize>, out: &mut String) {
    match value {
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write(rng, item, chosen, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let twice = match chosen {
                Some(0) if !map.is_empty() => {
                    *chosen = None;
                    Some(rng.below(map.len()))
                }
                Some(countdown) if !map.is_empty() => {
                    *countdown -= 1;
                    None
                }
                _ => None,
            };
            out.push('{');
            for (index, (key, item)) in map.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write(rng, item, chosen, out);
                if twice == Some(index) {
                    out.push(',');
                    out.push_str(&Value::String(key.clone()).to_string());
                    out.push(':');
                    out.push_str(&random_value(rng, &[], 1).to_string());
                }
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mutations_keep_documents_within_the_bounds() {
        let corpus = vec![json!({"messages": [{"role": "user", "content": "hi"}], "n_predict": 4})];
        let names = vec!["content".to_owned(), "stream".to_owned()];
        let mut rng = Rng::new(9);
        let mut document = corpus[0].clone();
        for _ in 0..3000 {
            mutate(&mut rng, &mut document, &corpus, &names);
            assert!(depth(&document) <= MAX_NEST, "depth {}", depth(&document));
            if rng.one_in(50) {
                document = corpus[0].clone();
            }
        }
    }

    #[test]
    fn duplicate_keys_are_written_twice() {
        let value = json!({"a": 1, "b": {"c": 2}});
        let mut rng = Rng::new(1);
        let plain = to_text(&mut rng, &value, false);
        assert_eq!(serde_json::from_str::<Value>(&plain).expect("valid JSON"), value);
        let doubled = to_text(&mut rng, &value, true);
        assert!(doubled.len() > plain.len(), "{doubled}");
        assert!(serde_json::from_str::<Value>(&doubled).is_ok(), "{doubled}");
    }
}
