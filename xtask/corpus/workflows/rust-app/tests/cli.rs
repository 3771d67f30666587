// The integration test runs the binary as the developer would.
#[test]
fn the_binary_reports_the_project() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cred-report"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("AWS profiles"));
}
