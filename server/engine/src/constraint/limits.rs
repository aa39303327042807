//! Bounds on what a grammar may ask of the compiler, checked before
//! llguidance sees it.
//!
//! llguidance compiles by recursion: a Lark rule compiles the rules it
//! refers to from inside its own frame, and each group nests a frame
//! more; a JSON schema compiles the target of a `$ref` from inside the
//! schema that refers to it. A chain of references is as deep as the
//! input makes it, so an unchecked grammar can overflow any stack, and a
//! stack overflow aborts the whole process. [`lark`] and [`schema`] bound
//! that depth from above, whatever order llguidance takes the definitions
//! in, and the compile runs on threads whose stack holds the bound many
//! times over (`workers`).
//!
//! The depth counts what llguidance nests frames for: one per rule or
//! terminal on a chain of references, plus the groups (brackets) inside
//! it; one per level of a schema, plus, for each `$ref` followed, the
//! depth of the schema it points to. A definition is counted once however
//! often it is reached, and definitions that reach one another are counted
//! together, as a compile may walk all of them in one chain. Measured on
//! a release build, one level takes at most 4.5 KB of stack (a schema
//! nested through `items`; a Lark rule 3 KB, a group 1.8 KB), so
//! [`MAX_DEPTH`] levels take at most 23 MiB: [`NEEDED_STACK`].

use std::collections::HashMap;

use serde_json::Value;

/// The deepest a grammar may nest, counted as above.
pub const MAX_DEPTH: usize = 5_000;
/// The stack that compiling and running any grammar within the limits
/// needs, with a margin over the 23 MiB measured (the fuzz target runs
/// its grammars on threads of exactly this size).
pub const NEEDED_STACK: usize = 32 << 20;
/// The most alternatives one choice of a rule may have: llguidance's
/// Earley parser holds at most 2,000 items per step (its default
/// `max_items_in_row`), and each alternative of a choice is one, so a rule
/// with more could never be parsed.
pub const MAX_ALTERNATIVES: usize = 2_000;
/// The most symbols a compiled grammar may have (llguidance's
/// `max_grammar_size`): its symbol ids are 16-bit, and past 65,525 it
/// fails on an assertion.
pub const MAX_SYMBOLS: usize = 50_000;

/// A grammar beyond a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error(
        "{what} nest {depth} deep (counting each rule or terminal on a chain of references and each group in \
         them), reached from `{from}`; at most {MAX_DEPTH}"
    )]
    RuleDepth { what: &'static str, depth: usize, from: String },
    #[error(
        "the schema nests {depth} deep (counting its levels and, for each `$ref`, the depth of what it points \
         to), reached from `{from}`; at most {MAX_DEPTH}"
    )]
    SchemaDepth { depth: usize, from: String },
    #[error(
        "rule `{rule}` has a choice of {count} alternatives; at most {MAX_ALTERNATIVES} (the parser holds at \
         most that many items per step)"
    )]
    Alternatives { rule: String, count: usize },
    #[error(
        "the schema holds the number {0}, at or below -2^63: llguidance's integer bounds are 64-bit and it \
         recurses without end on one there"
    )]
    Number(String),
    #[error("the `%json` schema at line {line}: {error}")]
    Embedded { line: usize, error: Box<LimitError> },
}

/// Definitions that refer to one another, each weighted by the frames it
/// nests.
#[derive(Default)]
struct Graph {
    weight: Vec<usize>,
    edges: Vec<Vec<usize>>,
}

impl Graph {
    fn node(&mut self, weight: usize) -> usize {
        self.weight.push(weight);
        self.edges.push(Vec::new());
        self.weight.len() - 1
    }

