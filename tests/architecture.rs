//! The crate's shape, checked: the hub is a core that knows no adapter, the transport knows no
//! protocol above it, and no two top-level modules import each other, directly or around a
//! circle; nor do those of the benchmark (`bench`) and of the test kit (`testkit`).
//!
//! Read from the sources: every `crate::<module>` path in code (comments left out) is an edge
//! from the file's top-level module to `<module>`. `testing` (unit-test support) is left out; in
//! the benchmark and the test kit, so are inline test modules (`mod tests {`).
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// What the hub may import: the document it builds snapshots from, its metrics, the resource
/// names, the retry policy, the memory budget, poison-tolerant locks, the shape of the status
/// page its `Source` port reports into, and nothing that serves clients or fetches resources.
const HUB_MAY_IMPORT: &[&str] = &[
    "backoff",
    "budget",
    "document",
    "introspection",
    "locks",
    "metrics",
    "selector",
];

#[test]
fn the_hub_imports_no_adapter() {
    let graph = module_graph();
    let hub = graph.get("hub").expect("a hub module");
    let extra: Vec<_> = hub
        .iter()
        .filter(|m| !HUB_MAY_IMPORT.contains(&m.as_str()))
        .collect();
    assert!(extra.is_empty(), "the hub imports {extra:?}");
}

/// Both ports build on the transport (`net`); the management port does not reach into the sync
/// server.
#[test]
fn the_management_port_imports_nothing_from_the_sync_server() {
    let graph = module_graph();
    let management = graph.get("management").expect("a management module");
    assert!(
        !management.contains("server"),
        "management imports {management:?}"
    );
}

/// Sources (the upstream one included, which speaks the sync protocol as a client) use the
/// protocol leaf, never the inbound wire; and the leaf imports nothing.
#[test]
fn sources_speak_the_protocol_not_the_wire() {
    let graph = module_graph();
    let source = graph.get("source").expect("a source module");
    assert!(!source.contains("wire"), "source imports {source:?}");
    let protocol = graph.get("protocol").expect("a protocol module");
    assert!(protocol.is_empty(), "protocol imports {protocol:?}");
}

/// The command line builds the settings; only `main` hands them to the app that runs them.
#[test]
fn the_command_line_builds_settings_and_never_runs_the_app() {
    let graph = module_graph();
    let cli = graph.get("cli").expect("a cli module");
    assert!(!cli.contains("app"), "cli imports {cli:?}");
    assert!(cli.contains("settings"), "cli imports {cli:?}");
    let settings = graph.get("settings").expect("a settings module");
    assert!(!settings.contains("app"), "settings imports {settings:?}");
}

/// The transport (`net`) holds sockets and the bytes on them: it knows neither the gRPC server
/// above it (no `tonic` crate, no `wire`) nor the core (`hub`).
#[test]
fn the_transport_knows_no_protocol_above_it() {
    let graph = module_graph();
    let net = graph.get("net").expect("a net module");
    let above: Vec<_> = ["wire", "hub"]
        .into_iter()
        .filter(|m| net.contains(*m))
        .collect();
    assert!(above.is_empty(), "net imports {above:?}");
    for file in module_files("net") {
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let tonic: Vec<_> = path_roots(&text)
            .into_iter()
            .filter(|root| root.starts_with("tonic"))
            .collect();
        assert!(tonic.is_empty(), "{} names {tonic:?}", file.display());
    }
}

/// The Kubernetes client fetches resources for the sources: it neither serves clients (`wire`)
/// nor builds on the transport of the ports (`net`).
#[test]
fn kubernetes_knows_neither_the_wire_nor_the_transport() {
    let graph = module_graph();
    let kubernetes = graph.get("kubernetes").expect("a kubernetes module");
    assert!(
        !kubernetes.contains("wire") && !kubernetes.contains("net"),
        "kubernetes imports {kubernetes:?}"
    );
}

#[test]
fn no_import_circle_among_modules() {
    assert_no_circle(&module_graph());
}

/// The benchmark is built in layers too: the command line at the bottom, the proxy processes and
/// the load generator below the scenarios, the reports above the results (see its `main.rs`).
#[test]
fn no_import_circle_among_the_benchs_modules() {
    assert_no_circle(&package_graph(&package_src("bench"), Code::BeforeTests));
}

#[test]
fn no_import_circle_among_the_test_kits_modules() {
    assert_no_circle(&package_graph(&package_src("testkit"), Code::BeforeTests));
}

