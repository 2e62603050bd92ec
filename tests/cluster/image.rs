//! The image: reproducible, and the Dockerfile assembles what `scripts/build-image.sh` does.

use super::*;

#[test]
fn build_image_is_reproducible() {
    const REPRO_REFERENCE: &str = "localhost/flagd-proxy:repro";
    let dir = tempfile::tempdir().expect("tempdir");
    let first = build_proxy_image(&dir.path().join("a.tar"), REPRO_REFERENCE);
    let second = build_proxy_image(&dir.path().join("b.tar"), REPRO_REFERENCE);
    assert!(first.starts_with("sha256:"), "digest: {first}");
    assert_eq!(first, second);
    let a = std::fs::read(dir.path().join("a.tar")).expect("a.tar");
    let b = std::fs::read(dir.path().join("b.tar")).expect("b.tar");
    assert!(a == b, "the two archives differ");
}

/// The Dockerfile and scripts/build-image.sh make one image layout: both assemble the root
/// filesystem with scripts/image-rootfs.sh, and the runtime stage adds nothing to it but the
/// same user, entrypoint and command as the archive's config.
#[test]
fn dockerfile_assembles_the_same_root_filesystem_as_build_image() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
    let script = std::fs::read_to_string(root.join("scripts/build-image.sh")).expect("script");
    let instructions: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(
        instructions.contains(&"RUN scripts/image-rootfs.sh /out/flagd-proxy /rootfs"),
        "the build stage must assemble /rootfs with scripts/image-rootfs.sh"
    );
    let runtime: Vec<&str> = instructions
        .iter()
        .skip_while(|l| **l != "FROM scratch")
        .copied()
        .collect();
    assert!(
        !runtime.is_empty(),
        "the runtime stage must be FROM scratch"
    );
    let adds: Vec<&&str> = runtime
        .iter()
        .filter(|l| l.starts_with("COPY") || l.starts_with("ADD") || l.starts_with("RUN"))
        .collect();
    assert_eq!(adds, [&"COPY --from=builder /rootfs/ /"]);
    assert!(runtime.contains(&"USER 65532:65532"));
    assert!(runtime.contains(&"ENTRYPOINT [\"/flagd-proxy\"]"));
    assert!(runtime.contains(&"CMD [\"start\"]"));
    assert!(script.contains("scripts/image-rootfs.sh \"$binary\" \"$rootfs\""));
    assert!(script.contains("'[\"/flagd-proxy\"]' '[\"start\"]' 65532:65532"));
}
