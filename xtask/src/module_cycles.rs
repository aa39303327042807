//! `cargo xtask module-cycles` (also a stage of `cargo xtask test`): fails
//! when the files of one module import each other, directly or round a
//! longer loop.
//!
//! Each workspace crate's module tree is followed from its roots through its
//! `mod` declarations (`#[path]` included). Every path in `use` trees and in
//! code that starts with `crate`, `super`, `self` or a child module's name is
//! resolved to the deepest module file it names and the item after it. Each
//! module has a graph whose nodes are its own file and its children (a child
//! stands for its whole subtree: `vision.rs` or `vision/mod.rs` with
//! everything under it; an inline `mod tests { … }` of the module's file is a
//! node of its own). Edges:
//! - between two children, when a file under one names the other: `http/lora.rs`
//!   naming `super::params::X`, or `model/vision/encoder.rs` naming
//!   `crate::model::lora::Y` (an edge `vision` -> `lora`);
//! - child -> the module's file, when a file under the child names an item
//!   the module's file defines (`super::Thing`);
//! - the module's file -> a child, when its code names something in the
//!   child. Declaring the child (`mod a;`) is no edge, nor is importing from
//!   it (`pub use a::A;`) unless the file's code then mentions the name
//!   (`fn f(_: A)`); only a private glob import counts as it stands.
//!
//! An item that a module's file imports rather than defines (`pub use
//! b::B;`, `use crate::x::Y;`) is followed to where it comes from: a child
//! naming `super::B` makes an edge to `b`, and naming an item from another
//! crate makes none. Each strongly connected set of more than one node is a
//! cycle, reported with the imports that close it.
//!
//! Plain text: a small lexer skips comments and literals (`scan`); nothing is
//! compiled, so glob imports and macros are taken at their word.

mod scan;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};

use crate::workspace::repo_root;
use scan::{FileScan, Import, PathRef, scan};

pub fn module_cycles() -> anyhow::Result<()> {
    let root = repo_root();
    let workspace = Workspace::load(&root)?;
    let report = check(&workspace.files, &workspace.roots);
    for file in &report.unreached {
        eprintln!("xtask: note: {} is in no crate's module tree (not checked)", file.display());
    }
    if report.cycles.is_empty() {
        eprintln!("xtask: no import cycles inside any module ({} files)", workspace.files.len());
        return Ok(());
    }
    for cycle in &report.cycles {
        eprintln!("{cycle}");
    }
    bail!("{} import cycle(s) inside modules (listed above)", report.cycles.len())
}

/// Every `.rs` file of the workspace's crates (paths relative to the
/// repository root) and the crate roots among them.
struct Workspace {
    files: BTreeMap<PathBuf, String>,
    roots: Vec<PathBuf>,
}

impl Workspace {
    fn load(root: &Path) -> anyhow::Result<Workspace> {
        let manifest = read(root, Path::new("Cargo.toml"))?;
        let manifest: toml::Table = toml::from_str(&manifest).context("parsing Cargo.toml")?;
        let members = manifest
            .get("workspace")
            .and_then(|workspace| workspace.get("members"))
            .and_then(|members| members.as_array())
            .context("Cargo.toml has no workspace.members")?;
        let mut files = BTreeMap::new();
        let mut roots = BTreeSet::new();
        let mut member_dirs = Vec::new();
        for member in members {
            let member = PathBuf::from(member.as_str().context("a workspace member is not a string")?);
            member_dirs.push(member.clone());
            for dir in ["src", "tests", "benches", "examples"] {
                collect_rs(root, &member.join(dir), &mut files)?;
            }
            if root.join(&member).join("build.rs").is_file() {
                let build = member.join("build.rs");
                files.insert(build.clone(), read(root, &build)?);
            }
            let crate_manifest = read(root, &member.join("Cargo.toml"))?;
            let crate_manifest: toml::Table = toml::from_str(&crate_manifest)
                .with_context(|| format!("parsing {}", member.join("Cargo.toml").display()))?;
            roots.extend(declared_roots(&member, &crate_manifest));
        }
        roots.extend(conventional_roots(&member_dirs, &files));
        let roots = roots.into_iter().filter(|path| files.contains_key(path)).collect();
        Ok(Workspace { files, roots })
    }
}

