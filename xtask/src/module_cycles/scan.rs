//! Reads one Rust source file as plain text: its `mod` declarations, every
//! path of its `use` trees, every path of two or more segments in code (macro
//! bodies included), and the names its code mentions. No compilation:
//! comments and literals are skipped by a small lexer, which is all that
//! finding paths needs.

use std::collections::BTreeSet;

/// What one file declares and refers to.
#[derive(Debug, Default, PartialEq)]
pub struct FileScan {
    pub mods: Vec<ModDecl>,
    pub paths: Vec<PathRef>,
    /// Every identifier outside `use` and `mod` declarations: whether the
    /// file's own code mentions a name it imports.
    pub names: BTreeSet<String>,
    /// The `mod x { … }` blocks at the top of the file.
    pub inline_mods: BTreeSet<String>,
}

/// `mod name;` (a module in another file), inside `inline` (the stack of
/// `mod x { … }` blocks around it), with its `#[path = "…"]` if any.
#[derive(Debug, PartialEq)]
pub struct ModDecl {
    pub inline: Vec<String>,
    pub name: String,
    pub path_attr: Option<String>,
}

/// A path such as `super::params::Sampling`, written on `line` inside the
/// inline modules `inline`. A glob import ends in `*`. Paths in code that do
/// not start with `crate`, `super` or `self` may name a child module
/// (`params::Sampling`) or anything else (`std::mem::take`).
#[derive(Debug, PartialEq)]
pub struct PathRef {
    pub line: usize,
    pub inline: Vec<String>,
    pub segments: Vec<String>,
    /// `Some` for a path of a `use` declaration.
    pub import: Option<Import>,
}

/// How a `use` declaration binds the path it names.
#[derive(Debug, PartialEq)]
pub struct Import {
    /// The name it binds (`X` of `a::X`, `Y` of `a::X as Y`, `a` of
    /// `a::{self}`); `None` for globs and `as _`.
    pub binding: Option<String>,
    /// `pub use`, with or without a restriction: a re-export.
    pub public: bool,
    /// Declared among the items of a module, not inside a function body.
    pub module_level: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    PathSep,
    Punct(char),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    line: usize,
}

pub fn scan(source: &str) -> FileScan {
    Parser { tokens: lex(source), at: 0, inline: Vec::new(), out: FileScan::default() }.run()
}

fn lex(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        let start_line = line;
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            }
        } else if c == '"' {
            let (text, end) = quoted(&chars, i + 1, &mut line);
            tokens.push(Token { tok: Tok::Str(text), line: start_line });
            i = end;
        } else if c == '\'' {
            i = char_or_lifetime(&chars, i);
        } else if c.is_alphabetic() || c == '_' {
            let mut end = i;
            while end < chars.len() && (chars[end].is_alphanumeric() || chars[end] == '_') {
                end += 1;
            }
            let word: String = chars[i..end].iter().collect();
            if matches!(word.as_str(), "r" | "br" | "cr")
                && matches!(at(end), '"' | '#')
                && let Some((text, after)) = raw_string(&chars, end, &mut line)
            {
                tokens.push(Token { tok: Tok::Str(text), line: start_line });
                i = after;
                continue;
            }
            if matches!(word.as_str(), "b" | "c") && at(end) == '"' {
                let (text, after) = quoted(&chars, end + 1, &mut line);
                tokens.push(Token { tok: Tok::Str(text), line: start_line });
                i = after;
                continue;
            }
            if word == "b" && at(end) == '\'' {
                i = char_or_lifetime(&chars, end);
                continue;
            }
            tokens.push(Token { tok: Tok::Ident(word), line });
            i = end;
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c == ':' && at(i + 1) == ':' {
            tokens.push(Token { tok: Tok::PathSep, line });
            i += 2;
        } else {
            tokens.push(Token { tok: Tok::Punct(c), line });
            i += 1;
        }
    }
    tokens
}

