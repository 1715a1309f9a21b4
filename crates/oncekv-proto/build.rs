//! Compiles the gRPC protos (etcd v3 API subset + oncekv's own services) with
//! tonic-prost-build: client stubs always, server stubs with the `server` feature. `protoc` comes from `protoc-bin-vendored`, so no system protoc is
//! needed; `PROTOC` overrides it (e.g. on a platform the vendored crate does not cover).

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "proto/mvccpb/kv.proto",
    "proto/authpb/auth.proto",
    "proto/etcdserverpb/rpc.proto",
    "proto/v3lockpb/v3lock.proto",
    "proto/v3electionpb/v3election.proto",
    "proto/oncekv/oncekv.proto",
];

fn protoc() -> PathBuf {
    if let Some(path) = std::env::var_os("PROTOC") {
        return PathBuf::from(path);
    }
    match protoc_bin_vendored::protoc_bin_path() {
        Ok(path) => path,
        Err(err) => {
            println!("cargo:warning=no vendored protoc ({err}); falling back to `protoc` on PATH");
            PathBuf::from("protoc")
        }
    }
}

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-env-changed=PROTOC");

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc());

    tonic_prost_build::configure()
        .build_server(std::env::var_os("CARGO_FEATURE_SERVER").is_some())
        .build_client(true)
        // Unserved RPCs (MemberAdd, Alarm, Snapshot, ...) answer Unimplemented by default;
        // with default stubs, streaming methods return `BoxStream<T>`.
        .generate_default_stubs(true)
        // prost's codec, but a request that does not decode is InvalidArgument.
        .codec_path("crate::codec::Codec")
        // Keys, values and raft payloads as `bytes::Bytes`: decoding slices the request
        // buffer instead of copying.
        .bytes(".")
        // Compile-time paths into the proto tree are watched above; do not emit a line per
        // file as well.
        .emit_rerun_if_changed(false)
        .compile_with_config(config, PROTOS, &["proto"])
}