fn assert_no_circle(graph: &Graph) {
    for start in graph.keys() {
        if let Some(circle) = circle_from(graph, start) {
            panic!("import circle: {}", circle.join(" -> "));
        }
    }
}

/// The transport is built in layers down to its files: the sockets on the HTTP/2 reader, its
/// users on the reader and the frame format; no file of `net` imports one that imports it back,
/// directly or around a circle. (Elsewhere a module and its children may use each other's items.)
#[test]
fn no_import_circle_among_the_transports_files() {
    let graph = file_graph("net");
    assert!(graph.len() > 5, "found the files: {graph:?}");
    for start in graph.keys() {
        if let Some(circle) = circle_from(&graph, start) {
            panic!("import circle: {}", circle.join(" -> "));
        }
    }
}

#[test]
fn the_check_finds_a_circle() {
    let graph: Graph = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .fold(Graph::new(), |mut g, (from, to)| {
            g.entry(from.into()).or_default().insert(to.into());
            g
        });
    assert_eq!(
        circle_from(&graph, "a"),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(circle_from(&graph, "d"), None, "d is on no circle");
    let named = named_paths(
        "net::h2::reader",
        "use super::frame::{A, B};\nuse crate::{net::room::X, hub}; // self::gone\nPin::new(x);",
    );
    let named: Vec<String> = named.iter().map(|path| path.join("::")).collect();
    assert_eq!(
        named,
        [
            "net::h2::frame",
            "net::room::X",
            "hub",
            "net::h2::reader::Pin::new"
        ]
    );
    assert_eq!(
        path_roots("use tonic::Status; // other::X\nlet a = crate::tonic::b(tonic_health::c);"),
        BTreeSet::from([
            "crate".to_owned(),
            "tonic".to_owned(),
            "tonic_health".to_owned()
        ])
    );
    assert_eq!(
        imports("use crate::hub::{Hub, Snapshot}; // crate::wire\nuse crate::{metrics::M, tls};"),
        BTreeSet::from(["hub".to_owned(), "metrics".to_owned(), "tls".to_owned()])
    );
}

/// A path of imports from `start` back to `start`, if there is one.
fn circle_from(graph: &Graph, start: &str) -> Option<Vec<String>> {
    fn walk(graph: &Graph, start: &str, path: &mut Vec<String>) -> bool {
        let last = path.last().cloned().unwrap_or_default();
        for next in graph.get(&last).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if path.contains(next) {
                continue;
            }
            path.push(next.clone());
            if walk(graph, start, path) {
                return true;
            }
            path.pop();
        }
        false
    }
    let mut path = vec![start.to_owned()];
    walk(graph, start, &mut path).then_some(path)
}

/// Top-level module -> the top-level modules its files import, for the proxy's `src`.
fn module_graph() -> Graph {
    package_graph(&package_src("."), Code::All)
}

/// The `src` folder of the workspace's package in `folder` (`.` is the proxy itself).
fn package_src(folder: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(folder)
        .join("src")
}

/// How much of a file is read for its imports.
#[derive(Clone, Copy)]
enum Code {
    /// The whole file.
    All,
    /// What comes before its inline test module (`mod tests {`).
    BeforeTests,
}

/// Top-level module -> the top-level modules its files import, for the package with sources in
/// `src`. The crate roots (`lib`, `main`), separate binaries (`bin`) and unit-test support
/// (`testing`) are left out.
fn package_graph(src: &Path, code: Code) -> Graph {
    let left_out = ["lib", "main", "bin", "testing"];
    let mut graph = Graph::new();
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).expect("under src");
        let first = relative.components().next().expect("a component");
        let module = first.as_os_str().to_string_lossy();
        let module = module.trim_end_matches(".rs").to_owned();
        if left_out.contains(&module.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let text = match code {
            Code::All => text.as_str(),
            Code::BeforeTests => text.split("\nmod tests {").next().unwrap_or_default(),
        };
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(
            imports(text)
                .into_iter()
                .filter(|m| *m != module && !left_out.contains(&m.as_str())),
        );
    }
    assert!(graph.len() > 5, "found the modules: {graph:?}");
    graph
}