/// A `"…"` literal's text from just after its opening quote; returns the
/// index after the closing quote.
fn quoted(chars: &[char], mut i: usize, line: &mut usize) -> (String, usize) {
    let mut text = String::new();
    while i < chars.len() && chars[i] != '"' {
        if chars[i] == '\\' {
            i += 1;
        }
        if let Some(&c) = chars.get(i) {
            *line += usize::from(c == '\n');
            text.push(c);
        }
        i += 1;
    }
    (text, i + 1)
}

/// `r"…"` or `r#"…"#` from the index of the first `#` or `"`; `None` when it
/// is a raw identifier (`r#match`) rather than a string.
fn raw_string(chars: &[char], mut i: usize, line: &mut usize) -> Option<(String, usize)> {
    let mut hashes = 0;
    while chars.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    if chars.get(i) != Some(&'"') {
        return None;
    }
    i += 1;
    let start = i;
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return Some((chars[start..i].iter().collect(), i + 1 + hashes));
        }
        *line += usize::from(chars[i] == '\n');
        i += 1;
    }
    Some((chars[start..].iter().collect(), chars.len()))
}

/// Skips a character literal (`'a'`, `'\n'`, `'\u{1F600}'`) or just the quote
/// of a lifetime or label (`'a`), from the index of the quote.
fn char_or_lifetime(chars: &[char], i: usize) -> usize {
    if chars.get(i + 1) == Some(&'\\') {
        let mut end = i + 2;
        while end < chars.len() && chars[end] != '\'' && chars[end] != '\n' {
            end += 1;
        }
        return end + 1;
    }
    if chars.get(i + 2) == Some(&'\'') {
        return i + 3;
    }
    i + 1
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    /// The `mod x {` blocks open here, with the brace depth each opened at.
    inline: Vec<(String, usize)>,
    out: FileScan,
}

impl Parser {
    fn run(mut self) -> FileScan {
        let mut depth = 0;
        let mut path_attr = None;
        // The index of the `use` that a `pub` just before makes a re-export.
        let mut public_use = None;
        while self.at < self.tokens.len() {
            let after_sep = self.at > 0 && self.tokens[self.at - 1].tok == Tok::PathSep;
            match self.tokens[self.at].tok.clone() {
                // A visibility (`pub(crate)`, `pub(in super::super)`) names
                // where an item may be seen, not what it uses.
                Tok::Ident(word) if word == "pub" => {
                    self.at += 1;
                    if self.peek(0) == Some(Tok::Punct('(')) {
                        while !matches!(self.peek(0), None | Some(Tok::Punct(')'))) {
                            self.at += 1;
                        }
                        self.at += 1;
                    }
                    if self.peek(0) == Some(Tok::Ident("use".into())) {
                        public_use = Some(self.at);
                    }
                    continue;
                }
                Tok::Punct('#') => {
                    if let Some(path) = self.path_attribute() {
                        path_attr = Some(path);
                        continue;
                    }
                }
                Tok::Punct('{') => {
                    depth += 1;
                    path_attr = None;
                }
                Tok::Punct('}') => {
                    depth -= 1;
                    if self.inline.last().is_some_and(|(_, open)| *open == depth) {
                        self.inline.pop();
                    }
                    path_attr = None;
                }
                Tok::Punct(';') => path_attr = None,
                Tok::Ident(word) if word == "mod" => {
                    if let Some(Tok::Ident(name)) = self.peek(1) {
                        match self.peek(2) {
                            Some(Tok::Punct(';')) => {
                                let inline = self.inline_names();
                                self.out.mods.push(ModDecl { inline, name, path_attr: path_attr.take() });
                                self.at += 3;
                                continue;
                            }
                            Some(Tok::Punct('{')) => {
                                if depth == 0 {
                                    self.out.inline_mods.insert(name.clone());
                                }
                                self.inline.push((name, depth));
                                depth += 1;
                                path_attr = None;
                                self.at += 3;
                                continue;
                            }
                            _ => {}
                        }
                    }
                }
                // `use<'a>` (precise capturing) is no declaration.
                Tok::Ident(word)
                    if word == "use"
                        && !after_sep
                        && matches!(self.peek(1), Some(Tok::Ident(_) | Tok::PathSep | Tok::Punct('{'))) =>
                {
                    let public = public_use == Some(self.at);
                    let module_level = self.inline.last().map_or(0, |(_, open)| open + 1) == depth;
                    self.at += 1;
                    self.use_statement(public, module_level);
                    continue;
                }
                Tok::Ident(_) if !after_sep && !self.after_dot() => {
                    self.code_path();
                    continue;
                }
                Tok::Ident(word) => {
                    self.out.names.insert(word);
                }
                _ => {}
            }
            self.at += 1;
        }
        self.out
    }

