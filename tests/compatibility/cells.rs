//! The matrix: its columns and the outcomes of its cells.

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Column {
    Plain,
    Tls,
    HeaderSelector,
    BodySelector,
    Update,
    Reconnect,
    AdvertisesGzip,
    DecodesGzip,
}

pub(crate) const COLUMNS: [Column; 8] = [
    Column::Plain,
    Column::Tls,
    Column::HeaderSelector,
    Column::BodySelector,
    Column::Update,
    Column::Reconnect,
    Column::AdvertisesGzip,
    Column::DecodesGzip,
];

impl Column {
    pub(crate) fn title(self) -> &'static str {
        match self {
            Column::Plain => "plain",
            Column::Tls => "TLS",
            Column::HeaderSelector => "header selector",
            Column::BodySelector => "body selector",
            Column::Update => "update",
            Column::Reconnect => "reconnect",
            Column::AdvertisesGzip => "advertises gzip",
            Column::DecodesGzip => "decodes compressed versions",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cell {
    Pass,
    /// What was seen, neither good nor bad (`yes`, `no`).
    Observed(String),
    Fail(String),
    NotApplicable(String),
    NotInstallable(String),
    NotInstalled(String),
}

impl Cell {
    pub(crate) fn markdown(&self) -> String {
        let text = match self {
            Cell::Pass => "pass".to_owned(),
            Cell::Observed(what) => what.clone(),
            Cell::Fail(why) => format!("fail: {why}"),
            Cell::NotApplicable(why) => format!("n/a: {why}"),
            Cell::NotInstallable(why) => format!("not installable: {why}"),
            Cell::NotInstalled(why) => format!("not installed: {why}"),
        };
        text.replace('|', "\\|").replace('\n', " ")
    }

    pub(crate) fn from_result(result: Result<(), String>) -> Cell {
        match result {
            Ok(()) => Cell::Pass,
            Err(why) => Cell::Fail(why),
        }
    }
}