    /// The heaviest chain of references as (weight, first node): the
    /// longest path over the strongly connected components, each weighing
    /// the sum of its members, since a depth-first compile may pass
    /// through every member of a cycle before it leaves it. Iterative
    /// (Tarjan's algorithm with an explicit stack): the graph is input.
    fn deepest(&self) -> (usize, usize) {
        let n = self.weight.len();
        const UNSEEN: usize = usize::MAX;
        let mut index = vec![UNSEEN; n];
        let mut low = vec![0; n];
        let mut on_stack = vec![false; n];
        let mut component = vec![UNSEEN; n];
        let mut stack = Vec::new();
        // Per component, in the order found: each is found after every
        // component it reaches, so its successors' depths are known.
        let mut depth: Vec<usize> = Vec::new();
        let mut best = (0, 0);
        let mut counter = 0;
        for root in 0..n {
            if index[root] != UNSEEN {
                continue;
            }
            let mut calls = vec![(root, 0usize)];
            while let Some(&mut (node, ref mut next)) = calls.last_mut() {
                if *next == 0 && index[node] == UNSEEN {
                    index[node] = counter;
                    low[node] = counter;
                    counter += 1;
                    stack.push(node);
                    on_stack[node] = true;
                }
                if let Some(&child) = self.edges[node].get(*next) {
                    *next += 1;
                    if index[child] == UNSEEN {
                        calls.push((child, 0));
                    } else if on_stack[child] {
                        low[node] = low[node].min(index[child]);
                    }
                    continue;
                }
                calls.pop();
                if let Some(&(parent, _)) = calls.last() {
                    low[parent] = low[parent].min(low[node]);
                }
                if low[node] != index[node] {
                    continue;
                }
                let id = depth.len();
                let mut members = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component[member] = id;
                    members.push(member);
                    if member == node {
                        break;
                    }
                }
                let own = members.iter().fold(0usize, |sum, &member| sum.saturating_add(self.weight[member]));
                let below = members
                    .iter()
                    .flat_map(|&member| &self.edges[member])
                    .filter(|&&target| component[target] != id)
                    .map(|&target| depth[component[target]])
                    .max()
                    .unwrap_or(0);
                depth.push(own.saturating_add(below));
                if depth[id] > best.0 {
                    best = (depth[id], node);
                }
            }
        }
        best
    }
}

/// Check a Lark grammar (llguidance's syntax; translated GBNF included)
/// and the `%json` schemas in it.
pub fn lark(text: &str) -> Result<(), LimitError> {
    let scan = Scan::run(text)?;
    let mut graph = Graph::default();
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for definition in &scan.definitions {
        // A name defined twice is one node: llguidance refuses the second.
        let id = *ids.entry(definition.name).or_insert_with(|| graph.node(0));
        graph.weight[id] = graph.weight[id].max(1 + definition.nesting);
    }
    for definition in &scan.definitions {
        let from = ids[definition.name];
        let targets = definition.references.iter().filter_map(|name| ids.get(name));
        graph.edges[from].extend(targets);
    }
    let (depth, start) = graph.deepest();
    if depth > MAX_DEPTH {
        let from = ids.iter().find(|&(_, &id)| id == start).map_or("", |(name, _)| *name);
        return Err(LimitError::RuleDepth { what: "rules", depth, from: from.to_owned() });
    }
    for (line, value) in &scan.schemas {
        schema(value).map_err(|error| LimitError::Embedded { line: *line, error: Box::new(error) })?;
    }
    Ok(())
}

/// One rule, terminal or statement of a Lark grammar.
struct Definition<'a> {
    name: &'a str,
    /// The names after the definition's own: what it may refer to.
    references: Vec<&'a str>,
    /// The deepest its brackets nest.
    nesting: usize,
}

/// What a pass over Lark text finds. It follows llguidance's lexer (the
/// token rules of its Lark syntax) closely enough to skip strings,
/// regular expressions, comments and JSON values, and otherwise errs on
/// the side of counting more.
struct Scan<'a> {
    definitions: Vec<Definition<'a>>,
    /// `%json` values, with their line.
    schemas: Vec<(usize, Value)>,
}

