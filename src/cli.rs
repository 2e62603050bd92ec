//! The command line: the `flagd-proxy` command, its subcommands, and [`parse_from`], which
//! applies the `--config` file. The flags of `start` live in `start.rs` and `start/` (one group
//! per component, each turned into that component's settings); the Markdown reference in
//! `docs.rs`. Every flag has an environment variable; `docs/cli.md` is generated from these
//! definitions (`flagd-proxy generate-cli-docs`) and checked by a test.
//!
//! `--config FILE` supplies values for the flags of `start` from a YAML or JSON file, as the Go
//! flagd-proxy's `--config` does: a flag given on the command line or through its environment
//! variable takes precedence over the file, and the file over the default. The file's values
//! go through the same parser as the command line ([`parse_from`]).
use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

mod config_file;
mod docs;
mod start;

pub use config_file::ConfigFileError;
pub use docs::markdown;
pub use start::{
    AuthzArgs, HubArgs, LogArgs, ManagementArgs, OtlpArgs, ServeArgs, ServerArgs, SourceArgs,
    StartArgs, StateArgs, SyncArgs, TlsArgs,
};

#[derive(Debug, Parser)]
#[command(
    name = "flagd-proxy",
    version,
    about = "Serves Kubernetes FeatureFlag resources to flagd sidecars and in-process providers over the flagd gRPC sync protocol",
    long_about = "Serves Kubernetes FeatureFlag resources to flagd sidecars and in-process providers over the flagd gRPC sync protocol.\n\n\
                  Clients ask for a resource with the selector core.openfeature.dev/<namespace>/<name>; the proxy watches it on demand \
                  (one watch per resource, shared by all clients) and streams every change."
)]
pub struct Cli {
    /// Read values for the flags of `start` from this YAML or JSON file (JSON when the name ends
    /// in .json): a mapping from long flag names to values, such as `port: 8015`,
    /// `log-format: json` or `manifests: [a, b]`. A flag given on the command line or through its
    /// environment variable takes precedence over the file. Only this file is read; no default
    /// location is searched.
    #[arg(long, global = true, value_name = "FILE", env = "FLAGD_PROXY_CONFIG")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the proxy.
    Start(Box<StartArgs>),
    /// Print a running proxy's state, read from its management port: watched resources (state,
    /// version and its age, subscribers, last error), watches, connections and the limits that
    /// refused requests.
    Status(StatusArgs),
    /// Print the command-line reference as Markdown (the source of docs/cli.md).
    #[command(hide = true)]
    GenerateCliDocs,
}

/// The flags of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The management port to read, as HOST:PORT (with `kubectl port-forward`, the local end).
    #[arg(
        short = 'a',
        long,
        value_name = "HOST:PORT",
        env = "FLAGD_PROXY_STATUS_ADDRESS",
        default_value = "127.0.0.1:8016"
    )]
    pub address: String,
    /// How to print the state: `table` for people, `json` for scripts.
    #[arg(
        short = 'o',
        long,
        value_enum,
        env = "FLAGD_PROXY_STATUS_OUTPUT",
        default_value = "table"
    )]
    pub output: StatusOutput,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StatusOutput {
    Table,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Console,
    Json,
}

/// Why the command line (with its config file) gives no [`Cli`].
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Refused by the command-line parser, or a request for help or the version (see
    /// [`clap::Error::use_stderr`]).
    #[error(transparent)]
    Clap(#[from] clap::Error),
    #[error(transparent)]
    ConfigFile(#[from] ConfigFileError),
}

/// Parses the command line, applying the file given with `--config` (or `FLAGD_PROXY_CONFIG`)
/// to the flags of `start` that are set neither on the command line nor through their
/// environment variables.
///
/// Each value in the file becomes `--<flag>=<value>` after the given arguments (one per element
/// of a list for repeatable flags), so the command-line parser validates it as usual.
pub fn parse_from<I, T>(args: I) -> Result<Cli, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let command = Cli::command();
    let (matches, incomplete) = match command.clone().try_get_matches_from(&args) {
        Ok(matches) => (matches, None),
        // A flag on the command line may require another that the file gives (--server-cert-path
        // needs --server-key-path): find the file from what was given, then decide.
        Err(error) if error.kind() == ErrorKind::MissingRequiredArgument => {
            match command
                .clone()
                .ignore_errors(true)
                .try_get_matches_from(&args)
            {
                Ok(matches) if config_for_start(&matches).is_some() => (matches, Some(error)),
                _ => return Err(error.into()),
            }
        }
        Err(error) => return Err(error.into()),
    };
    let Some((start, path)) = config_for_start(&matches) else {
        return Ok(Cli::from_arg_matches(&matches)?);
    };
    let start_command = command
        .find_subcommand("start")
        .expect("the start subcommand exists");
    let settings = config_file::read(&path, start_command, start)?;
    if settings.is_empty() {
        return match incomplete {
            Some(error) => Err(error.into()),
            None => Ok(Cli::from_arg_matches(&matches)?),
        };
    }

    // Before a `--` terminator, if any, so that the values are still read as flags.
    let at = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut full = args[..at].to_vec();
    full.extend(settings.iter().flat_map(|s| s.arguments.iter().cloned()));
    full.extend_from_slice(&args[at..]);
    match command.try_get_matches_from(full) {
        Ok(matches) => Ok(Cli::from_arg_matches(&matches)?),
        // Still missing what the command line lacked: not the file's doing.
        Err(error)
            if incomplete.is_some() && error.kind() == ErrorKind::MissingRequiredArgument =>
        {
            Err(error.into())
        }
        Err(source) => Err(config_file::rejected(path, source, &settings).into()),
    }
}

/// The matches of `start` and the config file, when `start` runs with one.
fn config_for_start(matches: &ArgMatches) -> Option<(&ArgMatches, PathBuf)> {
    let start = matches.subcommand_matches("start")?;
    let path = start
        .get_one::<PathBuf>("config")
        .or_else(|| matches.get_one::<PathBuf>("config"))?;
    Some((start, path.clone()))
}

#[cfg(test)]
mod tests;
