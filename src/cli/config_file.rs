//! `--config FILE`: values for the flags of `start` from a YAML or JSON file, as the Go
//! flagd-proxy's `--config` reads them. This module turns the file into command-line arguments
//! (`--<flag>=<value>`) for the flags that the command line and the environment leave unset;
//! the command-line parser then checks them like any other ([`super::parse_from`]).
//!
//! [`read`] goes in three steps: [`load`] reads and parses the file, [`flag_of`] maps each key
//! to its flag, and [`arguments`] checks the value and spells it as arguments; [`rejected`]
//! names the key behind a value that the parser then refuses.
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::error::{ContextKind, ContextValue};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches};

/// Why a config file gives no values.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("config file {}: cannot read it: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {}: unsupported format `.{extension}`; use YAML (.yaml, .yml) or JSON (.json)", path.display())]
    UnsupportedFormat { path: PathBuf, extension: String },
    #[error("config file {}: not valid {format}: {message}", path.display())]
    Syntax {
        path: PathBuf,
        format: &'static str,
        message: String,
    },
    #[error("config file {}: expected a mapping from flag names to values, found {found}", path.display())]
    NotAMapping { path: PathBuf, found: &'static str },
    #[error("config file {}: key `{key}` is not a flag of `flagd-proxy start`{}", path.display(), suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default())]
    UnknownKey {
        path: PathBuf,
        key: String,
        suggestion: Option<String>,
    },
    #[error("config file {}: key `{key}` cannot be set in a config file", path.display())]
    ReservedKey { path: PathBuf, key: String },
    #[error("config file {}: keys `{first}` and `{second}` both set --{flag}; keep one", path.display())]
    DuplicateKey {
        path: PathBuf,
        first: String,
        second: String,
        flag: String,
    },
    #[error("config file {}: key `{key}`: {problem}", path.display())]
    BadValue {
        path: PathBuf,
        key: String,
        problem: String,
    },
    /// A value from the file refused by the command-line parser (for example a port that is not
    /// a number, or a flag that conflicts with one on the command line).
    #[error("config file {}: {}{}", path.display(), key.as_ref().map(|k| format!("key `{k}`: ")).unwrap_or_default(), clap_message(source))]
    Rejected {
        path: PathBuf,
        key: Option<String>,
        source: clap::Error,
    },
}

/// Keys a config file cannot set: they are not values of the proxy.
const RESERVED_KEYS: [&str; 3] = ["config", "help", "version"];

/// What one key of the config file contributes to the command line.
pub(super) struct Setting {
    key: String,
    /// The flag's long name.
    flag: String,
    pub(super) arguments: Vec<OsString>,
}

/// Reads the config file into the arguments for the flags that the command line and the
/// environment leave unset.
pub(super) fn read(
    path: &Path,
    start: &clap::Command,
    matches: &ArgMatches,
) -> Result<Vec<Setting>, ConfigFileError> {
    let mut settings: Vec<Setting> = Vec::new();
    for (key, value) in load(path)? {
        let key = key_text(key);
        let arg = flag_of(path, &key, start)?;
        let flag = arg.get_long().expect("found by its long name").to_owned();
        if let Some(first) = settings.iter().find(|s| s.flag == flag) {
            return Err(ConfigFileError::DuplicateKey {
                path: path.to_owned(),
                first: first.key.clone(),
                second: key,
                flag,
            });
        }
        let arguments = arguments(arg.get_action(), &flag, value).map_err(|problem| {
            ConfigFileError::BadValue {
                path: path.to_owned(),
                key: key.clone(),
                problem,
            }
        })?;
        let given = matches!(
            matches.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        settings.push(Setting {
            key,
            flag,
            arguments: if given { Vec::new() } else { arguments },
        });
    }
    settings.retain(|setting| !setting.arguments.is_empty());
    Ok(settings)
}

/// The file's mapping from keys to values: YAML, or JSON when the name ends in `.json`.
fn load(path: &Path) -> Result<serde_norway::Mapping, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let extension = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let parsed = match extension.as_str() {
        "json" => {
            serde_json::from_str::<serde_norway::Value>(&text).map_err(|e| ("JSON", e.to_string()))
        }
        "toml" | "hcl" | "tfvars" | "ini" | "properties" | "props" | "prop" | "env" | "dotenv" => {
            return Err(ConfigFileError::UnsupportedFormat {
                path: path.to_owned(),
                extension,
            });
        }
        _ => serde_norway::from_str::<serde_norway::Value>(&text)
            .map_err(|e| ("YAML", e.to_string())),
    };
    let document = parsed.map_err(|(format, message)| ConfigFileError::Syntax {
        path: path.to_owned(),
        format,
        message,
    })?;
    match document {
        serde_norway::Value::Mapping(mapping) => Ok(mapping),
        // An empty file, or one with only comments, sets nothing.
        serde_norway::Value::Null => Ok(serde_norway::Mapping::new()),
        other => Err(ConfigFileError::NotAMapping {
            path: path.to_owned(),
            found: kind_of(&other),
        }),
    }
}

/// A key as written in the file.
fn key_text(key: serde_norway::Value) -> String {
    match key {
        serde_norway::Value::String(key) => key,
        serde_norway::Value::Bool(key) => key.to_string(),
        serde_norway::Value::Number(key) => key.to_string(),
        other => kind_of(&other).to_owned(),
    }
}