impl<'a> Scan<'a> {
    fn run(text: &'a str) -> Result<Self, LimitError> {
        let bytes = text.as_bytes();
        let mut scan = Scan { definitions: Vec::new(), schemas: Vec::new() };
        // The open brackets, each with the alternatives of its choice
        // (`{` holds no choice of its own).
        let mut open: Vec<(u8, usize)> = Vec::new();
        let mut item_alternatives = 1;
        let mut at_line_start = true;
        let mut line = 1;
        let mut at = 0;
        while at < bytes.len() {
            let byte = bytes[at];
            if byte == b'\n' {
                line += 1;
                at += 1;
                at_line_start = true;
                continue;
            }
            if byte == b' ' || byte == b'\t' || byte == b'\r' {
                at += 1;
                continue;
            }
            // Comments are blank as far as items go: a `|` line after one
            // still continues the rule above.
            if byte == b'#' || (byte == b'/' && bytes.get(at + 1) == Some(&b'/')) {
                at = skip_line(bytes, at);
                continue;
            }
            let starts_item = std::mem::take(&mut at_line_start) && byte != b'|';
            if starts_item {
                scan.check_alternatives(item_alternatives)?;
                item_alternatives = 1;
            }
            let defined = scan.definitions.len();
            match byte {
                b'"' => at = skip_string(bytes, at),
                b'/' => match skip_regex(bytes, at) {
                    Some(end) => {
                        line += bytes[at..end].iter().filter(|&&b| b == b'\n').count();
                        at = end;
                    }
                    // llguidance's lexer fails there too.
                    None => break,
                },
                b'<' => at = skip_special(bytes, at),
                b'%' => {
                    let keyword_end = at + 1 + bytes[at + 1..].iter().take_while(|b| b.is_ascii_alphabetic()).count();
                    let keyword = &text[at + 1..keyword_end];
                    at = keyword_end;
                    if matches!(keyword, "json" | "regex" | "llguidance") {
                        let mut values = serde_json::Deserializer::from_slice(&bytes[at..]).into_iter::<Value>();
                        let Some(Ok(value)) = values.next() else { break };
                        let end = at + values.byte_offset();
                        if keyword == "json" {
                            scan.schemas.push((line, value));
                        }
                        line += bytes[at..end].iter().filter(|&&b| b == b'\n').count();
                        at = end;
                    }
                }
                b'(' | b'[' | b'{' => {
                    open.push((byte, 1));
                    if let Some(definition) = scan.definitions.last_mut() {
                        definition.nesting = definition.nesting.max(open.len());
                    }
                    at += 1;
                }
                b')' | b']' | b'}' => {
                    if let Some((_, alternatives)) = open.pop() {
                        scan.check_alternatives(alternatives)?;
                    }
                    at += 1;
                }
                b'|' => {
                    match open.last_mut() {
                        Some((b'(' | b'[', alternatives)) => *alternatives += 1,
                        _ => item_alternatives += 1,
                    }
                    at += 1;
                }
                _ => match name_at(bytes, at) {
                    Some(end) => {
                        let name = text[at..end].trim_start_matches(['!', '?']);
                        match scan.definitions.last_mut() {
                            Some(definition) if !starts_item => definition.references.push(name),
                            _ => scan.definitions.push(Definition { name, references: Vec::new(), nesting: 0 }),
                        }
                        at = end;
                    }
                    None => at += 1,
                },
            }
            if starts_item && scan.definitions.len() == defined {
                // A statement (`%ignore`, `%import`…) refers to names as a
                // definition does.
                scan.definitions.push(Definition { name: "", references: Vec::new(), nesting: 0 });
            }
        }
        scan.check_alternatives(item_alternatives)?;
        Ok(scan)
    }

    /// Only rules count: a terminal's alternatives make one regular
    /// expression, not parser items.
    fn check_alternatives(&self, count: usize) -> Result<(), LimitError> {
        match self.definitions.last() {
            Some(definition) if count > MAX_ALTERNATIVES && is_rule(definition.name) => {
                Err(LimitError::Alternatives { rule: definition.name.to_owned(), count })
            }
            _ => Ok(()),
        }
    }
}

fn is_rule(name: &str) -> bool {
    name.trim_start_matches('_').starts_with(|c: char| c.is_ascii_lowercase())
}