fn read(root: &Path, path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(root.join(path)).with_context(|| format!("reading {}", path.display()))
}

fn collect_rs(root: &Path, dir: &Path, files: &mut BTreeMap<PathBuf, String>) -> anyhow::Result<()> {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let path = dir.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            collect_rs(root, &path, files)?;
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.insert(path.clone(), read(root, &path)?);
        }
    }
    Ok(())
}

/// The `path`s a crate's manifest gives its targets.
fn declared_roots(member: &Path, manifest: &toml::Table) -> Vec<PathBuf> {
    let mut targets: Vec<&toml::Value> = manifest.get("lib").into_iter().collect();
    for kind in ["bin", "test", "bench", "example"] {
        if let Some(list) = manifest.get(kind).and_then(|list| list.as_array()) {
            targets.extend(list);
        }
    }
    targets.iter().filter_map(|target| target.get("path")?.as_str()).map(|path| member.join(path)).collect()
}

/// Cargo's target auto-discovery: `src/lib.rs`, `src/main.rs`,
/// `src/bin/*.rs`, `src/bin/*/main.rs`, `tests/*.rs`, `benches/*.rs`,
/// `examples/*.rs` and `build.rs` of each crate (a member folder may be
/// nested, as `server/model`).
fn conventional_roots(members: &[PathBuf], files: &BTreeMap<PathBuf, String>) -> Vec<PathBuf> {
    let parts = |path: &Path| -> Vec<String> {
        path.components().map(|part| part.as_os_str().to_string_lossy().into_owned()).collect()
    };
    files
        .keys()
        .filter(|path| {
            members.iter().filter_map(|member| path.strip_prefix(member).ok()).any(|relative| {
                let parts = parts(relative);
                let tail: Vec<&str> = parts.iter().map(String::as_str).collect();
                matches!(
                    tail.as_slice(),
                    ["src", "lib.rs" | "main.rs"]
                        | ["src", "bin", _]
                        | ["src", "bin", _, "main.rs"]
                        | ["tests" | "benches" | "examples", _]
                        | ["build.rs"]
                )
            })
        })
        .cloned()
        .collect()
}

/// An import that makes an edge: `path` on `line` of `file`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Evidence {
    pub file: PathBuf,
    pub line: usize,
    pub path: String,
}

