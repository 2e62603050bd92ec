//! Compiles the sync protocol definitions with a pure-Rust protobuf compiler (no `protoc` needed).
//!
//! Two views are generated from the same files:
//! - `server`: the server side, where both `SyncFlagsResponse` types are replaced by
//!   `crate::wire::frame::Frame`, a message encoded once per version and shared by every stream;
//! - `client`: ordinary messages and clients, used by tests, benchmarks and the upstream source.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["flagd/sync/v1/sync.proto", "sync/v1/sync_service.proto"];
    for file in files {
        println!("cargo:rerun-if-changed=proto/{file}");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);

    let descriptors = protox::compile(files, ["proto"])?;

    let server_out = out.join("server");
    std::fs::create_dir_all(&server_out)?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .extern_path(
            ".flagd.sync.v1.SyncFlagsResponse",
            "crate::wire::frame::Frame",
        )
        .extern_path(".sync.v1.SyncFlagsResponse", "crate::wire::frame::Frame")
        .out_dir(&server_out)
        .compile_fds(descriptors.clone())?;

    let client_out = out.join("client");
    std::fs::create_dir_all(&client_out)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .out_dir(&client_out)
        .compile_fds(descriptors)?;
    Ok(())
}
