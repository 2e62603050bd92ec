//! Runs: one client against a proxy, per column and per feature.

use super::*;

pub(crate) fn color_flags(default_variant: &str) -> Value {
    json!({
        FLAG_KEY: {
            "state": "ENABLED",
            "variants": { "red": "red", "blue": "blue", "green": "green" },
            "defaultVariant": default_variant,
        }
    })
}

/// A manifests directory with `demo` (the selected resource) and `decoy` (same flag key, the
/// decoy's value), plus the proxy arguments to serve it.
pub(crate) struct Setup {
    pub(crate) manifests: tempfile::TempDir,
    pub(crate) ca: Option<TestCa>,
    pub(crate) args: Vec<String>,
}

impl Setup {
    pub(crate) fn new(tls: bool) -> Setup {
        let manifests = tempfile::tempdir().expect("manifests directory");
        support::write_manifest(manifests.path(), NAMESPACE, NAME, color_flags(INITIAL));
        support::write_manifest(manifests.path(), NAMESPACE, DECOY, color_flags(DECOY_VALUE));
        let ca = tls.then(TestCa::new);
        let mut args = vec![
            "--manifests".to_owned(),
            manifests.path().display().to_string(),
        ];
        if let Some(ca) = &ca {
            args.extend(ca.proxy_args());
        }
        Setup {
            manifests,
            ca,
            args,
        }
    }

    pub(crate) fn args(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }

    pub(crate) fn ca_file(&self) -> Option<&Path> {
        self.ca.as_ref().map(|ca| ca.ca_cert.as_path())
    }

    pub(crate) fn change_to(&self, variant: &str) {
        support::write_manifest(self.manifests.path(), NAMESPACE, NAME, color_flags(variant));
    }
}

pub(crate) type Cells = Vec<(Column, Cell)>;

/// Connect (plain or TLS) and see the initial value; without TLS, then change the manifest
/// and see the new value.
pub(crate) async fn live_run(kind: Kind, launch: Launch, tls: bool) -> Cells {
    let setup = Setup::new(tls);
    let proxy = Proxy::start(&setup.args()).await;
    let mut client = Session::spawn(kind, &launch, proxy.port, setup.ca_file());
    let connect_column = if tls { Column::Tls } else { Column::Plain };

    if kind == Kind::FlagdLegacy {
        return match client.expect_value_or_refusal(INITIAL).await {
            Ok(None) => vec![(connect_column, Cell::Pass)],
            Ok(Some(_)) => {
                let why = if tls {
                    "sends no selector; over TLS too the proxy answers INVALID_ARGUMENT \"no selector given\""
                } else {
                    "sends no selector (its sync.v1 request carries none); the proxy answers INVALID_ARGUMENT \"no selector given\""
                };
                vec![(connect_column, Cell::NotApplicable(why.into()))]
            }
            Err(why) => {
                eprintln!("{}", client.report(&why, &proxy).await);
                vec![(connect_column, Cell::Fail(why))]
            }
        };
    }

    let initial = match client.ready().await {
        Ok(()) => client.expect_value(INITIAL, true, EVENT_TIMEOUT).await,
        Err(why) => Err(why),
    };
    if let Err(why) = &initial {
        eprintln!("{}", client.report(why, &proxy).await);
        let mut cells = vec![(connect_column, Cell::Fail(why.clone()))];
        if !tls {
            cells.push((Column::Update, Cell::Fail("not connected".into())));
        }
        return cells;
    }
    let mut cells = vec![(connect_column, Cell::Pass)];
    if tls {
        return cells;
    }

    let update = async {
        if kind == Kind::Go {
            // The Go provider pings after 30 s without traffic, with or without a stream (the
            // proxy's own pings count as traffic, so its ping may come only after 60 s). Stay
            // connected and idle past that; the connection must survive it.
            let from = client.log_len();
            tokio::time::sleep(GO_IDLE).await;
            if let Some(line) = client.find_in_log(from, &GO_DISCONNECT_SIGNS) {
                return Err(format!("connection dropped while idle: {line}"));
            }
        }
        setup.change_to(UPDATED);
        client.expect_value(UPDATED, true, EVENT_TIMEOUT).await
    }
    .await;
    if let Err(why) = &update {
        eprintln!("{}", client.report(why, &proxy).await);
    }
    cells.push((Column::Update, Cell::from_result(update)));
    cells
}

