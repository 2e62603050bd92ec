//! The flags of `start`, in one group per component (each under its own heading in `--help`
//! and `docs/cli.md`), and their conversion into that component's settings ([`Settings`]).
//!
//! Defaults are not written here: every default is a constant beside the settings type of its
//! component, which that type's `Default` uses too (a test checks that parsing an empty command
//! line gives each component's `Default`).
//!
//! Each group lives in its own file below `start/`, with its conversion; this file gathers them
//! into [`StartArgs`], in the order of the headings of `--help`.
use std::time::Duration;

use clap::Args;

use crate::settings::{ServeSettings, Settings};

mod authz;
mod connections;
mod hub;
mod memory;
mod otlp;
mod serve;
mod source;
mod state;
mod sync;
mod tls;

pub use authz::AuthzArgs;
pub use connections::{ManagementArgs, ServerArgs};
pub use hub::HubArgs;
pub use memory::MemoryArgs;
pub use otlp::OtlpArgs;
pub use serve::{LogArgs, ServeArgs};
pub use source::SourceArgs;
pub use state::StateArgs;
pub use sync::SyncArgs;
pub use tls::TlsArgs;

/// The value parser of the `KEY=VALUE` flags: `parse` splits and checks an entry, and its
/// refusal is the whole message. (With a plain function as the parser, clap's message would
/// quote the value as given, with any control characters in it, before `parse`'s own, which
/// names what is wrong with the key escaped.)
#[derive(Clone, Copy)]
struct KeyValue(fn(&str) -> Result<(String, String), String>);

impl clap::builder::TypedValueParser for KeyValue {
    type Value = (String, String);

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        use clap::error::{ContextKind, ContextValue, ErrorKind};
        let flag = arg.map(ToString::to_string).unwrap_or_default();
        let refused = |message: &str| {
            let text = format!("invalid value for '{flag}': {message}\n");
            let mut error = clap::Error::raw(ErrorKind::ValueValidation, text).with_cmd(cmd);
            // Names the flag for a config file's message (its key), as clap's own errors do.
            error.insert(ContextKind::InvalidArg, ContextValue::String(flag.clone()));
            error
        };
        let text = value.to_str().ok_or_else(|| refused("not valid UTF-8"))?;
        (self.0)(text).map_err(|message| refused(&message))
    }
}

/// A default duration as the command line spells it (`30s`).
fn duration_text(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[derive(Debug, Args)]
pub struct StartArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub authz: AuthzArgs,
    #[command(flatten)]
    pub hub: HubArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub sync: SyncArgs,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub management: ManagementArgs,
    #[command(flatten)]
    pub otlp: OtlpArgs,
}

impl From<StartArgs> for Settings {
    fn from(args: StartArgs) -> Self {
        let server = args.server.into_options(args.source.upstream.is_some());
        let serve = ServeSettings::from(args.serve);
        let otlp = args.otlp.into_settings(serve.pod_name.clone());
        Settings {
            serve,
            source: args.source.into(),
            tls: args.tls.into_settings(),
            authz: args.authz.into(),
            hub: args.hub.into(),
            memory: args.memory.into(),
            state: args.state.into_settings(),
            management: args.management.into_settings(&server),
            server,
            compression: args.sync.compression_settings(),
            context_values: args.sync.context_values,
            otlp,
        }
    }
}