    fn peek(&self, ahead: usize) -> Option<Tok> {
        self.tokens.get(self.at + ahead).map(|token| token.tok.clone())
    }

    /// A method or field name (`x.len`), which no path starts with.
    fn after_dot(&self) -> bool {
        self.at > 0 && self.tokens[self.at - 1].tok == Tok::Punct('.')
    }

    fn inline_names(&self) -> Vec<String> {
        self.inline.iter().map(|(name, _)| name.clone()).collect()
    }

    /// `#[path = "…"]` at the cursor: its value, with the cursor after it.
    fn path_attribute(&mut self) -> Option<String> {
        let is_path = self.peek(1) == Some(Tok::Punct('['))
            && self.peek(2) == Some(Tok::Ident("path".into()))
            && self.peek(3) == Some(Tok::Punct('='))
            && self.peek(5) == Some(Tok::Punct(']'));
        match self.peek(4) {
            Some(Tok::Str(path)) if is_path => {
                self.at += 6;
                Some(path)
            }
            _ => None,
        }
    }

    /// A path in code (`crate::a::b…`, `a::b`): its identifiers are names
    /// the code mentions; kept as a path when it starts with `crate`, `super`
    /// or `self` or has more than one segment.
    fn code_path(&mut self) {
        let line = self.tokens[self.at].line;
        let mut segments = Vec::new();
        while let Some(Tok::Ident(word)) = self.peek(0) {
            self.out.names.insert(word.clone());
            segments.push(word);
            self.at += 1;
            match (self.peek(0), self.peek(1)) {
                (Some(Tok::PathSep), Some(Tok::Ident(_))) => self.at += 1,
                _ => break,
            }
        }
        if segments.len() > 1 || segments.first().is_some_and(|first| is_path_start(first)) {
            let inline = self.inline_names();
            self.out.paths.push(PathRef { line, inline, segments, import: None });
        }
    }

    /// A `use` declaration from just after `use` up to its `;`.
    fn use_statement(&mut self, public: bool, module_level: bool) {
        let line = self.tokens.get(self.at).map_or(0, |token| token.line);
        let mut paths = Vec::new();
        self.use_tree(Vec::new(), &mut paths);
        for (segments, binding) in paths {
            let inline = self.inline_names();
            let import = Some(Import { binding, public, module_level });
            self.out.paths.push(PathRef { line, inline, segments, import });
        }
    }

    /// One use tree (`a::b`, `a::{b, c::d}`, `a::*`, `a as b`): every path it
    /// names, with `prefix` in front and the name it binds; `x::self` is `x`.
    fn use_tree(&mut self, prefix: Vec<String>, paths: &mut Vec<(Vec<String>, Option<String>)>) {
        let mut path = prefix;
        if self.peek(0) == Some(Tok::PathSep) {
            self.at += 1;
        }
        loop {
            match self.peek(0) {
                Some(Tok::Ident(word)) => {
                    self.at += 1;
                    if word != "self" || path.is_empty() {
                        path.push(word);
                    }
                    if self.peek(0) == Some(Tok::PathSep) {
                        self.at += 1;
                        continue;
                    }
                    let mut binding = path.last().cloned();
                    if self.peek(0) == Some(Tok::Ident("as".into())) {
                        binding = match self.peek(1) {
                            Some(Tok::Ident(alias)) if alias != "_" => Some(alias),
                            _ => None,
                        };
                        self.at += 2;
                    }
                    paths.push((path, binding));
                    return;
                }
                Some(Tok::Punct('{')) => {
                    self.at += 1;
                    while !matches!(self.peek(0), None | Some(Tok::Punct('}' | ';'))) {
                        let before = self.at;
                        self.use_tree(path.clone(), paths);
                        // Past the comma, or past a token no tree starts with.
                        if self.peek(0) == Some(Tok::Punct(',')) || self.at == before {
                            self.at += 1;
                        }
                    }
                    if self.peek(0) == Some(Tok::Punct('}')) {
                        self.at += 1;
                    }
                    return;
                }
                Some(Tok::Punct('*')) => {
                    self.at += 1;
                    path.push("*".into());
                    paths.push((path, None));
                    return;
                }
                _ => return,
            }
        }
    }
}