/// Nodes of the module in `parent` (its children and the file itself, by
/// their files) that import each other, with the imports between them.
#[derive(Debug, PartialEq)]
pub struct Cycle {
    pub parent: PathBuf,
    pub members: Vec<PathBuf>,
    pub edges: Vec<(PathBuf, PathBuf, Vec<Evidence>)>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let members: Vec<String> = self.members.iter().map(|file| file.display().to_string()).collect();
        writeln!(f, "import cycle in the module of {}: {}", self.parent.display(), members.join(", "))?;
        for (from, to, evidence) in &self.edges {
            // One path per line: a `use` tree names several.
            let mut lines: Vec<&Evidence> = evidence.iter().collect();
            lines.dedup_by(|a, b| a.file == b.file && a.line == b.line);
            let shown: Vec<String> = lines
                .iter()
                .take(3)
                .map(|import| format!("{}:{} `{}`", import.file.display(), import.line, import.path))
                .collect();
            let more = lines.len().saturating_sub(shown.len());
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            writeln!(f, "  {} -> {}: {}{more}", from.display(), to.display(), shown.join(", "))?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
pub struct Report {
    pub cycles: Vec<Cycle>,
    /// Files of the crates that no module tree reaches.
    pub unreached: Vec<PathBuf>,
}

/// The edges inside every module, keyed by the module's file: for each
/// (from, to) pair of its children's files, the imports that make it.
type Edges = BTreeMap<PathBuf, BTreeMap<(PathBuf, PathBuf), BTreeSet<Evidence>>>;

/// Checks the crates rooted at `roots`; `files` holds every source file by
/// its path (relative paths, `/`-separated components).
pub fn check(files: &BTreeMap<PathBuf, String>, roots: &[PathBuf]) -> Report {
    let scans: BTreeMap<&PathBuf, FileScan> = files.iter().map(|(path, source)| (path, scan(source))).collect();
    let mut edges = Edges::new();
    let mut reached = BTreeSet::new();
    for root in roots {
        let modules = module_tree(root, &scans);
        let tree = Tree { modules: &modules, scans: &scans };
        for (module, file) in &modules {
            reached.insert(file.clone());
            let Some(scanned) = scans.get(file) else { continue };
            for path in &scanned.paths {
                let Some(Edge { parent, from, to }) = tree.edge(module, scanned, path) else { continue };
                let evidence = Evidence { file: file.clone(), line: path.line, path: path.segments.join("::") };
                edges.entry(parent).or_default().entry((from, to)).or_default().insert(evidence);
            }
        }
    }
    let cycles = edges.iter().flat_map(|(parent, siblings)| cycles_among(parent, siblings)).collect();
    let unreached = files.keys().filter(|file| !reached.contains(*file)).cloned().collect();
    Report { cycles, unreached }
}

/// Re-exports followed at most this deep (a loop of them is a compile error
/// anyway).
const MAX_HOPS: usize = 8;

/// One crate's modules (by path below the crate root) and the scans of their
/// files.
struct Tree<'a> {
    modules: &'a BTreeMap<Vec<String>, PathBuf>,
    scans: &'a BTreeMap<&'a PathBuf, FileScan>,
}

/// What a path names: the deepest module along it, and the segment after
/// that (the item it names in that module's file; `*` for a glob).
struct Target {
    module: Vec<String>,
    item: Option<String>,
}

/// `from` imports `to`, two nodes of the graph of the module in `parent`:
/// that file itself and its children.
struct Edge {
    parent: PathBuf,
    from: PathBuf,
    to: PathBuf,
}

impl Tree<'_> {
    fn file(&self, module: &[String]) -> PathBuf {
        self.modules.get(module).cloned().unwrap_or_default()
    }

    /// The edge `path`, written in the file of `module`, makes, if any.
    fn edge(&self, module: &[String], scanned: &FileScan, path: &PathRef) -> Option<Edge> {
        let mut target = self.resolve(module, &path.inline, &path.segments)?;
        if module.starts_with(&target.module) {
            target = self.follow(target)?;
        }
        let common = module.iter().zip(&target.module).take_while(|(a, b)| a == b).count();
        let level = &module[..common];
        if common == target.module.len() && (target.item.is_none() || common == module.len()) {
            // A module named as a whole (`use crate::a`) says nothing of
            // which of its items are used; within one file (its inline
            // modules included) nothing is a cycle between files.
            return None;
        }
        let from = self.node(level, module, path.inline.first());
        let to = self.node(level, &target.module, target.item.as_ref());
        if common == module.len() && path.import.as_ref().is_some_and(|import| !self.used(scanned, import)) {
            // Declaring a child or re-exporting from it is no use of it.
            return None;
        }
        (from != to).then(|| Edge { parent: self.file(level), from, to })
    }

    /// The node that stands for `module` (where `name` is written or named)
    /// in the graph of `level`, one of its ancestors or itself: the child
    /// of `level` that holds it; or, in `level`'s own file, the top-level
    /// inline module `name` (as `file::name`) or else the file itself.
    fn node(&self, level: &[String], module: &[String], name: Option<&String>) -> PathBuf {
        if module.len() > level.len() {
            return self.file(&module[..=level.len()]);
        }
        let file = self.file(level);
        let inline = self.scans.get(&file).zip(name).filter(|(scanned, name)| scanned.inline_mods.contains(*name));
        match inline {
            Some((_, name)) => PathBuf::from(format!("{}::{name}", file.display())),
            None => file,
        }
    }

    /// Whether an import makes a use: its name appears in the file's code,
    /// or it is a private glob (whose names cannot be told apart).
    fn used(&self, scanned: &FileScan, import: &Import) -> bool {
        match &import.binding {
            Some(name) => scanned.names.contains(name),
            None => !import.public,
        }
    }

