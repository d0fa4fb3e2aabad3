//! The import graph of `src/` has no circle (issue 29, item 3), re-drawn from the source.
//!
//! Each module file of the library and of the binary is a node: the crate roots `src/lib.rs`
//! and `src/main.rs` (the top) are not, nor is test code (`#[cfg(test)]` items, and the files
//! of modules declared under `#[cfg(test)]` such as `tests.rs`). An edge `a -> b` is a path in
//! `a` that names something in `b`: `crate::`, `super::`, `self::` and child-module paths, in
//! `use` trees and in code, resolved to the longest module prefix (a re-export counts as a use
//! of the module that re-exports it; only the crate root's re-exports are followed). Comments
//! and string literals are ignored. Three levels are checked:
//! 1. the top-level modules (everything under `src/store/` is `store`, ...; the binary's
//!    modules, `src/cli/`, are `main`);
//! 2. within each directory, its child modules, each with its subtree;
//! 3. the module files themselves (a parent `mod.rs` and its children included).
//!
//! A circle is printed with the edges that make it and the source lines of each edge.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A module path below the crate root (`["store", "local"]`); the root is empty.
type Module = Vec<String>;

/// A circle: its nodes, and the edges that make it (from, to, the reference).
type Circle<'g> = (Vec<Module>, Vec<(Module, Module, &'g Edge)>);

/// One reference from a module to another, with where it is written.
#[derive(Debug, Clone)]
struct Edge {
    from: Module,
    to: Module,
    file: String,
    line: usize,
    text: String,
}

/// The module files of the library and the references between them.
#[derive(Debug, Default)]
struct Graph {
    modules: BTreeSet<Module>,
    edges: Vec<Edge>,
}

/// A module file: its module path, its file, its text with comments, strings and test code
/// blanked out (lines kept), and the original lines.
struct Source {
    /// The crate root's module path: empty for the library, `main` for the binary.
    krate: Module,
    module: Module,
    file: PathBuf,
    code: String,
    lines: Vec<String>,
}

fn name(m: &[String]) -> String {
    if m.is_empty() {
        "crate".to_string()
    } else {
        m.join("::")
    }
}

