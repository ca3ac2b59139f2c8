//! Compiles `proto/driver.proto` with protox (pure Rust), so building needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/driver.proto");
    let descriptors = protox::compile(["proto/driver.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Shared, not copied, by every task's registration reply.
        .bytes(".kolo.driver.v1.RegisterReply.peer_list")
        .compile_fds(descriptors)?;
    Ok(())
}