    /// The module file a path written in `module` (inside its `inline`
    /// modules) names: the deepest module along it (an item's path names the
    /// module that holds the item). A path that starts with neither `crate`,
    /// `super` nor `self` counts when its first segment is a child module.
    fn resolve(&self, module: &[String], inline: &[String], segments: &[String]) -> Option<Target> {
        let (first, rest) = segments.split_first()?;
        let here: Vec<String> = module.iter().chain(inline).cloned().collect();
        let mut at = match first.as_str() {
            "crate" => Vec::new(),
            "self" => here,
            "super" => {
                let mut at = here;
                at.pop()?;
                at
            }
            // From an inline module a child of the file's module is in scope
            // through `use super::*`.
            name => {
                let mut at = [here, module.to_vec()].into_iter().find(|scope| {
                    let mut child = scope.clone();
                    child.push(name.to_string());
                    self.modules.contains_key(&child)
                })?;
                at.push(name.to_string());
                at
            }
        };
        for segment in rest {
            match segment.as_str() {
                "super" => {
                    at.pop()?;
                }
                "self" => {}
                name => at.push(name.to_string()),
            }
        }
        let depth = (0..=at.len()).rev().find(|&len| self.modules.contains_key(&at[..len]))?;
        Some(Target { item: at.get(depth).cloned(), module: at[..depth].to_vec() })
    }

    /// Where `target` leads when its item is one its module's file imports:
    /// `super::X` where the parent has `pub use child::X` names `child`.
    /// `None` when the import comes from outside the crate.
    fn follow(&self, mut target: Target) -> Option<Target> {
        for _ in 0..MAX_HOPS {
            let Some(name) = target.item.as_deref().filter(|name| *name != "*") else { break };
            let Some(scanned) = self.modules.get(&target.module).and_then(|file| self.scans.get(file)) else { break };
            let import = scanned.paths.iter().find(|path| {
                path.inline.is_empty()
                    && path
                        .import
                        .as_ref()
                        .is_some_and(|import| import.module_level && import.binding.as_deref() == Some(name))
            });
            let Some(import) = import else { break };
            target = self.resolve(&target.module, &[], &import.segments)?;
        }
        Some(target)
    }
}

/// The crate rooted at `root`: each module's path (segments below the crate
/// root) and the file that holds it.
fn module_tree(root: &Path, scans: &BTreeMap<&PathBuf, FileScan>) -> BTreeMap<Vec<String>, PathBuf> {
    let mut modules = BTreeMap::new();
    // (module path, file, whether its child modules live in its own folder:
    // crate roots, `mod.rs` and `#[path]` files do; `foo.rs`'s live in `foo/`)
    let mut queue = vec![(Vec::<String>::new(), root.to_path_buf(), true)];
    while let Some((module, file, owns_folder)) = queue.pop() {
        if modules.contains_key(&module) {
            continue;
        }
        modules.insert(module.clone(), file.clone());
        let Some(scanned) = scans.get(&file) else { continue };
        let folder = file.parent().map(Path::to_path_buf).unwrap_or_default();
        let children = if owns_folder { folder.clone() } else { folder.join(file.file_stem().unwrap_or_default()) };
        for decl in &scanned.mods {
            let inline_dir = decl.inline.iter().fold(children.clone(), |dir, name| dir.join(name));
            let mut path = module.clone();
            path.extend(decl.inline.iter().cloned());
            path.push(decl.name.clone());
            let candidates = match &decl.path_attr {
                Some(attr) if decl.inline.is_empty() => vec![(normalize(&folder.join(attr)), true)],
                Some(attr) => vec![(normalize(&inline_dir.join(attr)), true)],
                None => vec![
                    (inline_dir.join(format!("{}.rs", decl.name)), false),
                    (inline_dir.join(&decl.name).join("mod.rs"), true),
                ],
            };
            if let Some((child, owns)) = candidates.into_iter().find(|(child, _)| scans.contains_key(child)) {
                queue.push((path, child, owns));
            }
        }
    }
    modules
}