/// Blanks comments and the contents of string and char literals (newlines kept, so line
/// numbers stay).
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if !ident_before && (c[i] == 'r' || (c[i] == 'b' && c.get(i + 1) == Some(&'r'))) && {
            let mut j = i + if c[i] == 'b' { 2 } else { 1 };
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            c.get(j) == Some(&'"')
        } {
            // A raw string: r"..", r#".."#, br"..".
            let mut j = i + if c[i] == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while c[j] == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            while j < c.len() && !(c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#'))) {
                j += 1;
            }
            let end = (j + 1 + hashes).min(c.len());
            out.push_str("\"\"");
            for &ch in &c[i..end] {
                if ch == '\n' {
                    out.push('\n');
                }
            }
            i = end;
        } else if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}'), or a lifetime ('a).
            let end = if c.get(i + 1) == Some(&'\\') {
                (i + 2..c.len()).find(|&j| c[j] == '\'')
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    out.push_str("' '");
                    i = e + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Blanks every item under `#[cfg(test)]` (its attributes and body; newlines kept).
fn strip_test_items(code: &str) -> String {
    let mut c: Vec<char> = code.chars().collect();
    let pattern: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + pattern.len() <= c.len() {
        if c[i..i + pattern.len()] != pattern[..] {
            i += 1;
            continue;
        }
        let start = i;
        let mut j = i + pattern.len();
        let mut depth = 0i32;
        let mut braced = false;
        while j < c.len() {
            match c[j] {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                '{' => {
                    depth += 1;
                    braced = true;
                }
                '}' => {
                    depth -= 1;
                    if depth == 0 && braced {
                        j += 1;
                        break;
                    }
                }
                ';' if depth == 0 && !braced => {
                    j += 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        let end = j.min(c.len());
        for ch in &mut c[start..end] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
        i = j;
    }
    c.into_iter().collect()
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Path, // `::`
    Punct(char),
}

fn tokens(code: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphabetic() || ch == '_' || (ch == '$' && c.get(i + 1).is_some_and(|n| n.is_alphabetic())) {
            let start = i;
            i += 1;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            out.push((Tok::Ident(word.trim_start_matches('$').trim_start_matches("r#").to_string()), line));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                i += 1;
            }
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// Reads a `use` tree at `toks[*i..]` (after `use`), up to and including its `;`: every path
/// it names (`a::{self, b::c}` gives `a` and `a::b::c`; a glob gives its module).
fn use_tree(toks: &[(Tok, usize)], i: &mut usize, prefix: &[String], out: &mut Vec<(Vec<String>, usize)>) {
    let mut path = prefix.to_vec();
    let mut line = toks.get(*i).map_or(0, |t| t.1);
    while *i < toks.len() {
        let (tok, l) = &toks[*i];
        match tok {
            Tok::Ident(w) if w == "as" => {
                *i += 2; // the alias
                continue;
            }
            Tok::Ident(w) if w == "self" && path.len() == prefix.len() && !prefix.is_empty() => {}
            Tok::Ident(w) => {
                path.push(w.clone());
                line = *l;
            }
            Tok::Path => {}
            Tok::Punct('{') => {
                *i += 1;
                use_tree(toks, i, &path, out);
                path.truncate(prefix.len());
                continue;
            }
            Tok::Punct('*') => {}
            Tok::Punct(',') => {
                if path.len() > prefix.len() || !prefix.is_empty() {
                    out.push((path.clone(), line));
                }
                path.truncate(prefix.len());
            }
            Tok::Punct('}') | Tok::Punct(';') => {
                if path.len() > prefix.len() || (!prefix.is_empty() && matches!(toks[*i - 1].0, Tok::Ident(_))) {
                    out.push((path.clone(), line));
                }
                *i += 1;
                return;
            }
            Tok::Punct(_) => {}
        }
        *i += 1;
    }
}

/// The module files reachable from `src/lib.rs`, and from `src/main.rs` (the binary, whose
/// modules are under `main`), through declarations outside test code.
fn sources(src: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    let mut todo = vec![(Module::new(), src.join("lib.rs"), Module::new())];
    let bin = vec!["main".to_string()];
    todo.push((bin.clone(), src.join("main.rs"), bin));
    while let Some((module, file, krate)) = todo.pop() {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let code = strip_test_items(&strip(&text));
        let toks = tokens(&code);
        // `mod name;` outside inline modules: a child file.
        let mut depth = 0;
        for w in toks.windows(3) {
            match &w[0].0 {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => depth -= 1,
                _ => {}
            }
            if let (Tok::Ident(m), Tok::Ident(child), Tok::Punct(';')) = (&w[0].0, &w[1].0, &w[2].0) {
                if m == "mod" && depth == 0 {
                    let dir = match file.file_name().and_then(|n| n.to_str()) {
                        Some("lib.rs" | "main.rs" | "mod.rs") => file.parent().map(Path::to_path_buf),
                        _ => Some(file.with_extension("")),
                    }
                    .unwrap_or_default();
                    let flat = dir.join(format!("{child}.rs"));
                    let path = if flat.exists() { flat } else { dir.join(child).join("mod.rs") };
                    let mut m = module.clone();
                    m.push(child.clone());
                    todo.push((m, path, krate.clone()));
                }
            }
        }
        let lines = text.lines().map(str::to_string).collect();
        out.push(Source { krate, module, file, code, lines });
    }
    out
}

fn graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sources = sources(&root.join("src"));
    let modules: BTreeSet<Module> = sources.iter().filter(|s| s.module != s.krate).map(|s| s.module.clone()).collect();
    // The crate root's re-exports (`pub use catalog::{Catalog, ..}`): name -> path.
    let mut root_names: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if let Some(lib) = sources.iter().find(|s| s.module.is_empty()) {
        let toks = tokens(&lib.code);
        let mut i = 0;
        let mut depth = 0;
        while i < toks.len() {
            match &toks[i].0 {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => depth -= 1,
                Tok::Ident(w) if w == "use" && depth == 0 => {
                    i += 1;
                    let mut paths = Vec::new();
                    use_tree(&toks, &mut i, &[], &mut paths);
                    for (p, _) in paths {
                        if let Some(last) = p.last() {
                            root_names.insert(last.clone(), p.clone());
                        }
                    }
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
    // The longest module prefix of `path`; a name the crate root re-exports is followed.
    let prefix = |path: &[String]| -> Option<Module> {
        (1..=path.len()).rev().find(|&n| modules.contains(&path[..n])).map(|n| path[..n].to_vec())
    };
    let resolve = |path: &[String]| -> Option<Module> {
        prefix(path).or_else(|| {
            // Only the library's root re-exports names; the binary's root is `main`.
            if path.first().is_some_and(|f| f == "main") {
                return None;
            }
            let mut via = root_names.get(path.first()?)?.clone();
            via.extend(path[1..].iter().cloned());
            prefix(&via)
        })
    };
    let mut edges = Vec::new();
    for s in sources.iter().filter(|s| s.module != s.krate) {
        let toks = tokens(&s.code);
        let children: BTreeSet<&String> = modules
            .iter()
            .filter(|m| m.len() == s.module.len() + 1 && m.starts_with(&s.module))
            .map(|m| &m[s.module.len()])
            .collect();
        // Inline modules (`mod internals { .. }`) open a scope: (name, brace depth).
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        let mut found: Vec<(Vec<String>, usize, Module)> = Vec::new(); // (path, line, scope)
        let mut i = 0;
        while i < toks.len() {
            let scope: Module = s.module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
            match &toks[i].0 {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth -= 1;
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                }
                Tok::Ident(w) if w == "mod" => {
                    if let (Some((Tok::Ident(n), _)), Some((Tok::Punct('{'), _))) = (toks.get(i + 1), toks.get(i + 2)) {
                        inline.push((n.clone(), depth));
                        depth += 1;
                        i += 3;
                        continue;
                    }
                }
                Tok::Ident(w) if w == "use" => {
                    i += 1;
                    let mut paths = Vec::new();
                    use_tree(&toks, &mut i, &[], &mut paths);
                    for (p, line) in paths {
                        found.push((p, line, scope.clone()));
                    }
                    continue;
                }
                Tok::Ident(w) if !matches!(toks.get(i.wrapping_sub(1)).map(|t| &t.0), Some(Tok::Path)) => {
                    let line = toks[i].1;
                    let mut p = vec![w.clone()];
                    let mut j = i + 1;
                    while let (Some((Tok::Path, _)), Some((Tok::Ident(n), _))) = (toks.get(j), toks.get(j + 1)) {
                        p.push(n.clone());
                        j += 2;
                    }
                    if p.len() > 1 {
                        found.push((p, line, scope.clone()));
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        for (p, line, scope) in found {
            let absolute: Vec<String> = match p[0].as_str() {
                "crate" => s.krate.iter().chain(&p[1..]).cloned().collect(),
                "self" | "super" => {
                    let mut base = scope.clone();
                    let mut k = 0;
                    while k < p.len() && (p[k] == "self" || p[k] == "super") {
                        if p[k] == "super" {
                            base.pop();
                        }
                        k += 1;
                    }
                    base.extend(p[k..].iter().cloned());
                    base
                }
                first if scope == s.module && children.contains(&first.to_string()) => {
                    s.module.iter().cloned().chain(p.iter().cloned()).collect()
                }
                _ => continue,
            };
            let Some(to) = resolve(&absolute) else { continue };
            if to != s.module {
                let text = s.lines.get(line - 1).map_or("", |l| l.trim()).to_string();
                let file = s.file.strip_prefix(root).unwrap_or(&s.file).display().to_string();
                edges.push(Edge { from: s.module.clone(), to, file, line, text });
            }
        }
    }
    Graph { modules, edges }
}

/// The circles (strongly connected components of more than one node) of the graph whose
/// nodes are `group(module)` (modules it maps to `None` are left out), each with its edges.
fn circles(g: &Graph, group: impl Fn(&Module) -> Option<Module>) -> Vec<Circle<'_>> {
    let mut adj: BTreeMap<Module, BTreeMap<Module, Vec<&Edge>>> = BTreeMap::new();
    for m in &g.modules {
        if let Some(n) = group(m) {
            adj.entry(n).or_default();
        }
    }
    for e in &g.edges {
        if let (Some(a), Some(b)) = (group(&e.from), group(&e.to)) {
            if a != b {
                adj.entry(a).or_default().entry(b).or_default().push(e);
            }
        }
    }
    // Tarjan's algorithm.
    struct T<'a> {
        adj: &'a BTreeMap<Module, BTreeMap<Module, Vec<&'a Edge>>>,
        index: BTreeMap<Module, usize>,
        low: BTreeMap<Module, usize>,
        stack: Vec<Module>,
        on: BTreeSet<Module>,
        out: Vec<Vec<Module>>,
    }
    fn visit(t: &mut T<'_>, v: &Module) {
        let n = t.index.len();
        t.index.insert(v.clone(), n);
        t.low.insert(v.clone(), n);
        t.stack.push(v.clone());
        t.on.insert(v.clone());
        let next: Vec<Module> = t.adj.get(v).map(|m| m.keys().cloned().collect()).unwrap_or_default();
        for w in next {
            if !t.index.contains_key(&w) {
                visit(t, &w);
                let l = t.low[v].min(t.low[&w]);
                t.low.insert(v.clone(), l);
            } else if t.on.contains(&w) {
                let l = t.low[v].min(t.index[&w]);
                t.low.insert(v.clone(), l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(&w);
                let done = w == *v;
                scc.push(w);
                if done {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        adj: &adj,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in adj.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    let mut out = t.out;
    out.sort();
    out.into_iter()
        .map(|scc| {
            let members: BTreeSet<&Module> = scc.iter().collect();
            let mut edges = Vec::new();
            for a in &scc {
                for (b, es) in &adj[a] {
                    if members.contains(b) {
                        edges.extend(es.iter().map(|e| (a.clone(), b.clone(), *e)));
                    }
                }
            }
            (scc, edges)
        })
        .collect()
}

/// The circles as text: each with its edges, and up to three source lines per edge.
fn report(what: &str, found: &[Circle<'_>]) -> String {
    let mut out = String::new();
    for (scc, edges) in found {
        let names: Vec<String> = scc.iter().map(|m| name(m)).collect();
        let _ = writeln!(out, "circle ({what}): {}", names.join(", "));
        let mut by_pair: BTreeMap<(String, String), Vec<&Edge>> = BTreeMap::new();
        for (a, b, e) in edges {
            by_pair.entry((name(a), name(b))).or_default().push(e);
        }
        for ((a, b), es) in by_pair {
            let _ = writeln!(out, "  {a} -> {b}");
            let mut seen = BTreeSet::new();
            for e in es.iter().filter(|e| seen.insert((e.file.clone(), e.line))).take(3) {
                let _ = writeln!(out, "      {}:{}: {}", e.file, e.line, e.text);
            }
            if seen.len() > 3 || es.len() > seen.len() + 3 {
                let _ = writeln!(out, "      ...");
            }
        }
    }
    out
}

fn check(what: &str, found: Vec<Circle<'_>>) {
    let text = report(what, &found);
    assert!(found.is_empty(), "{} circle(s) in the module graph of src/:\n{text}", found.len());
}

/// The graph is read at all: the library's modules and a few edges that must be there.
#[test]
fn graph_is_read() {
    let g = graph();
    let has = |m: &str| g.modules.contains(&m.split("::").map(str::to_string).collect::<Vec<_>>());
    assert!(g.modules.len() > 50, "only {} modules", g.modules.len());
    for m in ["catalog", "wal", "wal::clock", "store::local", "apply", "jobs"] {
        assert!(has(m), "module {m} not found");
    }
    let edge = |a: &str, b: &str| g.edges.iter().any(|e| name(&e.from) == a && name(&e.to) == b);
    assert!(edge("catalog", "wal"), "catalog -> wal not found");
    assert!(edge("wal::append", "store"), "wal::append -> store not found");
}

/// Level 1: no circle between the top-level modules (each with its subtree).
#[test]
fn no_circle_between_top_level_modules() {
    let g = graph();
    check("top-level modules", circles(&g, |m| Some(m[..1].to_vec())));
}

/// Level 2: within each directory, no circle between its child modules (each with its
/// subtree); the directory's own `mod.rs` is left out.
#[test]
fn no_circle_between_siblings() {
    let g = graph();
    let dirs: BTreeSet<Module> = g.modules.iter().filter(|m| m.len() > 1).map(|m| m[..m.len() - 1].to_vec()).collect();
    let mut found = Vec::new();
    for dir in std::iter::once(Module::new()).chain(dirs) {
        if dir.is_empty() {
            continue; // the top level is level 1
        }
        found
            .extend(circles(&g, |m| (m.len() > dir.len() && m.starts_with(&dir)).then(|| m[..dir.len() + 1].to_vec())));
    }
    check("sibling modules", found);
}

/// Level 3: no circle between module files, a parent `mod.rs` and its children included.
#[test]
fn no_circle_between_files() {
    let g = graph();
    check("module files", circles(&g, |m| Some(m.clone())));
}
