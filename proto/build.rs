//! Compiles `flower/v1/flower.proto` with protox (pure Rust: no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "flower/v1/flower.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    // The descriptor set serves gRPC reflection.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("flower_descriptor.bin"), prost::Message::encode_to_vec(&fds))?;
    // Undecodable requests are INVALID_ARGUMENT, not prost's INTERNAL.
    tonic_prost_build::configure().codec_path("crate::codec::StrictCodec").compile_fds(fds)?;
    Ok(())
}
