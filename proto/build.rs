//! Compiles `flower/v1/flower.proto` with protox (pure Rust: no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "flower/v1/flower.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
