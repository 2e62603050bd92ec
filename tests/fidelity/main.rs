//! Fidelity: flagd fed by the proxy answers exactly as flagd reading the same document.
//!
//! A corpus of flag configuration documents (generated from a seed, plus flagd's schema test
//! vectors: see `corpus.rs`) goes to flagd v0.16 twice: as files flagd reads itself, and as
//! FeatureFlag manifests the proxy serves to flagd over gRPC sync. Every flag of every document
//! is evaluated in both, in two contexts, over flagd's evaluation API; every answer (value,
//! variant, reason, or error code) must be the same. A document the proxy held back that flagd
//! loads shows up as flags flagd cannot find through the proxy, and the other way round.
//!
//! The in-process providers of the compatibility matrix go through the same corpus twice too:
//! each reads every document from a file and syncs it from the proxy (`providers.rs`), and each
//! flag must evaluate the same both ways; a provider that treats a document differently from
//! flagd is listed (`docs/fidelity.md`, rewritten when `FLAGD_PROXY_UPDATE_DOCS` is set).
//!
//! Needs flagd (`scripts/install-compat.sh flagd`) and root (flagd runs in a network namespace
//! of its own), and the providers' programs (`scripts/install-interop.sh`,
//! `scripts/install-compat.sh`); skipped without them, a failure under `CI`.
use flagd_proxy_testkit as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use support::Proxy;
use support::control_plane::{cache_dir, test_data};
use support::or_return;

mod corpus;
mod flagd;
mod providers;

use corpus::Doc;
use flagd::{EVENT_TIMEOUT, Flagd, marker_document};
use providers::{CLIENTS, JobDocument, Outcome};

/// The two tests share the machine's cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The corpus' seed: the same documents in every run.
const SEED: u64 = 0x5EED_F1A6;
/// Generated documents drawn at random (besides the systematic ones and the schema vectors).
const RANDOM_DOCUMENTS: usize = 450;
/// Documents one flagd reads at once (each file source holds an inotify instance).
const BATCH: usize = 50;
const NAMESPACE: &str = "fidelity";
const FLAGD_VERSION: &str = "v0.16.0";

/// The evaluation contexts every flag is evaluated in.
fn contexts() -> [Value; 2] {
    [
        json!({}),
        json!({"targetingKey": "user-1", "tier": "gold", "v": "1.3.0", "e": "abz",
               "list": ["a"]}),
    ]
}

/// Documents in batches whose flag keys do not collide (flagd merges its sources' flags).
fn batches(docs: &[Doc]) -> Vec<Vec<usize>> {
    let mut batches: Vec<(Vec<usize>, std::collections::BTreeSet<String>)> = Vec::new();
    for (index, doc) in docs.iter().enumerate() {
        let keys = doc.flag_keys();
        let fits = batches.iter_mut().find(|(members, taken)| {
            members.len() < BATCH && keys.iter().all(|key| !taken.contains(key))
        });
        match fits {
            Some((members, taken)) => {
                members.push(index);
                taken.extend(keys);
            }
            None => batches.push((vec![index], keys.into_iter().collect())),
        }
    }
    batches.into_iter().map(|(members, _)| members).collect()
}

/// What flagd answers for each flag of `docs` in each context: its `ResolveAll` entry, or, for
/// a flag `ResolveAll` leaves out, its answer to a string evaluation (the error code, or what
/// it resolved to).
async fn answers(flagd: &Flagd, docs: &[&Doc]) -> BTreeMap<(String, usize), Value> {
    let mut out = BTreeMap::new();
    for (index, context) in contexts().iter().enumerate() {
        let all = flagd.resolve_all(context).await;
        for doc in docs {
            for key in doc.flag_keys() {
                let answer = match all.get(&key) {
                    Some(answer) => answer.clone(),
                    None => {
                        let single = flagd.resolve_string(&key, context).await;
                        json!({
                            "code": single.get("code"),
                            "value": single.get("value"),
                            "reason": single.get("reason"),
                            "variant": single.get("variant"),
                        })
                    }
                };
                out.insert((key, index), answer);
            }
        }
    }
    out
}

