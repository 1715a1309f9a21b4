//! Compiles the gRPC protos (etcd v3 API subset + oncekv's own services) with
//! tonic-prost-build: client stubs always, server stubs with the `server` feature. `protoc` comes from `protoc-bin-vendored`, so no system protoc is
//! needed; `PROTOC` overrides it (e.g. on a platform the vendored crate does not cover).
//!
//! With the `json` feature, pbjson-build generates serde impls in the proto3 JSON mapping
//! for the etcd packages, with proto field names as etcd's grpc-gateway writes them, and
//! appends them to each package's prost file (so `tonic::include_proto!` brings them in).

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

/// The etcd packages the JSON gateway serves (not oncekv's own services).
const JSON_PACKAGES: &[&str] = &[
    "mvccpb",
    "authpb",
    "etcdserverpb",
    "v3lockpb",
    "v3electionpb",
];

fn json(out_dir: &std::path::Path, descriptors: &std::path::Path) -> std::io::Result<()> {
    let prefixes: Vec<String> = JSON_PACKAGES.iter().map(|p| format!(".{p}")).collect();
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(descriptors)?)?
        .out_dir(out_dir)
        // etcd's gateway marshals with OrigName: `range_end`, not `rangeEnd` (both are read).
        .preserve_proto_field_names()
        // As grpc-gateway's jsonpb takes a body, a field it does not know is passed over.
        .ignore_unknown_fields()
        .build(&prefixes)?;
    for package in JSON_PACKAGES {
        let serde = out_dir.join(format!("{package}.serde.rs"));
        let impls = std::fs::read_to_string(&serde)?;
        let mut prost = std::fs::OpenOptions::new()
            .append(true)
            .open(out_dir.join(format!("{package}.rs")))?;
        std::io::Write::write_all(&mut prost, impls.as_bytes())?;
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-env-changed=PROTOC");

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc());

    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let descriptors = out_dir.join("descriptors.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptors)
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
        .compile_with_config(config, PROTOS, &["proto"])?;
    if std::env::var_os("CARGO_FEATURE_JSON").is_some() {
        json(&out_dir, &descriptors)?;
    }
    Ok(())
}
