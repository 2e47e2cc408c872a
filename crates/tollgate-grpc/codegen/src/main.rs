//! Compiles `crates/tollgate-grpc/proto/*.proto` with protox and writes the tonic/prost code next to them.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let files = ["helloworld.proto", "countdown.proto"];
    let fds = protox::compile(files, [&proto_dir])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(true)
        .emit_rerun_if_changed(false)
        .out_dir(&proto_dir)
        .compile_fds(fds)?;
    for file in files {
        let rs = proto_dir.join(file.replace(".proto", ".rs"));
        println!("wrote {}", rs.canonicalize()?.display());
    }
    Ok(())
}
