// A build script as many crates have one: it passes a value computed at build time.
fn main() {
    let mut buffer = itoa::Buffer::new();
    println!("cargo:rustc-env=CRED_REPORT_BUILD={}", buffer.format(2026));
    println!("cargo:rerun-if-changed=build.rs");
}