/// Restart the proxy under a connected client, changing the manifest while it is down.
pub(crate) async fn reconnect_run(kind: Kind, launch: Launch) -> Cells {
    let setup = Setup::new(false);
    let args = setup.args();
    let mut proxy = Proxy::start(&args).await;
    let mut client = Session::spawn(kind, &launch, proxy.port, None);
    let result = async {
        client.ready().await?;
        client.expect_value(INITIAL, true, EVENT_TIMEOUT).await?;
        let (port, management_port) = (proxy.port, proxy.management_port);
        proxy.terminate().await;
        setup.change_to(UPDATED);
        proxy = Proxy::start_on(port, management_port, &args, &[]).await;
        client.expect_value(UPDATED, false, RECONNECT_TIMEOUT).await
    }
    .await;
    if let Err(why) = &result {
        eprintln!("{}", client.report(why, &proxy).await);
    }
    vec![(Column::Reconnect, Cell::from_result(result))]
}

/// What current flagd speaks besides the columns of the main table, and what clients see of
/// flag configurations with problems.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Feature {
    SourceSelector,
    ContextValue,
    UnknownOperator,
    InvalidFirstVersion,
}

pub(crate) const FEATURES: [Feature; 4] = [
    Feature::SourceSelector,
    Feature::ContextValue,
    Feature::UnknownOperator,
    Feature::InvalidFirstVersion,
];

/// The clients the features are tried with: flagd as the sidecar and two in-process providers.
pub(crate) const FEATURE_KINDS: [Kind; 3] = [Kind::Flagd, Kind::Js, Kind::Python];

impl Feature {
    pub(crate) fn title(self) -> &'static str {
        match self {
            Feature::SourceSelector => "`source=` selector",
            Feature::ContextValue => "context values",
            Feature::UnknownOperator => "one flag with an unknown operator",
            Feature::InvalidFirstVersion => "invalid first version, then fixed",
        }
    }

    pub(crate) fn description(self) -> String {
        match self {
            Feature::SourceSelector => format!(
                "the client is given the selector `{SOURCE_SELECTOR}` (flagd v0.13's grammar: \
                 one `key=value` pair, a bare value meaning `source=`); it must evaluate \
                 `{INITIAL}`, then `{UPDATED}` after the manifest changes."
            ),
            Feature::ContextValue => format!(
                "the proxy runs with `--context-value {CONTEXT_KEY}={CONTEXT_VALUE}`; the flag's \
                 default variant is `{INITIAL}` and its targeting rule answers `{UPDATED}` when \
                 `{CONTEXT_KEY}` is `{CONTEXT_VALUE}`. The client evaluates with an empty \
                 context, so it evaluates `{UPDATED}` only if it merged the proxy's \
                 `sync_context` into its evaluation context."
            ),
            Feature::UnknownOperator => format!(
                "the first version of the resource has `{FLAG_KEY}` and a second string flag, \
                 `{BAD_FLAG_KEY}`, whose targeting rule uses the operator `{UNKNOWN_OPERATOR}`, \
                 which nobody knows. The proxy serves it as it is; the client must evaluate \
                 `{FLAG_KEY}` to `{INITIAL}`, and `{BAD_FLAG_KEY}` to an error: the caller's \
                 default for a provider (a second client evaluates it), an error answer without \
                 a value from flagd."
            ),
            Feature::InvalidFirstVersion => format!(
                "the first version of the resource is invalid (`{FLAG_KEY}` has a default \
                 variant that is not one of its variants, a document flagd refuses whole), so \
                 there is no version to serve: the proxy ends the client's stream with \
                 `FAILED_PRECONDITION` and the reason (`{INVALID_MESSAGE}…`), which the client \
                 must log (the providers run with debug logging: the Python provider logs a \
                 stream's status at debug level only). Then the manifest is fixed, and the \
                 client must come back by itself and evaluate `{INITIAL}`."
            ),
        }
    }

    /// Why a client cannot take part, if it cannot.
    pub(crate) fn not_applicable(self, kind: Kind) -> Option<&'static str> {
        match (self, kind) {
            (Feature::ContextValue, Kind::Flagd) => Some(
                "the in-process providers are the clients that merge `sync_context` into their \
                 evaluations; flagd is not asked",
            ),
            _ => None,
        }
    }
}

/// The flags of the unknown-operator run: `color`, and a flag whose rule uses an operator that
/// nobody knows.
pub(crate) fn flags_with_an_unknown_operator() -> Value {
    let mut flags = color_flags(INITIAL);
    flags[BAD_FLAG_KEY] = json!({
        "state": "ENABLED",
        "variants": {"on": "on", "off": "off"},
        "defaultVariant": "off",
        "targeting": {"if": [{UNKNOWN_OPERATOR: [{"var": "tier"}, "gold"]}, "on", "off"]},
    });
    flags
}