/// The end of a name at `at`, as llguidance lexes one: a rule is
/// `!?[_?]?[a-z][_a-z0-9-]*`, a terminal `_?[A-Z][_A-Z0-9-]*`.
fn name_at(bytes: &[u8], at: usize) -> Option<usize> {
    let mut end = at;
    let rule = {
        if bytes.get(end) == Some(&b'!') {
            end += 1;
        }
        if matches!(bytes.get(end), Some(b'_' | b'?')) {
            end += 1;
        }
        bytes.get(end).is_some_and(u8::is_ascii_lowercase)
    };
    let rest: fn(&u8) -> bool = if rule {
        |b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-'
    } else {
        end = at + usize::from(bytes.get(at) == Some(&b'_'));
        if !bytes.get(end).is_some_and(u8::is_ascii_uppercase) {
            return None;
        }
        |b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-'
    };
    Some(end + 1 + bytes[end + 1..].iter().take_while(|b| rest(b)).count())
}

fn skip_line(bytes: &[u8], at: usize) -> usize {
    bytes[at..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |offset| at + offset)
}

/// Past a string literal (JSON escapes; no line breaks inside).
fn skip_string(bytes: &[u8], at: usize) -> usize {
    let mut end = at + 1;
    while let Some(&b) = bytes.get(end) {
        match b {
            b'\\' => end += 2,
            b'"' => return end + 1,
            b'\n' => return end,
            _ => end += 1,
        }
    }
    bytes.len()
}

/// Past a regular expression `/…/flags`, if it is closed.
fn skip_regex(bytes: &[u8], at: usize) -> Option<usize> {
    let mut end = at + 1;
    loop {
        match bytes.get(end)? {
            b'\\' => end += 2,
            b'/' if end > at + 1 => break,
            b'/' => return None,
            _ => end += 1,
        }
    }
    end += 1;
    Some(end + bytes[end..].iter().take_while(|b| b"imslux".contains(b)).count())
}

/// Past a special token `<name>` (no blanks, no `<` or `>` inside), or
/// one byte when there is none.
fn skip_special(bytes: &[u8], at: usize) -> usize {
    let inside = bytes[at + 1..].iter().take_while(|&&b| !(b == b'<' || b == b'>' || b.is_ascii_whitespace())).count();
    match bytes.get(at + 1 + inside) {
        Some(b'>') if inside > 0 => at + inside + 2,
        _ => at + 1,
    }
}

/// Check a JSON schema.
pub fn schema(root: &Value) -> Result<(), LimitError> {
    let document = Document::walk(root);
    if let Some(number) = document.too_low {
        return Err(LimitError::Number(number.to_string()));
    }
    // Cheap first: every `$ref` followed in one chain, each into the
    // deepest schema it can point to.
    let total = document
        .refs
        .iter()
        .fold(document.height[0] + 1, |total, &(_, target)| total.saturating_add(document.height[target] + 1));
    if total <= MAX_DEPTH {
        return Ok(());
    }
    let (depth, start) = document.graph().map_or((total, 0), |graph| graph.deepest());
    if depth <= MAX_DEPTH {
        return Ok(());
    }
    let from = match start {
        0 => "#",
        start => document.refs.get(start - 1).map_or("#", |&(uri, _)| uri),
    };
    Err(LimitError::SchemaDepth { depth, from: from.to_owned() })
}

/// The most edges [`Document::graph`] builds; past it the cheap bound
/// stands.
const MAX_EDGES: usize = 1 << 22;

/// A schema's values in pre-order, so that a value's subtree is the run
/// from its index to its index plus its size.
struct Document<'a> {
    height: Vec<usize>,
    size: Vec<usize>,
    /// Each use of a `$ref`: the value it is in and which `$ref`, in
    /// pre-order.
    uses: Vec<(usize, usize)>,
    /// Each distinct `$ref` and the value it points to: the root when that
    /// cannot be told (a remote one, or one llguidance may resolve through
    /// an `$id` or an anchor), as the root holds everything.
    refs: Vec<(&'a str, usize)>,
    /// A number llguidance cannot take as an integer bound: it converts
    /// bounds to `i64` through `f64`, so these become `i64::MIN`, and
    /// negating that to build the range's regular expression gives
    /// `i64::MIN` again, forever. Anywhere in the schema, as a `const` or
    /// `enum` value is such a bound too.
    too_low: Option<&'a serde_json::Number>,
}