/// The top-level modules named by `crate::<module>` paths outside comments.
fn imports(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (root, rest) in path_starts(text) {
        if root != "crate" {
            continue;
        }
        // `crate::{a::X, b}` names several; nested groups name no further top-level module.
        for member in members(rest) {
            let name: String = member.chars().take_while(|c| ident(*c)).collect();
            if name.starts_with(|c: char| c.is_ascii_lowercase()) {
                found.insert(name);
            }
        }
    }
    found
}

/// Where each path in `text`'s code (outside comments) starts: the name before its first `::`,
/// and what follows that `::`. A later part of a path is no start, nor is a member of a group
/// (it is read with the group's start, see [`members`]).
fn path_starts(text: &str) -> Vec<(&str, &str)> {
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        for (at, _) in code.match_indices("::") {
            let before = &code[..at];
            let root = before.rsplit(|c| !ident(c)).next().unwrap_or_default();
            let start = before[..before.len() - root.len()].trim_end();
            let in_group = start.contains("::{") && (start.ends_with('{') || start.ends_with(','));
            if !root.is_empty() && !start.ends_with("::") && !in_group {
                found.push((root, &code[at + "::".len()..]));
            }
        }
    }
    found
}

/// What follows a path's start: one path, or each member of a group on its line (`{a::X, b}`).
fn members(rest: &str) -> Vec<&str> {
    match rest.strip_prefix('{') {
        Some(group) => group.split(',').map(str::trim).collect(),
        None => vec![rest],
    }
}

fn ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The files of top-level `module`, by module (`net`, `net::h2`, `net::h2::reader`) -> those of
/// them that its paths name, read outside comments and before an inline test module.
fn file_graph(module: &str) -> Graph {
    let src = package_src(".");
    let files: BTreeMap<String, PathBuf> = module_files(module)
        .into_iter()
        .map(|file| (module_path(&src, &file), file))
        .collect();
    let mut graph = Graph::new();
    for (name, file) in &files {
        let text = std::fs::read_to_string(file).expect("read a source file");
        let code = text.split("\nmod tests {").next().unwrap_or_default();
        let edges = graph.entry(name.clone()).or_default();
        for mut path in named_paths(name, code) {
            // The file is the longest start of the path that names one.
            while !path.is_empty() && !files.contains_key(&path.join("::")) {
                path.pop();
            }
            let target = path.join("::");
            if !path.is_empty() && target != *name {
                edges.insert(target);
            }
        }
    }
    graph
}

/// `net::h2::reader` for `src/net/h2/reader.rs` (and for `src/net/h2/reader/mod.rs`).
fn module_path(src: &Path, file: &Path) -> String {
    let relative = file
        .strip_prefix(src)
        .expect("under src")
        .with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|part| part.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The paths in `code`, a file of module `name`, from the crate's root: `crate::a::b`,
/// `super::x`, `self::x`, and any other (a child's `x::y`, also `Pin::new`) as if under `name`;
/// each member of a group on one line (`crate::{a::X, b}`).
fn named_paths(name: &str, code: &str) -> Vec<Vec<String>> {
    let here: Vec<String> = name.split("::").map(str::to_owned).collect();
    let mut found = Vec::new();
    for (root, rest) in path_starts(code) {
        let base = match root {
            "crate" => Vec::new(),
            "self" => here.clone(),
            "super" => here[..here.len().saturating_sub(1)].to_vec(),
            other => [here.clone(), vec![other.to_owned()]].concat(),
        };
        for member in members(rest) {
            let mut path = base.clone();
            for part in member.split("::") {
                let part: String = part.chars().take_while(|c| ident(*c)).collect();
                match part.as_str() {
                    "" => break,
                    "super" => drop(path.pop()),
                    _ => path.push(part),
                }
            }
            found.push(path);
        }
    }
    found
}

/// The first names of the paths in code outside comments (`tonic` of `tonic::Status`, `crate`
/// of `crate::net::X`): the crates and modules a file names.
fn path_roots(text: &str) -> BTreeSet<String> {
    path_starts(text)
        .into_iter()
        .map(|(root, _)| root.to_owned())
        .collect()
}

/// The files of a top-level module: `src/<module>.rs` and those under `src/<module>/`.
fn module_files(module: &str) -> Vec<PathBuf> {
    let src = package_src(".");
    let folder = src.join(module);
    let mut files = if folder.is_dir() {
        rust_files(&folder)
    } else {
        Vec::new()
    };
    files.push(src.join(format!("{module}.rs")));
    files.retain(|file| file.exists());
    assert!(!files.is_empty(), "no files of {module}");
    files
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read a source folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}