/// flagd reading the batch's documents from files.
async fn from_files(bin: &Path, dir: &Path, docs: &[&Doc]) -> BTreeMap<(String, usize), Value> {
    std::fs::create_dir_all(dir).expect("batch directory");
    let marker = dir.join("marker.json");
    std::fs::write(&marker, marker_document("v1").to_string()).expect("marker file");
    let mut paths = vec![marker.clone()];
    for (i, doc) in docs.iter().enumerate() {
        let path = dir.join(format!("doc{i}.json"));
        std::fs::write(&path, doc.value.to_string()).expect("document file");
        paths.push(path);
    }
    let sources: Vec<Value> = paths
        .iter()
        .map(|path| json!({"uri": path, "provider": "file"}))
        .collect();
    let flagd = Flagd::start(bin, &sources);
    // A file source logs this once its first payload is in flagd's queue.
    let watching: Vec<String> = paths
        .iter()
        .map(|path| format!("watching {} for changes", path.display()))
        .collect();
    flagd
        .wait("every file read", |f| {
            watching.iter().all(|line| f.count(line) > 0)
        })
        .await;
    std::fs::write(&marker, marker_document("v2").to_string()).expect("marker file");
    flagd.settle("v2").await;
    answers(&flagd, docs).await
}

/// The proxy's state of each resource (`/status`).
async fn availability(proxy: &Proxy) -> BTreeMap<String, String> {
    proxy
        .status_page()
        .await
        .resources
        .into_iter()
        .map(|r| (r.selector, r.availability))
        .collect()
}

fn selector(name: &str) -> String {
    format!("core.openfeature.dev/{NAMESPACE}/{name}")
}

fn write_resource(dir: &Path, name: &str, flag_spec: &Value) {
    let manifest = json!({
        "apiVersion": "core.openfeature.dev/v1beta1",
        "kind": "FeatureFlag",
        "metadata": {"namespace": NAMESPACE, "name": name},
        "spec": {"flagSpec": flag_spec},
    });
    support::write_atomically(&dir.join(format!("{name}.json")), &manifest.to_string());
}

/// flagd fed the batch's documents by the proxy (each a FeatureFlag in `manifests`).
async fn through_proxy(
    bin: &Path,
    proxy: &Proxy,
    socket: &Path,
    manifests: &Path,
    batch: usize,
    docs: &[(usize, &Doc)],
) -> BTreeMap<(String, usize), Value> {
    let marker = format!("marker-{batch}");
    let mut names = vec![marker.clone()];
    names.extend(docs.iter().map(|(index, _)| doc_name(*index)));
    // flagd keeps each source's flags under its URI (a payload replaces the flags its source
    // gave before): every source gets a path of its own, a link to the proxy's socket.
    let links = socket.with_file_name(format!("links-{batch}"));
    std::fs::create_dir_all(&links).expect("links directory");
    let sources: Vec<Value> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let link = links.join(format!("{i}.sock"));
            std::os::unix::fs::symlink(socket, &link).expect("link to the proxy's socket");
            json!({"uri": format!("unix://{}", link.display()), "provider": "grpc",
                   "selector": selector(name)})
        })
        .collect();
    let flagd = Flagd::start(bin, &sources);
    // Every resource of the batch watched and settled: served, or held back.
    let served = support::eventually_within(
        &format!("the proxy settles batch {batch}"),
        EVENT_TIMEOUT,
        || async {
            let states = availability(proxy).await;
            let settled: Vec<&String> = names
                .iter()
                .filter_map(|name| states.get(&selector(name)))
                .filter(|state| *state == "present" || *state == "invalid")
                .collect();
            if settled.len() == names.len() {
                Ok(settled.iter().filter(|state| **state == "present").count())
            } else {
                Err(format!("not yet: {states:?}"))
            }
        },
    )
    .await;
    // A gRPC source logs this once a payload is in flagd's queue.
    flagd
        .wait("every served document received", |f| {
            f.count("received full configuration payload") >= served
        })
        .await;
    write_resource(manifests, &marker, &marker_document("v2"));
    flagd.settle("v2").await;
    answers(
        &flagd,
        &docs.iter().map(|(_, doc)| *doc).collect::<Vec<_>>(),
    )
    .await
}

fn flagd_binary() -> Option<PathBuf> {
    let bin = cache_dir().join(format!("bin/flagd-{FLAGD_VERSION}/flagd"));
    if !bin.is_file() {
        support::skip::skip(format_args!(
            "flagd {FLAGD_VERSION} is not installed ({} is missing): run scripts/install-compat.sh flagd",
            bin.display()
        ));
        return None;
    }
    if !support::skip::running_as_root() {
        support::skip::skip("flagd runs in a network namespace of its own, which needs root");
        return None;
    }
    Some(bin)
}