/// `a/./b/../c` as `a/c`.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The strongly connected sets of more than one node (Tarjan's algorithm).
fn cycles_among(parent: &Path, siblings: &BTreeMap<(PathBuf, PathBuf), BTreeSet<Evidence>>) -> Vec<Cycle> {
    let nodes: Vec<&PathBuf> =
        siblings.keys().flat_map(|(from, to)| [from, to]).collect::<BTreeSet<_>>().into_iter().collect();
    let index_of = |node: &PathBuf| nodes.iter().position(|candidate| *candidate == node).unwrap_or(0);
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (from, to) in siblings.keys() {
        next[index_of(from)].push(index_of(to));
    }
    let mut tarjan = Tarjan {
        next: &next,
        index: vec![None; nodes.len()],
        low: vec![0; nodes.len()],
        stack: Vec::new(),
        on_stack: vec![false; nodes.len()],
        counter: 0,
        components: Vec::new(),
    };
    for node in 0..nodes.len() {
        if tarjan.index[node].is_none() {
            tarjan.visit(node);
        }
    }
    let mut cycles: Vec<Cycle> = tarjan
        .components
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| {
            let members: BTreeSet<&PathBuf> = component.iter().map(|&node| nodes[node]).collect();
            let edges = siblings
                .iter()
                .filter(|((from, to), _)| members.contains(from) && members.contains(to))
                .map(|((from, to), evidence)| (from.clone(), to.clone(), evidence.iter().cloned().collect()))
                .collect();
            Cycle { parent: parent.to_path_buf(), members: members.into_iter().cloned().collect(), edges }
        })
        .collect();
    cycles.sort_by(|a, b| a.members.cmp(&b.members));
    cycles
}

