//! Translation of llama.cpp's GBNF grammars into the Lark dialect of llguidance.
//!
//! Supported GBNF: rules `name ::= expr` (names of ASCII letters, digits and `-`), `root` as the start rule,
//! alternation `|` (empty alternatives included), sequences, groups `( )`, the operators `?` `*` `+` and the bounds
//! `{m}` `{m,}` `{m,n}` `{,n}` (at most 2000, llama.cpp's limit), string literals `"..."`, character classes `[...]`
//! and `[^...]` with ranges, `.` (any character), and `#` comments. Escapes, in strings and classes alike:
//! `\n \r \t \\ \" \[ \]`, `\xHH`, `\uHHHH`, `\UHHHHHHHH`, and `\-` `\^`.
//!
//! Accepted beyond llama.cpp: `{,n}`, the escapes `\-` `\^`, left-recursive rules (llguidance's Earley parser takes
//! them), and definitions spanning lines anywhere: the next definition starts where a name is followed by `::=` on
//! its line, while llama.cpp ends a rule at a newline outside parentheses and after anything but `|`. A grammar
//! llama.cpp accepts means the same here, unless refused below.
//!
//! Refused although llama.cpp accepts them: a rule defined twice (llama.cpp silently keeps the last definition),
//! empty classes `[]`, reversed ranges `[z-a]`, and groups nested more than 24 deep, counting the groups the
//! translation adds (llguidance's Lark parser stops at 28).
//!
//! How constructs map:
//! - each GBNF rule becomes a lowercase (parser-level) Lark rule, and the output opens with `start: root`;
//! - each character-level construct becomes a terminal that matches exactly one character: a string literal one
//!   single-character string per character, a class `/[...]/`, `.` `/(?s:.)/`. llguidance lexes greedily with no
//!   backtracking, so a longer terminal could swallow input that GBNF splits otherwise (`"a" "bc" | "ab" "d"` on
//!   `abc`). One-character terminals are never a proper prefix of one another (UTF-8 is prefix-free), so the lexer
//!   never has a choice to make and the Earley parser sees GBNF's own character-level language;
//! - `?` `*` `+` and bounds map to Lark's; a repeated multi-character string, or a second operator, gets a group;
//! - a name stays as it is when it is a lowercase Lark name; otherwise an uppercase letter becomes `_` and its
//!   lowercase, `n_` goes in front when the name does not start with a lowercase letter, and a rule named `start`
//!   becomes `start_` (GBNF names have no `_`, so no two names map to one).

use std::collections::HashMap;