/// The flag of `start` that a key names, by its long name or an alias (case-insensitive, as in
/// the Go proxy).
fn flag_of<'a>(
    path: &Path,
    key: &str,
    start: &'a clap::Command,
) -> Result<&'a clap::Arg, ConfigFileError> {
    let name = key.to_lowercase();
    if RESERVED_KEYS.contains(&name.as_str()) {
        return Err(ConfigFileError::ReservedKey {
            path: path.to_owned(),
            key: key.to_owned(),
        });
    }
    start
        .get_arguments()
        .find(|arg| {
            arg.get_long() == Some(name.as_str())
                || arg
                    .get_all_aliases()
                    .is_some_and(|aliases| aliases.contains(&name.as_str()))
        })
        .ok_or_else(|| ConfigFileError::UnknownKey {
            path: path.to_owned(),
            suggestion: closest_flag(&name, start),
            key: key.to_owned(),
        })
}

/// The command-line arguments that give `--flag` the value, or what is wrong with the value.
fn arguments(
    action: &ArgAction,
    flag: &str,
    value: serde_norway::Value,
) -> Result<Vec<OsString>, String> {
    match (action, value) {
        (_, serde_norway::Value::Null) => {
            Err("no value (remove the key to use the default)".into())
        }
        (ArgAction::SetTrue, value) => switch(flag, value),
        (ArgAction::Append, serde_norway::Value::Sequence(items)) => items
            .iter()
            .map(|item| scalar(item).map(|text| format!("--{flag}={text}").into()))
            .collect::<Result<_, _>>()
            .map_err(|found| format!("expected a list of plain values, found {found} in it")),
        // `context-value: {region: eu}`, the natural spelling of `key=value` entries.
        (ArgAction::Append, serde_norway::Value::Mapping(entries))
            if KEY_VALUE_FLAGS.contains(&flag) =>
        {
            entries
                .iter()
                .map(|(name, item)| {
                    let name = scalar(name)?;
                    let item = scalar(item)?;
                    Ok(format!("--{flag}={name}={item}").into())
                })
                .collect::<Result<_, &'static str>>()
                .map_err(|found| {
                    format!("expected a mapping of plain keys to plain values, found {found} in it")
                })
        }
        (_, serde_norway::Value::Sequence(_)) => {
            Err(format!("--{flag} takes a single value, not a list"))
        }
        (_, value) => Ok(vec![
            scalar(&value)
                .map(|text| format!("--{flag}={text}").into())
                .map_err(|found| format!("expected a plain value, found {found}"))?,
        ]),
    }
}

/// The arguments for an on/off flag: the flag when true, nothing when false.
fn switch(flag: &str, value: serde_norway::Value) -> Result<Vec<OsString>, String> {
    match value {
        serde_norway::Value::Bool(true) => Ok(vec![format!("--{flag}").into()]),
        serde_norway::Value::Bool(false) => Ok(Vec::new()),
        serde_norway::Value::String(text) if text.eq_ignore_ascii_case("true") => {
            Ok(vec![format!("--{flag}").into()])
        }
        serde_norway::Value::String(text) if text.eq_ignore_ascii_case("false") => Ok(Vec::new()),
        other => Err(format!("expected true or false, found {}", kind_of(&other))),
    }
}

/// Repeatable flags of `key=value` entries, which the file may also give as a mapping.
const KEY_VALUE_FLAGS: &[&str] = &["context-value"];

/// A scalar as the command line would spell it, or what it is instead.
fn scalar(value: &serde_norway::Value) -> Result<String, &'static str> {
    match value {
        serde_norway::Value::Bool(value) => Ok(value.to_string()),
        serde_norway::Value::Number(value) => Ok(value.to_string()),
        serde_norway::Value::String(value) => Ok(value.clone()),
        other => Err(kind_of(other)),
    }
}

fn kind_of(value: &serde_norway::Value) -> &'static str {
    match value {
        serde_norway::Value::Null => "null",
        serde_norway::Value::Bool(_) => "a boolean",
        serde_norway::Value::Number(_) => "a number",
        serde_norway::Value::String(_) => "a string",
        serde_norway::Value::Sequence(_) => "a list",
        serde_norway::Value::Mapping(_) => "a nested mapping",
        serde_norway::Value::Tagged(_) => "a tagged value",
    }
}

/// The flag of `start` closest to an unknown key, if one is close.
fn closest_flag(key: &str, start: &clap::Command) -> Option<String> {
    start
        .get_arguments()
        .flat_map(|arg| {
            arg.get_long()
                .into_iter()
                .chain(arg.get_all_aliases().unwrap_or_default())
        })
        .filter(|name| !RESERVED_KEYS.contains(name))
        .map(|name| (strsim::levenshtein(key, name), name))
        .filter(|(distance, _)| *distance <= (key.chars().count() / 3).max(2))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name.to_owned())
}

/// The key of the file behind a parser error, when the error names a flag the file set.
fn blamed_key(error: &clap::Error, settings: &[Setting]) -> Option<String> {
    [ContextKind::InvalidArg, ContextKind::PriorArg]
        .into_iter()
        .filter_map(|kind| match error.get(kind) {
            Some(ContextValue::String(arg)) => Some(arg.as_str()),
            _ => None,
        })
        .filter_map(|arg| {
            let flag = arg.strip_prefix("--")?;
            let flag = flag.split([' ', '=', '<', '.']).next()?;
            settings.iter().find(|s| s.flag == flag)
        })
        .map(|setting| setting.key.clone())
        .next()
}

/// A parser error in one line, without the usage and the pointer to --help.
fn clap_message(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let first = rendered.split("\n\n").next().unwrap_or_default();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    first
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The error for a value from the file that the command-line parser refused.
pub(super) fn rejected(
    path: PathBuf,
    source: clap::Error,
    settings: &[Setting],
) -> ConfigFileError {
    ConfigFileError::Rejected {
        key: blamed_key(&source, settings),
        path,
        source,
    }
}
