//! `cargo xtask module-cycles` (also a stage of `cargo xtask test`): fails
//! when sibling modules import each other, directly or round a longer loop.
//!
//! Each workspace crate's module tree is followed from its roots through its
//! `mod` declarations (`#[path]` included). Every path starting with `crate`,
//! `super` or `self` (in `use` trees and in code) is resolved to the deepest
//! module file it names. An import between two files is an edge between the
//! two children of their nearest common module that hold them: between
//! `http/lora.rs` and `http/params.rs` directly, and between `model/vision/`
//! (`vision.rs` or `vision/mod.rs` with everything under it) and
//! `model/lora.rs` when a file under `vision/` names `lora`. A module naming
//! its own descendant, or its ancestor, makes no edge. The siblings of each
//! module form a graph, and each strongly connected set of more than one of
//! them is a cycle, reported with the imports that close it.
//!
//! Plain text: a small lexer skips comments and literals (`scan`); nothing is
//! compiled. Re-exports are not followed: `use super::X` where the parent
//! re-exports `X` from a sibling counts as naming the parent.

mod scan;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};

use crate::repo_root;
use scan::{FileScan, PathRef, scan};

pub fn module_cycles() -> anyhow::Result<()> {
    let root = repo_root();
    let workspace = Workspace::load(&root)?;
    let report = check(&workspace.files, &workspace.roots);
    for file in &report.unreached {
        eprintln!("xtask: note: {} is in no crate's module tree (not checked)", file.display());
    }
    if report.cycles.is_empty() {
        eprintln!("xtask: no import cycles between sibling modules ({} files)", workspace.files.len());
        return Ok(());
    }
    for cycle in &report.cycles {
        eprintln!("{cycle}");
    }
    bail!("{} import cycle(s) between sibling modules (listed above)", report.cycles.len())
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

/// Sibling modules (named by their files) that import each other, children
/// of the module in `parent`, with the imports between them.
#[derive(Debug, PartialEq)]
pub struct Cycle {
    pub parent: PathBuf,
    pub members: Vec<PathBuf>,
    pub edges: Vec<(PathBuf, PathBuf, Vec<Evidence>)>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let members: Vec<String> = self.members.iter().map(|file| file.display().to_string()).collect();
        writeln!(f, "import cycle among the children of {}: {}", self.parent.display(), members.join(", "))?;
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

/// The sibling edges of every module, keyed by the module's file: for each
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
        for (module, file) in &modules {
            reached.insert(file.clone());
            let Some(scanned) = scans.get(file) else { continue };
            for path in &scanned.paths {
                let Some(target) = resolve(module, path, &modules) else { continue };
                let common = module.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if common == module.len() || common == target.len() {
                    continue;
                }
                let parent = &modules[&module[..common]];
                let from = modules[&module[..=common]].clone();
                let to = modules[&target[..=common]].clone();
                let evidence = Evidence { file: file.clone(), line: path.line, path: path.segments.join("::") };
                edges.entry(parent.clone()).or_default().entry((from, to)).or_default().insert(evidence);
            }
        }
    }
    let cycles = edges.iter().flat_map(|(parent, siblings)| cycles_among(parent, siblings)).collect();
    let unreached = files.keys().filter(|file| !reached.contains(*file)).cloned().collect();
    Report { cycles, unreached }
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

/// The module file a path written in `module` names: the deepest module
/// along it (an item's path names the module that holds the item).
fn resolve(module: &[String], path: &PathRef, modules: &BTreeMap<Vec<String>, PathBuf>) -> Option<Vec<String>> {
    let mut segments = path.segments.iter();
    let mut at: Vec<String> = match segments.next()?.as_str() {
        "crate" => Vec::new(),
        _ => module.iter().chain(&path.inline).cloned().collect(),
    };
    if path.segments[0] == "super" {
        at.pop()?;
    }
    for segment in segments {
        match segment.as_str() {
            "super" => {
                at.pop()?;
            }
            "self" => {}
            name => at.push(name.to_string()),
        }
    }
    (0..=at.len()).rev().map(|len| &at[..len]).find(|prefix| modules.contains_key(*prefix)).map(<[String]>::to_vec)
}

/// The strongly connected sets of more than one sibling (Tarjan's algorithm).
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
}