/// A GBNF grammar that cannot be translated: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GBNF grammar, line {line}, column {column}: {message}")]
pub struct GbnfError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Translate a GBNF grammar (llama.cpp's) to llguidance's Lark syntax.
pub fn to_lark(gbnf: &str) -> Result<String, GbnfError> {
    let mut parser = Parser { src: gbnf, pos: 0, depth: 0, refs: Vec::new() };
    parser.grammar().map_err(|Fail { at, message }| {
        let (line, column) = line_column(gbnf, at);
        GbnfError { line, column, message }
    })
}

/// llguidance's Lark parser refuses groups nested more than 28 deep in a rule; the limit counts the groups the
/// translation adds too, and leaves a margin.
const MAX_NESTING: usize = 24;
/// llama.cpp refuses larger repetition bounds.
const MAX_REPETITION: u64 = 2000;
const ANY_CHAR: &str = "/(?s:.)/";

/// An error at a byte offset; turned into line and column only once, at the end.
struct Fail {
    at: usize,
    message: String,
}

fn fail<T>(at: usize, message: impl Into<String>) -> Result<T, Fail> {
    Err(Fail { at, message: message.into() })
}

fn line_column(src: &str, at: usize) -> (usize, usize) {
    let before = src.get(..at).unwrap_or(src);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Matches only the empty string: nothing to repeat, and left out of sequences.
    Empty,
    /// One Lark atom, which can take an operator as it is.
    Atom,
    /// Needs a group before an operator can apply.
    Compound,
}

/// Translated Lark text with what is needed to combine it further.
struct Piece {
    text: String,
    shape: Shape,
    /// Lark groups nested inside `text`.
    height: usize,
}

impl Piece {
    fn new(text: String, shape: Shape) -> Self {
        Piece { text, shape, height: 0 }
    }
}

struct Parser<'a> {
    src: &'a str,
    /// Byte offset, always on a character boundary.
    pos: usize,
    /// Lark groups around the current point.
    depth: usize,
    refs: Vec<(&'a str, usize)>,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}

fn lark_name(name: &str) -> String {
    if name == "start" {
        return "start_".to_string();
    }
    let mut out = String::with_capacity(name.len() + 2);
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        out.push_str("n_");
    }
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// One character as a Lark string literal, which llguidance reads as JSON.
fn lark_string(c: char) -> String {
    match c {
        '"' => r#""\"""#.to_string(),
        '\\' => r#""\\""#.to_string(),
        '\n' => r#""\n""#.to_string(),
        '\r' => r#""\r""#.to_string(),
        '\t' => r#""\t""#.to_string(),
        c if c < ' ' || c == '\x7f' => format!("\"\\u{:04x}\"", c as u32),
        c => format!("\"{c}\""),
    }
}

/// One character inside a regex class. Escaping every punctuation mark keeps `/` from ending the Lark regex and
/// `&&`, `--`, `~~`, `[` from meaning set operations; `<` and `>` are the marks regex-syntax refuses to escape.
fn push_class_char(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str(r"\n"),
        '\r' => out.push_str(r"\r"),
        '\t' => out.push_str(r"\t"),
        c if c.is_ascii_alphanumeric() || c == ' ' || c == '<' || c == '>' => out.push(c),
        c if c.is_ascii_graphic() => {
            out.push('\\');
            out.push(c);
        }
        c => out.push_str(&format!(r"\x{{{:x}}}", c as u32)),
    }
}

impl<'a> Parser<'a> {
    fn rest(&self) -> &'a str {
        self.src.get(self.pos..).unwrap_or("")
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn bump(&mut self, c: char) {
        self.pos += c.len_utf8();
    }

    fn skip_space(&mut self) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' | '\r' | '\n' => self.bump(c),
                '#' => self.pos += self.rest().find('\n').unwrap_or(self.rest().len()),
                _ => break,
            }
        }
    }

    fn name(&mut self) -> &'a str {
        let rest = self.rest();
        let len = rest.find(|c: char| !is_name_char(c)).unwrap_or(rest.len());
        self.pos += len;
        rest.get(..len).unwrap_or("")
    }

    /// Whether a name followed by `::=` on the same line starts here: the end of the previous definition.
    fn at_definition(&self) -> bool {
        let rest = self.rest();
        let after_name = rest.trim_start_matches(is_name_char);
        after_name.len() < rest.len() && after_name.trim_start_matches([' ', '\t']).starts_with("::=")
    }

    fn grammar(&mut self) -> Result<String, Fail> {
        let mut rules: Vec<(String, String)> = Vec::new();
        let mut defined: HashMap<&str, usize> = HashMap::new();
        self.skip_space();
        while let Some(c) = self.peek() {
            let start = self.pos;
            if !is_name_char(c) {
                return fail(start, format!("unexpected character '{}'", c.escape_debug()));
            }
            let name = self.name();
            self.pos += self.rest().len() - self.rest().trim_start_matches([' ', '\t']).len();
            if !self.rest().starts_with("::=") {
                return fail(self.pos, format!("expected '::=' after rule name '{name}'"));
            }
            if let Some(&first) = defined.get(name) {
                let (line, column) = line_column(self.src, first);
                return fail(start, format!("rule '{name}' is already defined at line {line}, column {column}"));
            }
            defined.insert(name, start);
            self.pos += 3;
            let body = self.alternatives()?;
            if self.peek() == Some(')') {
                return fail(self.pos, "unmatched ')'");
            }
            rules.push((lark_name(name), body.text));
        }
        for &(name, at) in &self.refs {
            if !defined.contains_key(name) {
                return fail(at, format!("undefined rule '{name}'"));
            }
        }
        if !defined.contains_key("root") {
            return fail(0, "no 'root' rule: the grammar starts at a rule named root");
        }
        let mut out = format!("start: {}\n", lark_name("root"));
        for (name, body) in rules {
            out.push_str(&format!("{name}: {body}\n"));
        }
        Ok(out)
    }

    fn alternatives(&mut self) -> Result<Piece, Fail> {
        let first = self.sequence()?;
        let (mut text, mut height) = (first.text, first.height);
        while self.peek() == Some('|') {
            self.pos += 1;
            let next = self.sequence()?;
            text.push_str(" | ");
            text.push_str(&next.text);
            height = height.max(next.height);
        }
        Ok(Piece { text, shape: Shape::Compound, height })
    }

    /// Stops at the end of input, `|`, `)` or the next definition; the caller judges which is acceptable.
    fn sequence(&mut self) -> Result<Piece, Fail> {
        let mut items: Vec<Piece> = Vec::new();
        loop {
            self.skip_space();
            let at = self.pos;
            let Some(c) = self.peek() else { break };
            let item = match c {
                '|' | ')' => break,
                '"' => self.string()?,
                '[' => self.class()?,
                '(' => self.group()?,
                '.' => {
                    self.pos += 1;
                    Piece::new(ANY_CHAR.to_string(), Shape::Atom)
                }
                '*' | '+' | '?' | '{' => {
                    let bounds = self.repetition()?;
                    match items.pop() {
                        Some(last) if last.shape != Shape::Empty => self.repeat(last, bounds, at)?,
                        _ => return fail(at, format!("nothing to repeat before '{c}'")),
                    }
                }
                c if is_name_char(c) => {
                    if self.at_definition() {
                        break;
                    }
                    let name = self.name();
                    self.refs.push((name, at));
                    Piece::new(lark_name(name), Shape::Atom)
                }
                c => return fail(at, format!("unexpected character '{}'", c.escape_debug())),
            };
            items.push(item);
        }
        items.retain(|item| item.shape != Shape::Empty);
        if items.is_empty() {
            return Ok(Piece::new("\"\"".to_string(), Shape::Empty));
        }
        let height = items.iter().map(|item| item.height).max().unwrap_or(0);
        let text = items.into_iter().map(|item| item.text).collect::<Vec<_>>().join(" ");
        Ok(Piece { text, shape: Shape::Compound, height })
    }

    fn group(&mut self) -> Result<Piece, Fail> {
        let open = self.pos;
        if self.depth >= MAX_NESTING {
            return fail(open, format!("groups nested more than {MAX_NESTING} deep"));
        }
        self.pos += 1;
        self.depth += 1;
        let inner = self.alternatives();
        self.depth -= 1;
        let inner = inner?;
        if self.peek() != Some(')') {
            return fail(open, "unclosed '('");
        }
        self.pos += 1;
        Ok(Piece { text: format!("({})", inner.text), shape: Shape::Atom, height: inner.height + 1 })
    }

    fn string(&mut self) -> Result<Piece, Fail> {
        let open = self.pos;
        self.pos += 1;
        let mut chars = Vec::new();
        loop {
            match self.peek() {
                None => return fail(open, "unterminated string"),
                Some('"') => break,
                Some('\\') => chars.push(self.escape(open, "string")?),
                Some(c) => {
                    self.bump(c);
                    chars.push(c);
                }
            }
        }
        self.pos += 1;
        let shape = match chars.len() {
            0 => return Ok(Piece::new("\"\"".to_string(), Shape::Empty)),
            1 => Shape::Atom,
            _ => Shape::Compound,
        };
        Ok(Piece::new(chars.into_iter().map(lark_string).collect::<Vec<_>>().join(" "), shape))
    }

    /// Reads the escape at the current `\`. `open` is where the enclosing string or class began.
    fn escape(&mut self, open: usize, what: &str) -> Result<char, Fail> {
        let at = self.pos;
        self.pos += 1;
        let Some(c) = self.peek() else { return fail(open, format!("unterminated {what}")) };
        self.bump(c);
        let digits = match c {
            'n' => return Ok('\n'),
            'r' => return Ok('\r'),
            't' => return Ok('\t'),
            '\\' | '"' | '[' | ']' | '-' | '^' => return Ok(c),
            'x' => 2,
            'u' => 4,
            'U' => 8,
            _ => return fail(at, format!("unknown escape '\\{}'", c.escape_debug())),
        };
        let hex: String = self.rest().chars().take(digits).take_while(char::is_ascii_hexdigit).collect();
        if hex.len() != digits {
            return fail(at, format!("escape '\\{c}' needs {digits} hex digits"));
        }
        self.pos += digits;
        let value = hex.chars().filter_map(|d| d.to_digit(16)).fold(0u32, |v, d| (v << 4) | d);
        char::from_u32(value).map_or_else(|| fail(at, format!("escape '\\{c}{hex}' is not a Unicode scalar value")), Ok)
    }

    fn class(&mut self) -> Result<Piece, Fail> {
        let open = self.pos;
        self.pos += 1;
        let mut text = String::from("/[");
        if self.peek() == Some('^') {
            self.pos += 1;
            text.push('^');
        }
        let mut empty = true;
        loop {
            let at = self.pos;
            let lo = match self.peek() {
                None => return fail(open, "unterminated character class"),
                Some(']') => break,
                Some(_) => self.class_char(open)?,
            };
            empty = false;
            push_class_char(&mut text, lo);
            // As in llama.cpp, a '-' right before ']' is a plain character, not a range.
            let mut ahead = self.rest().chars();
            if ahead.next() == Some('-') && ahead.next() != Some(']') {
                self.pos += 1;
                let hi = self.class_char(open)?;
                if hi < lo {
                    let range = format!("'{}'-'{}'", lo.escape_debug(), hi.escape_debug());
                    return fail(at, format!("character range {range} is reversed"));
                }
                text.push('-');
                push_class_char(&mut text, hi);
            }
        }
        self.pos += 1;
        if empty {
            return fail(open, "empty character class");
        }
        text.push_str("]/");
        Ok(Piece::new(text, Shape::Atom))
    }

    fn class_char(&mut self, open: usize) -> Result<char, Fail> {
        match self.peek() {
            None => fail(open, "unterminated character class"),
            Some('\\') => self.escape(open, "character class"),
            Some(c) => {
                self.bump(c);
                Ok(c)
            }
        }
    }

    /// Reads an operator or a `{...}` bound as (minimum, maximum).
    fn repetition(&mut self) -> Result<(u64, Option<u64>), Fail> {
        let open = self.pos;
        match self.peek() {
            Some('*') => {
                self.pos += 1;
                return Ok((0, None));
            }
            Some('+') => {
                self.pos += 1;
                return Ok((1, None));
            }
            Some('?') => {
                self.pos += 1;
                return Ok((0, Some(1)));
            }
            _ => self.pos += 1,
        }
        self.skip_space();
        let min = match self.peek() {
            Some(',') => 0,
            Some(c) if c.is_ascii_digit() => self.number()?,
            _ => return fail(self.pos, "expected a number in the repetition bound"),
        };
        self.skip_space();
        let max = if self.peek() == Some(',') {
            self.pos += 1;
            self.skip_space();
            let max = if self.peek().is_some_and(|c| c.is_ascii_digit()) { Some(self.number()?) } else { None };
            self.skip_space();
            max
        } else {
            Some(min)
        };
        if self.peek() != Some('}') {
            return fail(self.pos, "expected '}' to close the repetition bound");
        }
        self.pos += 1;
        match max {
            Some(max) if max < min => fail(open, format!("repetition bound {{{min},{max}}}: minimum above maximum")),
            _ => Ok((min, max)),
        }
    }

    fn number(&mut self) -> Result<u64, Fail> {
        let at = self.pos;
        let digits = self.rest().find(|c: char| !c.is_ascii_digit()).unwrap_or(self.rest().len());
        let value = self
            .rest()
            .get(..digits)
            .unwrap_or("")
            .bytes()
            .fold(0u64, |v, d| v.saturating_mul(10).saturating_add(u64::from(d - b'0')));
        self.pos += digits;
        if value > MAX_REPETITION {
            return fail(at, format!("repetition count above the limit of {MAX_REPETITION}"));
        }
        Ok(value)
    }

    fn repeat(&self, piece: Piece, bounds: (u64, Option<u64>), at: usize) -> Result<Piece, Fail> {
        let suffix = match bounds {
            (_, Some(0)) => return Ok(Piece::new("\"\"".to_string(), Shape::Empty)),
            (1, Some(1)) => return Ok(piece),
            (0, None) => "*".to_string(),
            (1, None) => "+".to_string(),
            (0, Some(1)) => "?".to_string(),
            (min, None) => format!("{{{min},}}"),
            (min, Some(max)) if min == max => format!("{{{min}}}"),
            (min, Some(max)) => format!("{{{min},{max}}}"),
        };
        let (base, height) = match piece.shape {
            Shape::Atom => (piece.text, piece.height),
            _ if self.depth + piece.height >= MAX_NESTING => {
                return fail(at, format!("groups nested more than {MAX_NESTING} deep"));
            }
            _ => (format!("({})", piece.text), piece.height + 1),
        };
        Ok(Piece { text: base + &suffix, shape: Shape::Compound, height })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Lark body of `root ::= {expr}`.
    fn root_body(expr: &str) -> String {
        let out = to_lark(&format!("root ::= {expr}")).unwrap_or_else(|e| panic!("{expr}: {e}"));
        let body = out.lines().nth(1).and_then(|line| line.strip_prefix("root: "));
        body.unwrap_or_else(|| panic!("{expr}: {out}")).to_string()
    }

    #[test]
    fn translates_each_construct() {
        let cases = [
            (r#""abc""#, r#""a" "b" "c""#),
            (r#""a\n\t\"\\\x41\u00e9\U0001F600\[\]""#, r#""a" "\n" "\t" "\"" "\\" "A" "é" "😀" "[" "]""#),
            (r#""\x01\x7f/""#, r#""\u0001" "\u007f" "/""#),
            (r#""""#, r#""""#),
            ("[a-z0-9_]", r"/[a-z0-9\_]/"),
            (r#"[^"\\\x00-\x1F]"#, r#"/[^\"\\\x{0}-\x{1f}]/"#),
            (r"[\]\-\^/a-] [-a] [é-😀 \n]", r"/[\]\-\^\/a\-]/ /[\-a]/ /[\x{e9}-\x{1f600} \n]/"),
            (".", "/(?s:.)/"),
            ("(\"a\" | \"b\")? x\nx ::= \"x\"", r#"("a" | "b")? x"#),
            (r#""a"* "b"+ "c"? "ab"*"#, r#""a"* "b"+ "c"? ("a" "b")*"#),
            (
                r#""a"{3} "b"{2,} "c"{1,4} "d"{,2} "e"{0} "f"{1} "g"{0,1} "h"{ 0 , }"#,
                r#""a"{3} "b"{2,} "c"{1,4} "d"{0,2} "f" "g"? "h"*"#,
            ),
            (r#""a"*? ("b"){2}+"#, r#"("a"*)? (("b"){2})+"#),
            (r#""a" | "#, r#""a" | """#),
            (r#"| "a" () """#, r#""" | "a" ("")"#),
            ("\"a\" # comment\n  \"b\"\n  | \"c\"", r#""a" "b" | "c""#),
        ];
        for (gbnf, lark) in cases {
            assert_eq!(root_body(gbnf), lark, "{gbnf}");
        }
    }

    #[test]
    fn maps_names_and_heads_with_start() {
        let gbnf = "root ::= Ab-c 9x start root\nAb-c ::= \"a\"\n9x ::= \"b\"\nstart ::= \"c\"\n";
        let lark = "start: root\nroot: n__ab-c n_9x start_ root\nn__ab-c: \"a\"\nn_9x: \"b\"\nstart_: \"c\"\n";
        assert_eq!(to_lark(gbnf), Ok(lark.to_string()));
        assert_eq!(lark_name("aB"), "a_b");
        assert_eq!(lark_name("A"), "n__a");
        assert_eq!(lark_name("-x"), "n_-x");
    }

    #[test]
    fn reports_errors_where_they_are() {
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(25), ")".repeat(25));
        let cases: &[(&str, usize, usize, &str)] = &[
            ("x ::= \"a\"\n", 1, 1, "no 'root' rule: the grammar starts at a rule named root"),
            ("", 1, 1, "no 'root' rule: the grammar starts at a rule named root"),
            ("root ::=\n  \"a\" foo-bar\n", 2, 7, "undefined rule 'foo-bar'"),
            ("root ::= \"a\"\nx ::= \"abc", 2, 7, "unterminated string"),
            ("root ::= \"a\\", 1, 10, "unterminated string"),
            ("root ::= [a-z", 1, 10, "unterminated character class"),
            ("root ::= [a-", 1, 10, "unterminated character class"),
            ("root ::= \"a\\qb\"", 1, 12, "unknown escape '\\q'"),
            ("root ::= [\\/]", 1, 11, "unknown escape '\\/'"),
            ("root ::= \"\\x4\"", 1, 11, "escape '\\x' needs 2 hex digits"),
            ("root ::= \"\\uD800\"", 1, 11, "escape '\\uD800' is not a Unicode scalar value"),
            ("root ::= \"a\"{5,2}", 1, 13, "repetition bound {5,2}: minimum above maximum"),
            ("root ::= \"a\"{2001}", 1, 14, "repetition count above the limit of 2000"),
            ("root ::= \"a\"{2", 1, 15, "expected '}' to close the repetition bound"),
            ("root ::= \"a\"{x}", 1, 14, "expected a number in the repetition bound"),
            ("root ::= \"a\" @ \"b\"", 1, 14, "unexpected character '@'"),
            ("root ::= \"é\" ¤", 1, 14, "unexpected character '¤'"),
            ("root ::= \"a\")", 1, 13, "unmatched ')'"),
            ("root ::= (\"a\"\nx ::= \"b\"", 1, 10, "unclosed '('"),
            ("root ::= *", 1, 10, "nothing to repeat before '*'"),
            ("root ::= \"\"{2}", 1, 12, "nothing to repeat before '{'"),
            ("root ::= [z-a]", 1, 11, "character range 'z'-'a' is reversed"),
            ("root ::= []", 1, 10, "empty character class"),
            ("root \"a\"", 1, 6, "expected '::=' after rule name 'root'"),
            ("root ::= \"a\"\n\nroot ::= \"b\"", 3, 1, "rule 'root' is already defined at line 1, column 1"),
            ("::= \"a\"", 1, 1, "unexpected character ':'"),
            (&deep, 1, 34, "groups nested more than 24 deep"),
        ];
        for &(gbnf, line, column, message) in cases {
            let want = GbnfError { line, column, message: message.to_string() };
            assert_eq!(to_lark(gbnf), Err(want), "{gbnf}");
        }
        let err = to_lark("root ::= \"a\" @").err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("GBNF grammar, line 1, column 14: unexpected character '@'"));
    }

    #[test]
    fn nesting_is_capped_not_overflowed() {
        let at_limit = format!("root ::= {}\"a\"{}", "(".repeat(24), ")".repeat(24));
        assert!(to_lark(&at_limit).is_ok());
        assert!(to_lark(&format!("root ::= {}", "(".repeat(200_000))).is_err());
        assert!(to_lark(&format!("root ::= \"a\"{}", "*?".repeat(100_000))).is_err());
        // A multi-character string under an operator takes a group of its own, which counts: the error is at '*'.
        let wrapped = format!("root ::= {}\"ab\"*{}", "(".repeat(24), ")".repeat(24));
        assert_eq!(to_lark(&wrapped).map_err(|e| e.column), Err(38));
    }
}
