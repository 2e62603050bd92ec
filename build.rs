//! Compiles the sync protocol definitions with a pure-Rust protobuf compiler (no `protoc` needed)
//! into messages and clients. The server side is not generated: `src/wire/routes.rs` serves the
//! methods, writing each `SyncFlagsResponse` from bytes encoded once per version.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["flagd/sync/v1/sync.proto", "sync/v1/sync_service.proto"];
    for file in files {
        println!("cargo:rerun-if-changed=proto/{file}");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .out_dir(&out)
        .compile_fds(descriptors)?;
    Ok(())
}