struct Tarjan<'a> {
    next: &'a [Vec<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    stack: Vec<usize>,
    on_stack: Vec<bool>,
    counter: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, node: usize) {
        self.index[node] = Some(self.counter);
        self.low[node] = self.counter;
        self.counter += 1;
        self.stack.push(node);
        self.on_stack[node] = true;
        for &to in &self.next[node] {
            match self.index[to] {
                None => {
                    self.visit(to);
                    self.low[node] = self.low[node].min(self.low[to]);
                }
                Some(index) if self.on_stack[to] => self.low[node] = self.low[node].min(index),
                Some(_) => {}
            }
        }
        if Some(self.low[node]) == self.index[node] {
            let mut component = Vec::new();
            while let Some(top) = self.stack.pop() {
                self.on_stack[top] = false;
                component.push(top);
                if top == node {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> BTreeMap<PathBuf, String> {
        files.iter().map(|(path, source)| (PathBuf::from(path), source.to_string())).collect()
    }

    /// Each file's first folder is a workspace member.
    fn check_tree(files: &[(&str, &str)]) -> Report {
        let members: BTreeSet<&str> = files.iter().filter_map(|(path, _)| path.split('/').next()).collect();
        check_members(files, &members.into_iter().collect::<Vec<_>>())
    }

    fn check_members(files: &[(&str, &str)], members: &[&str]) -> Report {
        let files = tree(files);
        let members: Vec<PathBuf> = members.iter().map(PathBuf::from).collect();
        let roots = conventional_roots(&members, &files);
        check(&files, &roots)
    }

    fn members(report: &Report) -> Vec<Vec<String>> {
        report
            .cycles
            .iter()
            .map(|cycle| cycle.members.iter().map(|file| file.display().to_string()).collect())
            .collect()
    }

    #[test]
    fn a_crate_in_a_nested_member_folder_is_checked() {
        let files = [
            ("s/src/lib.rs", "pub fn f() {}"),
            ("s/m/src/lib.rs", "mod a;\nmod b;"),
            ("s/m/src/a.rs", "use super::b::B;\npub struct A;"),
            ("s/m/src/b.rs", "use crate::a::A;\npub struct B;"),
        ];
        let report = check_members(&files, &["s", "s/m"]);
        assert_eq!(members(&report), [["s/m/src/a.rs", "s/m/src/b.rs"]]);
        assert!(report.unreached.is_empty());
    }

    #[test]
    fn two_siblings_importing_each_other_are_a_cycle() {
        let report = check_tree(&[
            ("c/src/lib.rs", "mod a;\nmod b;"),
            ("c/src/a.rs", "use super::b::B;\npub struct A;"),
            ("c/src/b.rs", "pub struct B;\nfn f() -> crate::a::A { crate::a::A }"),
        ]);
        assert_eq!(members(&report), [["c/src/a.rs", "c/src/b.rs"]]);
        let cycle = &report.cycles[0];
        assert_eq!(cycle.parent, PathBuf::from("c/src/lib.rs"));
        let evidence: Vec<(usize, &str)> =
            cycle.edges.iter().flat_map(|(_, _, found)| found).map(|e| (e.line, e.path.as_str())).collect();
        assert_eq!(evidence, [(1, "super::b::B"), (2, "crate::a::A")]);
        assert!(report.unreached.is_empty());
    }

    #[test]
    fn a_longer_loop_is_one_cycle_naming_every_file() {
        let report = check_tree(&[
            ("c/src/main.rs", "mod m;"),
            ("c/src/m/mod.rs", "mod a;\nmod b;\nmod c;\nmod d;"),
            ("c/src/m/a.rs", "use super::{b::B, d::D};"),
            ("c/src/m/b.rs", "fn f() { self::super::c::go() }"),
            ("c/src/m/c.rs", "use crate::m::a::*;"),
            ("c/src/m/d.rs", "pub struct D;"),
        ]);
        assert_eq!(members(&report), [["c/src/m/a.rs", "c/src/m/b.rs", "c/src/m/c.rs"]]);
        assert_eq!(report.cycles[0].parent, PathBuf::from("c/src/m/mod.rs"));
        assert_eq!(report.cycles[0].edges.len(), 3);
    }

    #[test]
    fn parents_and_children_naming_each_other_are_no_cycle() {
        let report = check_tree(&[
            ("c/src/lib.rs", "pub mod a;\nmod b;\npub use a::inner::X;\nstruct Root;"),
            ("c/src/a.rs", "pub mod inner;\nuse self::inner::X;\nuse super::Root;\nuse crate::b::B;"),
            ("c/src/a/inner.rs", "use super::super::Root;\nuse crate::a::helper;\npub struct X;"),
            ("c/src/b.rs", "pub struct B;\n/// Unlike [`crate::a::A`].\nconst S: &str = \"crate::a::X\";"),
        ]);
        assert!(report.cycles.is_empty(), "{:?}", report.cycles);
        assert!(report.unreached.is_empty());
    }

    #[test]
    fn a_file_deep_in_a_folder_module_speaks_for_its_module() {
        let report = check_tree(&[
            ("c/src/lib.rs", "mod vision;\nmod lora;"),
            ("c/src/vision.rs", "mod encoder;"),
            ("c/src/vision/encoder.rs", "use crate::lora::Adapter;"),
            ("c/src/lora.rs", "pub struct Adapter;\nfn f(_: crate::vision::encoder::Image) {}"),
        ]);
        assert_eq!(members(&report), [["c/src/lora.rs", "c/src/vision.rs"]]);
        let from_encoder = &report.cycles[0].edges[1];
        assert_eq!(from_encoder.0, PathBuf::from("c/src/vision.rs"));
        assert_eq!(from_encoder.2[0].file, PathBuf::from("c/src/vision/encoder.rs"));
    }

    #[test]
    fn inline_modules_and_path_attributes_resolve_like_rustc() {
        let files = [
            ("c/src/lib.rs", "mod a;\nmod b;"),
            ("c/src/a.rs", "#[path = \"a_tests.rs\"]\nmod tests;\npub struct A;"),
            // The tests of `a`: `super` is `a`, so `super::super::b` is `b`.
            ("c/src/a_tests.rs", "use super::A;\nuse super::super::b::B;"),
            ("c/src/b.rs", "pub struct B;\nmod tests { use super::super::a::A; }"),
        ];
        let report = check_tree(&files);
        assert_eq!(members(&report), [["c/src/a.rs", "c/src/b.rs"]]);
        let without_b_to_a = check_tree(&[files[0], files[1], files[2], ("c/src/b.rs", "pub struct B;")]);
        assert!(without_b_to_a.cycles.is_empty(), "{:?}", without_b_to_a.cycles);
    }

    #[test]
    fn files_no_crate_declares_are_listed() {
        let report = check_tree(&[("c/src/lib.rs", "mod a;"), ("c/src/a.rs", ""), ("c/src/old.rs", "")]);
        assert_eq!(report.unreached, [PathBuf::from("c/src/old.rs")]);
    }

    #[test]
    fn a_mod_rs_and_a_child_using_each_others_items_are_a_cycle() {
        let report = check_tree(&[
            ("c/src/lib.rs", "mod m;"),
            ("c/src/m/mod.rs", "mod a;\nmod b;\npub struct Thing;\nfn f() -> a::A { a::A }"),
            ("c/src/m/a.rs", "use super::Thing;\npub struct A;"),
            ("c/src/m/b.rs", "use super::Thing;"),
        ]);
        assert_eq!(members(&report), [["c/src/m/a.rs", "c/src/m/mod.rs"]]);
        let cycle = &report.cycles[0];
        assert_eq!(cycle.parent, PathBuf::from("c/src/m/mod.rs"));
        let evidence: Vec<(&str, usize, &str)> = cycle
            .edges
            .iter()
            .flat_map(|(_, _, found)| found)
            .map(|e| (e.file.to_str().unwrap_or_default(), e.line, e.path.as_str()))
            .collect();
        assert_eq!(evidence, [("c/src/m/a.rs", 1, "super::Thing"), ("c/src/m/mod.rs", 4, "a::A")]);
    }

    #[test]
    fn a_file_with_a_folder_of_children_is_a_node_among_them() {
        let report = check_tree(&[
            ("c/src/lib.rs", "mod foo;"),
            ("c/src/foo.rs", "mod bar;\npub struct T;\nfn f() { self::bar::go(T) }"),
            ("c/src/foo/bar.rs", "pub fn go(_: crate::foo::T) {}"),
        ]);
        assert_eq!(members(&report), [["c/src/foo/bar.rs", "c/src/foo.rs"]]);
    }

    #[test]
    fn declaring_or_re_exporting_a_child_is_no_use_of_it() {
        let child = ("c/src/m/a.rs", "use super::Thing;\npub struct A;");
        for parent in
            ["mod a;\npub use a::A;\npub struct Thing;", "pub mod a;\npub(crate) use self::a::*;\npub struct Thing;"]
        {
            let report = check_tree(&[("c/src/lib.rs", "mod m;"), ("c/src/m/mod.rs", parent), child]);
            assert!(report.cycles.is_empty(), "{parent}: {:?}", report.cycles);
        }
        // The same import, used by the parent's own code.
        let parent = "mod a;\npub use a::A;\npub struct Thing;\nfn f(_: A) {}";
        let report = check_tree(&[("c/src/lib.rs", "mod m;"), ("c/src/m/mod.rs", parent), child]);
        assert_eq!(members(&report), [["c/src/m/a.rs", "c/src/m/mod.rs"]]);
    }

    #[test]
    fn naming_what_the_parent_re_exports_names_the_sibling_it_comes_from() {
        let report = check_tree(&[
            ("c/src/lib.rs", "mod a;\nmod b;\npub use b::B;\nuse std::fmt::Debug;"),
            ("c/src/a.rs", "use super::B;\nuse crate::Debug;\npub struct A;"),
            ("c/src/b.rs", "use crate::a::A;\npub struct B;"),
        ]);
        assert_eq!(members(&report), [["c/src/a.rs", "c/src/b.rs"]]);
        assert_eq!(report.cycles[0].parent, PathBuf::from("c/src/lib.rs"));
    }

    #[test]
    fn the_parents_inline_tests_are_a_node_of_their_own() {
        let parent = "mod testing;\npub struct Cost;\n#[cfg(test)]\nmod tests {\n    use super::testing::close;\n}";
        let files = [("c/src/lib.rs", "mod m;"), ("c/src/m.rs", parent), ("c/src/m/testing.rs", "use super::Cost;")];
        let report = check_tree(&files);
        assert!(report.cycles.is_empty(), "{:?}", report.cycles);
        // The same helper, used by the parent's own code.
        let parent = "mod testing;\npub struct Cost;\nfn f() { testing::close() }";
        let report = check_tree(&[files[0], ("c/src/m.rs", parent), files[2]]);
        assert_eq!(members(&report), [["c/src/m/testing.rs", "c/src/m.rs"]]);
    }
}