impl<'a> Document<'a> {
    fn walk(root: &'a Value) -> Self {
        let mut parent = Vec::new();
        // Each value's address, to find the values `$ref`s point to.
        let mut addresses = Vec::new();
        let mut uses = Vec::new();
        let mut ids: HashMap<&'a str, usize> = HashMap::new();
        let mut uris = Vec::new();
        let mut relocates = false;
        let mut too_low = None;
        let mut pending = vec![(root, usize::MAX)];
        while let Some((value, up)) = pending.pop() {
            let index = parent.len();
            parent.push(up);
            addresses.push(std::ptr::from_ref(value));
            match value {
                Value::Object(map) => {
                    if let Some(Value::String(uri)) = map.get("$ref") {
                        let next = ids.len();
                        let id = *ids.entry(uri.as_str()).or_insert(next);
                        if id == next {
                            uris.push(uri.as_str());
                        }
                        uses.push((index, id));
                    }
                    let base = index > 0 && matches!(map.get("$id").or(map.get("id")), Some(Value::String(_)));
                    let anchor = ["$anchor", "$dynamicAnchor", "$recursiveAnchor", "$dynamicRef", "$recursiveRef"]
                        .iter()
                        .any(|key| map.contains_key(*key));
                    relocates |= base || anchor;
                    pending.extend(map.values().rev().map(|child| (child, index)));
                }
                Value::Array(items) => pending.extend(items.iter().rev().map(|child| (child, index))),
                Value::Number(number) if number.as_f64().is_some_and(|value| value <= i64::MIN as f64) => {
                    too_low = too_low.or(Some(number));
                }
                _ => {}
            }
        }
        let mut height = vec![0; parent.len()];
        let mut size = vec![1; parent.len()];
        for index in (1..parent.len()).rev() {
            let up = parent[index];
            size[up] += size[index];
            height[up] = height[up].max(height[index] + 1);
        }
        // A document-local `$ref` is `#` and a JSON pointer.
        let pointed = |uri: &str| {
            let pointer = percent_decoded(uri.strip_prefix('#')?)?;
            root.pointer(&pointer).map(std::ptr::from_ref)
        };
        let targets: Vec<Option<*const Value>> =
            uris.iter().map(|uri| if relocates { None } else { pointed(uri) }).collect();
        let mut found: HashMap<*const Value, usize> = targets.iter().flatten().map(|&address| (address, 0)).collect();
        for (index, address) in addresses.iter().enumerate() {
            if let Some(at) = found.get_mut(address) {
                *at = index;
            }
        }
        let refs = uris
            .into_iter()
            .zip(targets)
            .map(|(uri, target)| (uri, target.and_then(|address| found.get(&address).copied()).unwrap_or(0)))
            .collect();
        Document { height, size, uses, refs, too_low }
    }

    /// Node 0 is the root, node `i + 1` the `i`th distinct `$ref`; each
    /// refers to the `$ref`s used inside the value it stands for. `None`
    /// past [`MAX_EDGES`].
    fn graph(&self) -> Option<Graph> {
        let mut graph = Graph::default();
        let targets = std::iter::once(0).chain(self.refs.iter().map(|&(_, target)| target));
        let mut edges = 0usize;
        for target in targets {
            let node = graph.node(self.height[target] + 1);
            let first = self.uses.partition_point(|&(at, _)| at < target);
            let last = self.uses.partition_point(|&(at, _)| at < target + self.size[target]);
            edges += last - first;
            if edges > MAX_EDGES {
                return None;
            }
            graph.edges[node].extend(self.uses[first..last].iter().map(|&(_, id)| id + 1));
        }
        Some(graph)
    }
}

/// A URI fragment with its `%XX` escapes decoded; `None` when they do not
/// make UTF-8.
fn percent_decoded(fragment: &str) -> Option<String> {
    let bytes = fragment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = bytes.get(at + 1..at + 3).and_then(|hex| std::str::from_utf8(hex).ok());
        match (bytes[at], hex.and_then(|hex| u8::from_str_radix(hex, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                at += 3;
            }
            (byte, _) => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}