fn is_path_start(word: &str) -> bool {
    matches!(word, "crate" | "super" | "self")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(source: &str) -> Vec<String> {
        scan(source).paths.iter().map(|path| path.segments.join("::")).collect()
    }

    #[test]
    fn use_trees_are_expanded() {
        let source = "use super::{a::{self, B}, c::*, d as e};\npub use crate::x::y::{Z};\nuse std::fmt;";
        assert_eq!(paths(source), ["super::a", "super::a::B", "super::c::*", "super::d", "crate::x::y::Z", "std::fmt"]);
    }

    #[test]
    fn paths_in_code_and_macros_are_found() {
        let source = "fn f() { let x = super::b::make(); vec![crate::c::D]; self.go(); $crate::e::F }";
        assert_eq!(paths(source), ["super::b::make", "crate::c::D", "self", "crate::e::F"]);
    }

    #[test]
    fn comments_and_literals_hide_paths() {
        let source = concat!(
            "// super::a::X\n/* crate::b /* nested */ super::c */\n",
            "let s = \"super::d\"; let r = r#\"crate::e \"quoted\"\"#; let c = '\"'; let q = '\\'';\n",
            "fn f<'a>(x: &'a str) { super::g::h() }"
        );
        assert_eq!(paths(source), ["super::g::h"]);
        assert_eq!(scan(source).paths[0].line, 4);
    }

    #[test]
    fn mod_declarations_with_inline_blocks_and_path_attributes() {
        let source =
            "mod a;\npub mod b {\n    #[path = \"other.rs\"] pub mod c;\n    fn f() { super::a::X }\n}\nmod d;";
        let scanned = scan(source);
        let mods: Vec<_> =
            scanned.mods.iter().map(|m| (m.inline.join("::"), m.name.as_str(), m.path_attr.as_deref())).collect();
        assert_eq!(mods, [("".into(), "a", None), ("b".into(), "c", Some("other.rs")), ("".into(), "d", None)]);
        assert_eq!(scanned.inline_mods, BTreeSet::from(["b".to_string()]));
        assert_eq!(
            scanned.paths,
            [PathRef {
                line: 4,
                inline: vec!["b".into()],
                segments: vec!["super".into(), "a".into(), "X".into()],
                import: None,
            }]
        );
    }

    #[test]
    fn imports_say_what_they_bind_and_whether_they_re_export() {
        let source =
            "pub use a::X;\npub(crate) use b::{self, Y as Z};\nuse c::T as _;\nuse d::*;\nfn f() { use e::W; }";
        let imports: Vec<(String, Option<String>, bool, bool)> = scan(source)
            .paths
            .into_iter()
            .filter_map(|path| {
                let import = path.import?;
                Some((path.segments.join("::"), import.binding, import.public, import.module_level))
            })
            .collect();
        let some = |name: &str| Some(name.to_string());
        assert_eq!(
            imports,
            [
                ("a::X".into(), some("X"), true, true),
                ("b".into(), some("b"), true, true),
                ("b::Y".into(), some("Z"), true, true),
                ("c::T".into(), None, false, true),
                ("d::*".into(), None, false, true),
                ("e::W".into(), some("W"), false, false),
            ]
        );
    }

    #[test]
    fn code_names_child_paths_but_not_visibilities() {
        let source =
            "pub(crate) fn f(x: Vec<u8>) -> child::Out { pub(in super::super) struct S; x.len(); child::make() }";
        assert_eq!(paths(source), ["child::Out", "child::make"]);
        let names = scan("pub use a::Hidden;\nfn f() -> Shown { Shown }").names;
        assert!(names.contains("Shown") && !names.contains("Hidden"), "{names:?}");
    }
}
