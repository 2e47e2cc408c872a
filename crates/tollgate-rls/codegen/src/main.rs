//! Compiles `crates/tollgate-rls/proto/**/*.proto` with protox and writes the tonic/prost code, one file per
//! package, into `crates/tollgate-rls/src/proto/`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let proto_dir = root.join("proto");
    let out_dir = root.join("src/proto");
    // The service; protox follows its imports (the descriptor, the unit, the header value, Google's wrappers).
    let files = ["envoy/service/ratelimit/v3/rls.proto"];
    let fds = protox::compile(files, [&proto_dir])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(true)
        .emit_rerun_if_changed(false)
        .out_dir(&out_dir)
        .compile_fds(fds)?;
    for entry in std::fs::read_dir(&out_dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "rs") && path.file_name().is_some_and(|n| n != "mod.rs") {
            println!("wrote {}", path.canonicalize()?.display());
        }
    }
    Ok(())
}