/// The corpus, in batches, as FeatureFlag manifests a proxy serves (with a marker resource per
/// batch), and the proxy serving them on a unix socket as well as its port.
struct Setup {
    docs: Vec<Doc>,
    batches: Vec<Vec<usize>>,
    work: tempfile::TempDir,
    manifests: PathBuf,
    socket: PathBuf,
    proxy: Proxy,
}

impl Setup {
    async fn new() -> Setup {
        let vectors = test_data("flagd-schemas-flagd/json/test/flags").ok();
        let docs = corpus::corpus(SEED, RANDOM_DOCUMENTS, vectors.as_deref());
        let work = tempfile::tempdir().expect("work directory");
        let manifests = work.path().join("manifests");
        std::fs::create_dir_all(&manifests).expect("manifests directory");
        let batches = batches(&docs);
        for (batch, members) in batches.iter().enumerate() {
            write_resource(
                &manifests,
                &format!("marker-{batch}"),
                &marker_document("v1"),
            );
            for index in members {
                write_resource(&manifests, &doc_name(*index), &docs[*index].value);
            }
        }
        let socket = work.path().join("proxy.sock");
        let manifests_arg = manifests.display().to_string();
        let socket_arg = socket.display().to_string();
        let proxy = Proxy::start(&[
            "--manifests",
            &manifests_arg,
            "--sync-socket-path",
            &socket_arg,
        ])
        .await;
        Setup {
            docs,
            batches,
            work,
            manifests,
            socket,
            proxy,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and flagd: scripts/test installs flagd"]
async fn flagd_fed_by_the_proxy_answers_as_flagd_reading_the_file() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let bin = or_return!(flagd_binary());
    let setup = Setup::new().await;
    let (docs, batches, work) = (&setup.docs, &setup.batches, &setup.work);
    let (manifests, socket, proxy) = (&setup.manifests, &setup.socket, &setup.proxy);
    let mut compared = 0;
    let mut disagreements = Vec::new();
    for (batch, members) in batches.iter().enumerate() {
        let docs_in: Vec<(usize, &Doc)> = members.iter().map(|i| (*i, &docs[*i])).collect();
        let plain: Vec<&Doc> = docs_in.iter().map(|(_, doc)| *doc).collect();
        let file = from_files(&bin, &work.path().join(format!("files-{batch}")), &plain).await;
        let fed = through_proxy(&bin, proxy, socket, manifests, batch, &docs_in).await;
        for (index, doc) in &docs_in {
            for key in doc.flag_keys() {
                for context in 0..contexts().len() {
                    let at = (key.clone(), context);
                    compared += 1;
                    if file.get(&at) != fed.get(&at) {
                        disagreements.push(format!(
                            "document {index} ({}), flag {key:?}, context {context}: from the \
                             file {}, through the proxy {}\n  document: {}",
                            doc.name,
                            file.get(&at).map_or("nothing".into(), Value::to_string),
                            fed.get(&at).map_or("nothing".into(), Value::to_string),
                            doc.value
                        ));
                    }
                }
            }
        }
    }
    report(format_args!(
        "fidelity: {} documents in {} batches, {compared} evaluations compared, {} disagreements",
        docs.len(),
        batches.len(),
        disagreements.len()
    ));
    assert!(
        disagreements.is_empty(),
        "{} of {compared} evaluations differ between flagd reading the file and flagd fed by \
         the proxy:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
    assert!(docs.len() >= 500, "the corpus has {} documents", docs.len());
}

/// How one provider did over the corpus: documents evaluated the same both ways, and the names
/// of those it loads although flagd refuses them, or refuses although flagd loads them.
struct ProviderRow {
    name: &'static str,
    same: usize,
    loads: Vec<String>,
    refuses: Vec<String>,
}

/// The providers' table for `docs/fidelity.md`.
fn providers_doc(rows: &[ProviderRow], docs: usize) -> String {
    let mut out = String::from(
        "# Documents providers treat differently from flagd\n\n<!-- Generated by `scripts/test \
         --test fidelity` (FLAGD_PROXY_UPDATE_DOCS=1 rewrites it); do not edit. -->\n\n",
    );
    out.push_str(&format!(
        "Each in-process provider read the {docs} documents of the differential corpus \
         (`tests/fidelity/`) from a file (its offline file mode) and synced them from the proxy \
         (its in-process gRPC mode); every flag was evaluated both ways, as a boolean, a string, \
         a number and an object, in two contexts. The proxy serves exactly the documents flagd \
         loads, so where a provider loads a document flagd refuses, or refuses one flagd loads, \
         its two modes differ: that is the provider's own defect, and it is listed here. Every \
         other document evaluates the same both ways (the test fails otherwise).\n\n",
    ));
    out.push_str(
        "| client | documents evaluated the same both ways | documents this client treats \
         differently from flagd | loads what flagd refuses (examples) | refuses what flagd \
         loads (examples) |\n|---|---|---|---|---|\n",
    );
    for ProviderRow {
        name,
        same,
        loads,
        refuses,
    } in rows
    {
        let examples = |list: &[String]| {
            if list.is_empty() {
                "-".to_owned()
            } else {
                let shown: Vec<&str> = list.iter().take(3).map(String::as_str).collect();
                format!("{} ({})", list.len(), shown.join("; "))
            }
        };
        out.push_str(&format!(
            "| {name} | {same} | {} | {} | {} |\n",
            loads.len() + refuses.len(),
            examples(loads),
            examples(refuses)
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the flagd providers: scripts/test installs them"]
async fn providers_answer_the_same_from_a_file_and_through_the_proxy() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let mut commands = Vec::new();
    for client in CLIENTS {
        match client.command() {
            Ok(_) => commands.push(client),
            Err(missing) => {
                support::skip::skip(format_args!("{}: {missing}", client.name()));
                return;
            }
        }
    }
    let setup = Setup::new().await;
    let files = setup.work.path().join("documents");
    std::fs::create_dir_all(&files).expect("documents directory");
    let mut client = support::client::client(&setup.proxy).await;
    let mut documents = Vec::new();
    for (index, doc) in setup.docs.iter().enumerate() {
        let id = doc_name(index);
        let path = files.join(format!("{id}.json"));
        std::fs::write(&path, doc.value.to_string()).expect("document file");
        let served = support::client::fetch(&mut client, &selector(&id))
            .await
            .is_ok();
        documents.push(JobDocument {
            selector: selector(&id),
            id,
            path,
            flags: doc.flag_keys(),
            served,
        });
    }
    let contexts = contexts();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for client in commands {
        let dir = setup.work.path();
        let port = setup.proxy.port;
        let file = providers::run(client, "file", port, &contexts, &documents, dir).await;
        let sync = providers::run(client, "sync", port, &contexts, &documents, dir).await;
        let (file, sync) = match (file, sync) {
            (Ok(file), Ok(sync)) => (file, sync),
            (Err(e), _) | (_, Err(e)) => {
                failures.push(format!("{}: {e}", client.name()));
                continue;
            }
        };
        let (mut same, mut loads, mut refuses) = (0, Vec::new(), Vec::new());
        for (index, document) in documents.iter().enumerate() {
            let (f, s) = (&file[&document.id], &sync[&document.id]);
            match providers::compare(f, s, document.served) {
                Outcome::Same => same += 1,
                Outcome::ClientDiffers { loads: true } => {
                    loads.push(setup.docs[index].name.clone())
                }
                Outcome::ClientDiffers { loads: false } => {
                    refuses.push(setup.docs[index].name.clone())
                }
                Outcome::Differs => failures.push(format!(
                    "{}: document {index} ({}) evaluates differently from the file ({f}) and \
                     through the proxy ({s})",
                    client.name(),
                    setup.docs[index].name
                )),
            }
        }
        report(format_args!(
            "fidelity: {}: {same} of {} documents the same both ways, {} loaded that flagd \
             refuses, {} refused that flagd loads",
            client.name(),
            documents.len(),
            loads.len(),
            refuses.len()
        ));
        rows.push(ProviderRow {
            name: client.name(),
            same,
            loads,
            refuses,
        });
    }
    let doc = providers_doc(&rows, documents.len());
    report(format_args!("{doc}"));
    if std::env::var_os("FLAGD_PROXY_UPDATE_DOCS").is_some() && failures.is_empty() {
        std::fs::write(support::repo_root().join("docs/fidelity.md"), &doc)
            .expect("write docs/fidelity.md");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Writes a line of the test's figures to stderr past the test harness' capture (which hides
/// what a passing test prints), so that every run shows what was compared.
fn report(line: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The resource name of document `index`.
fn doc_name(index: usize) -> String {
    format!("doc-{index}")
}