/// The flags of the invalid-first-version run: `color` whose default variant is not one of its
/// variants (flagd refuses such a document whole).
pub(crate) fn invalid_flags() -> Value {
    let mut flags = color_flags(INITIAL);
    flags[FLAG_KEY]["defaultVariant"] = json!("nope");
    flags
}

/// The flags of the context-value run: `color` answers `UPDATED` for the context value.
pub(crate) fn targeted_flags() -> Value {
    let mut flags = color_flags(INITIAL);
    flags[FLAG_KEY]["targeting"] = json!({
        "if": [{"==": [{"var": CONTEXT_KEY}, CONTEXT_VALUE]}, UPDATED, INITIAL]
    });
    flags
}

/// One client with one feature.
pub(crate) async fn feature_run(kind: Kind, launch: Launch, feature: Feature) -> Cell {
    let setup = Setup::new(false);
    let mut args: Vec<String> = setup.args.clone();
    let mut target = Target::default();
    match feature {
        Feature::SourceSelector => target.selector = SOURCE_SELECTOR,
        Feature::ContextValue => {
            support::write_manifest(setup.manifests.path(), NAMESPACE, NAME, targeted_flags());
            args.extend([
                "--context-value".to_owned(),
                format!("{CONTEXT_KEY}={CONTEXT_VALUE}"),
            ]);
        }
        Feature::UnknownOperator => {
            support::write_manifest(
                setup.manifests.path(),
                NAMESPACE,
                NAME,
                flags_with_an_unknown_operator(),
            );
        }
        Feature::InvalidFirstVersion => {
            support::write_manifest(setup.manifests.path(), NAMESPACE, NAME, invalid_flags());
            // The Python provider logs a stream's status at debug level only.
            target.debug = true;
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let proxy = Proxy::start(&args).await;
    let mut client = Session::spawn_to(kind, &launch, proxy.port, None, &target);
    let result = async {
        if feature == Feature::InvalidFirstVersion {
            client.expect_log(INVALID_MESSAGE, EVENT_TIMEOUT).await?;
            setup.change_to(INITIAL);
            client.ready().await?;
            return client.expect_value(INITIAL, false, RECONNECT_TIMEOUT).await;
        }
        client.ready().await?;
        if feature == Feature::ContextValue {
            return client.expect_value(UPDATED, false, EVENT_TIMEOUT).await;
        }
        if feature == Feature::UnknownOperator {
            client.expect_value(INITIAL, true, EVENT_TIMEOUT).await?;
            return expect_evaluation_error(kind, &launch, &client, proxy.port).await;
        }
        client.expect_value(INITIAL, true, EVENT_TIMEOUT).await?;
        setup.change_to(UPDATED);
        client.expect_value(UPDATED, true, EVENT_TIMEOUT).await
    }
    .await;
    if let Err(why) = &result {
        eprintln!(
            "{}",
            client
                .report(&format!("{}: {why}", feature.title()), &proxy)
                .await
        );
    }
    Cell::from_result(result)
}

/// `BAD_FLAG_KEY` evaluates to an error: flagd answers without a value (and not "not found");
/// a provider gives the caller's default, which a second client, evaluating that flag, prints.
async fn expect_evaluation_error(
    kind: Kind,
    launch: &Launch,
    client: &Session,
    proxy_port: u16,
) -> Result<(), String> {
    if client.flagd.is_some() {
        let answer = client
            .flagd_resolve(BAD_FLAG_KEY)
            .await
            .ok_or("flagd did not answer")?;
        let text = answer.to_string();
        return if answer.get("value").is_none() && !text.to_lowercase().contains("not_found") {
            Ok(())
        } else {
            Err(format!("{BAD_FLAG_KEY}: expected an error, got {text}"))
        };
    }
    let target = Target {
        flag_key: BAD_FLAG_KEY,
        ..Target::default()
    };
    let mut second = Session::spawn_to(kind, launch, proxy_port, None, &target);
    second.ready().await?;
    second
        .expect_value(CALLER_DEFAULT, true, EVENT_TIMEOUT)
        .await
        .map_err(|why| format!("{BAD_FLAG_KEY}: {why}"))
}

pub(crate) type FeatureMatrix = BTreeMap<Feature, BTreeMap<Kind, Cell>>;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Run {
    Plain,
    Tls,
    Reconnect,
    Gzip,
}

pub(crate) fn runs_for(kind: Kind) -> &'static [Run] {
    match kind {
        // Without a selector the old flagd gets nothing; reconnecting proves nothing more (its
        // request still shows whether it lists gzip).
        Kind::FlagdLegacy => &[Run::Plain, Run::Tls, Run::Gzip],
        _ => &[Run::Plain, Run::Tls, Run::Reconnect, Run::Gzip],
    }
}

/// `color` (as [`color_flags`]) among generated flags with targeting rules: a flag set of
/// about [`GZIP_DOCUMENT_BYTES`], which the proxy sends gzipped to clients that accept it.
pub(crate) fn large_flags(default_variant: &str) -> Value {
    let mut flags = support::flag_sets::realistic_flags(1, GZIP_DOCUMENT_BYTES);
    flags.extend(
        color_flags(default_variant)
            .as_object()
            .cloned()
            .unwrap_or_default(),
    );
    Value::Object(flags)
}

/// Serve a large flag set: whether the client's request lists gzip (seen by the proxy), and
/// whether it evaluates the first version and an update, sent gzipped if it accepts that.
pub(crate) async fn gzip_run(kind: Kind, launch: Launch) -> Cells {
    let setup = Setup::new(false);
    support::write_manifest(
        setup.manifests.path(),
        NAMESPACE,
        NAME,
        large_flags(INITIAL),
    );
    let proxy = Proxy::start(&setup.args()).await;
    // Parsing the large manifest can take the proxy (a debug build) a second or two on a busy
    // machine; clients start once it is read.
    proxy
        .wait_for_log(&format!("{NAMESPACE}-{NAME}.yaml resources=1"))
        .await;
    let target = Target {
        deadline_ms: Some(GZIP_DEADLINE_MS),
        ..Target::default()
    };
    let mut client = Session::spawn_to(kind, &launch, proxy.port, None, &target);
    let advertises = async {
        let deadline = Instant::now() + EVENT_TIMEOUT;
        loop {
            let yes = proxy.metric(ACCEPTS_GZIP).await;
            let no = proxy.metric(DOES_NOT_ACCEPT_GZIP).await;
            if yes + no > 0.0 {
                return Ok(yes > 0.0);
            }
            if Instant::now() > deadline {
                return Err("the client sent no request".to_owned());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    .await;
    let advertises = match advertises {
        Ok(advertises) => advertises,
        Err(why) => {
            eprintln!("{}", client.report(&why, &proxy).await);
            return vec![
                (Column::AdvertisesGzip, Cell::Fail(why)),
                (Column::DecodesGzip, Cell::Fail("not connected".into())),
            ];
        }
    };
    let observed = Cell::Observed(if advertises { "yes" } else { "no" }.into());
    if kind == Kind::FlagdLegacy {
        return vec![
            (Column::AdvertisesGzip, observed),
            (
                Column::DecodesGzip,
                Cell::NotApplicable("sends no selector".into()),
            ),
        ];
    }
    let decodes = async {
        client.ready().await?;
        client.expect_value(INITIAL, true, EVENT_TIMEOUT).await?;
        support::write_manifest(
            setup.manifests.path(),
            NAMESPACE,
            NAME,
            large_flags(UPDATED),
        );
        client.expect_value(UPDATED, true, EVENT_TIMEOUT).await?;
        let gzip = proxy.metric(SENT_GZIP).await;
        match (advertises, gzip > 0.0) {
            (true, true) | (false, false) => Ok(()),
            (true, false) => Err("advertises gzip but was sent none".to_owned()),
            (false, true) => Err("was sent gzip without advertising it".to_owned()),
        }
    }
    .await;
    if let Err(why) = &decodes {
        eprintln!("{}", client.report(why, &proxy).await);
    }
    let decodes = match decodes {
        Ok(()) if !advertises => Cell::NotApplicable(
            "does not advertise gzip: sent uncompressed (and evaluated both versions)".into(),
        ),
        result => Cell::from_result(result),
    };
    vec![
        (Column::AdvertisesGzip, observed),
        (Column::DecodesGzip, decodes),
    ]
}

/// Fills in the selector columns from the plain run and what the client sends, and the
/// columns of the old flagd that follow from it sending no selector.
pub(crate) fn derive_cells(kind: Kind, row: &mut BTreeMap<Column, Cell>) {
    let plain = row
        .get(&Column::Plain)
        .cloned()
        .unwrap_or(Cell::Fail("no plain run".into()));
    let (header, body) = match kind.selector_mode() {
        SelectorMode::HeaderAndBody => (
            plain,
            Cell::NotApplicable(
                "also sends the `flagd-selector` header, which the proxy reads first".into(),
            ),
        ),
        SelectorMode::BodyOnly => (
            Cell::NotApplicable("sends the selector only in the request body".into()),
            plain,
        ),
        SelectorMode::None => {
            let none = || Cell::NotApplicable("sends no selector".into());
            row.entry(Column::Update).or_insert_with(none);
            row.entry(Column::Reconnect).or_insert_with(none);
            (none(), none())
        }
    };
    row.insert(Column::HeaderSelector, header);
    row.insert(Column::BodySelector, body);
}
